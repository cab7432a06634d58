package podcgroup

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// MirrorAnnotation marks a mirror pod: the API server's copy of a static
// pod (a manifest in the kubelet's staticPodPath). Its value is the UID
// the kubelet gave the static pod, a hash of the manifest
// (pkg/kubelet/config/common.go), which the API server's copy does not
// carry as its own UID (pkg/kubelet/pod/mirror_client.go).
const MirrorAnnotation = "kubernetes.io/config.mirror"

// UID is the UID the kubelet knows the pod by: in its pod cgroup's name
// (pod<uid>, kubepods-<qos>-pod<uid>.slice) and in the runtime's
// io.kubernetes.pod.uid label. That is the pod's own UID, except for a
// mirror pod, whose cgroups and containers carry the static pod's.
func UID(p *corev1.Pod) types.UID {
	if h := p.Annotations[MirrorAnnotation]; h != "" {
		return types.UID(h)
	}
	return p.UID
}

// Mirror reports whether p is a mirror pod. The API server refuses to
// resize one ("static pods cannot be resized", ValidatePodResize in
// pkg/apis/core/validation/validation.go): its resources change with its
// manifest, on the node.
func Mirror(p *corev1.Pod) bool {
	_, ok := p.Annotations[MirrorAnnotation]
	return ok
}
