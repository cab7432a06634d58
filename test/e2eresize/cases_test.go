package e2eresize

import corev1 "k8s.io/api/core/v1"

// The cases are our own extraction from kubernetes/kubernetes
// test/e2e/common/node/pod_resize.go as stored at commit 06e67ba2130d
// (a tree whose conformance entries say "Release: v1.35"; the release-1.37
// branch was not at hand): its resource constants, the before/after
// resources, resize policies and expected restarts of the guaranteed and
// burstable tables, the multi-container and "extended" cases, and the
// refusals of doPodResizePatchErrorTests that apply to a node agent
// (renaming, reordering and ephemeral storage are API-only).
const (
	originalCPU, originalCPULimit   = "20m", "30m"
	reducedCPU, reducedCPULimit     = "15m", "25m"
	increasedCPU, increasedCPULimit = "25m", "35m"
	originalMem, originalMemLimit   = "35Mi", "45Mi"
	reducedMem, reducedMemLimit     = "30Mi", "40Mi"
	increasedMem, increasedMemLimit = "40Mi", "50Mi"
)

// rr is one container's requests and limits, "" for unset.
type rr struct{ cpuReq, cpuLim, memReq, memLim string }

// ctr is one container of a case.
type ctr struct {
	name           string
	from, to       rr
	cpuPol, memPol corev1.ResourceResizeRestartPolicy // "" is NotRequired
}

type resizeCase struct {
	name   string
	ctrs   []ctr
	refuse string // the refusal expected, "" for none
	// noRollback: the e2e does not roll this resize back
	// (doPatchAndRollback's doRollback false: it adds requests and
	// limits, which the API refuses to remove).
	noRollback bool
	// needsSpec: the refusal needs the container's declared spec. No
	// runtime reports a memory request (CRI has no field for it; the
	// kubelet writes none to cgroup v2 without MemoryQoS), so before a
	// declaration the agent cannot know there is one to remove.
	needsSpec bool
}

// offset is the e2e's offsetCPU / offsetMemory: container i gets 2i more.
func offsetCPU(i int, v string) string {
	if v == "" {
		return ""
	}
	return addMilli(v, 2*i)
}

func offsetMem(i int, v string) string {
	if v == "" {
		return ""
	}
	return addMi(v, 2*i)
}

func guaranteed(cpu, mem string) rr { return rr{cpu, cpu, mem, mem} }

func cases() []resizeCase {
	var out []resizeCase
	pols := []struct {
		name     string
		cpu, mem corev1.ResourceResizeRestartPolicy
	}{
		{"no restart", corev1.NotRequired, corev1.NotRequired},
		{"mem restart", corev1.NotRequired, corev1.RestartContainer},
		{"cpu restart", corev1.RestartContainer, corev1.NotRequired},
		{"cpu & mem restart", corev1.RestartContainer, corev1.RestartContainer},
	}
	for _, p := range pols {
		for _, e := range []struct {
			name     string
			cpu, mem string
		}{
			{"cpu", increasedCPU, originalMem},
			{"mem", originalCPU, increasedMem},
			{"cpu & mem in the same direction", increasedCPU, increasedMem},
			{"cpu & mem in opposite directions", increasedCPU, reducedMem},
		} {
			out = append(out, resizeCase{name: "guaranteed/" + p.name + "/" + e.name, ctrs: []ctr{{
				name: "c1", from: guaranteed(originalCPU, originalMem), to: guaranteed(e.cpu, e.mem), cpuPol: p.cpu, memPol: p.mem,
			}}})
		}
	}
	multi := func(name string, to [3]rr) resizeCase {
		c := resizeCase{name: "guaranteed/3 containers/" + name}
		for i := range 3 {
			from := guaranteed(offsetCPU(i, originalCPU), offsetMem(i, originalMem))
			c.ctrs = append(c.ctrs, ctr{name: []string{"c1", "c2", "c3"}[i], from: from, to: to[i]})
		}
		return c
	}
	g := func(i int, cpu, mem string) rr { return guaranteed(offsetCPU(i, cpu), offsetMem(i, mem)) }
	out = append(out,
		multi("net increase", [3]rr{g(0, increasedCPU, increasedMem), g(1, increasedCPU, increasedMem), g(2, reducedCPU, reducedMem)}),
		multi("net decrease", [3]rr{g(0, increasedCPU, increasedMem), g(1, reducedCPU, reducedMem), g(2, reducedCPU, reducedMem)}),
		multi("mixed", [3]rr{g(0, increasedCPU, originalMem), g(1, reducedCPU, increasedMem), g(2, increasedCPU, increasedMem)}),
	)
	orig := rr{originalCPU, originalCPULimit, originalMem, originalMemLimit}
	for _, p := range pols {
		for _, e := range []struct {
			name string
			to   rr
		}{
			{"cpu requests", rr{increasedCPU, originalCPULimit, originalMem, originalMemLimit}},
			{"cpu limits", rr{originalCPU, increasedCPULimit, originalMem, originalMemLimit}},
			{"mem requests", rr{originalCPU, originalCPULimit, increasedMem, originalMemLimit}},
			{"mem limits", rr{originalCPU, originalCPULimit, originalMem, increasedMemLimit}},
			{"all resources in the same direction", rr{increasedCPU, increasedCPULimit, increasedMem, increasedMemLimit}},
			{"cpu & mem in opposite directions", rr{increasedCPU, increasedCPULimit, reducedMem, reducedMemLimit}},
			{"requests & limits in opposite directions", rr{reducedCPU, increasedCPULimit, increasedMem, reducedMemLimit}},
		} {
			out = append(out, resizeCase{name: "burstable/" + p.name + "/" + e.name, ctrs: []ctr{{
				name: "c1", from: orig, to: e.to, cpuPol: p.cpu, memPol: p.mem,
			}}})
		}
	}
	out = append(out,
		resizeCase{name: "burstable/extended/5 containers", noRollback: true, ctrs: []ctr{
			{name: "c1", from: rr{cpuReq: originalCPU}, to: rr{cpuReq: increasedCPU, cpuLim: increasedCPULimit}},
			{name: "c2", from: rr{memReq: originalMem}, to: rr{memReq: reducedMem, memLim: increasedMemLimit}},
			{name: "c3", from: rr{cpuReq: originalCPU, memReq: originalMem}, to: rr{cpuReq: originalCPU, memReq: reducedMem}},
			{name: "c4", from: rr{cpuReq: originalCPU}, to: rr{cpuReq: reducedCPU, memReq: originalMem}},
			{name: "c5", from: rr{memReq: originalMem}, to: rr{cpuReq: originalCPU, memReq: increasedMem}},
		}},
		resizeCase{name: "burstable/extended/equivalents", ctrs: []ctr{{name: "c1", from: rr{cpuReq: "2m", cpuLim: "10m"}, to: rr{cpuReq: "1m", cpuLim: "5m"}}}},
		// The refusals.
		resizeCase{name: "refused/BestEffort request memory", refuse: "QoS class", ctrs: []ctr{{name: "c1", to: rr{memReq: originalMem}}}},
		resizeCase{name: "refused/BestEffort request cpu", refuse: "QoS class", ctrs: []ctr{{name: "c1", to: rr{cpuReq: originalCPU}}}},
		resizeCase{name: "refused/Guaranteed remove cpu & memory limits", refuse: "resource limits cannot be removed", ctrs: []ctr{{name: "c1",
			from: guaranteed(originalCPU, originalMem), to: rr{cpuReq: originalCPU, memReq: originalMem}}}},
		resizeCase{name: "refused/Burstable remove limits + increase requests", refuse: "resource limits cannot be removed", ctrs: []ctr{{name: "c1",
			from: rr{originalCPU, increasedCPULimit, originalMem, increasedMemLimit}, to: rr{cpuReq: increasedCPU, memReq: increasedMem}}}},
		resizeCase{name: "refused/Burstable remove memory requests", refuse: "resource requests cannot be removed", needsSpec: true, ctrs: []ctr{{name: "c1",
			from: rr{memReq: originalMem}, to: rr{}}}},
		resizeCase{name: "refused/Burstable remove cpu requests", refuse: "resource requests cannot be removed", ctrs: []ctr{{name: "c1",
			from: rr{cpuReq: originalCPU}, to: rr{}}}},
		resizeCase{name: "refused/Burstable set requests == limits", refuse: "QoS class", ctrs: []ctr{{name: "c1",
			from: rr{originalCPU, increasedCPULimit, originalMem, increasedMemLimit}, to: rr{increasedCPULimit, increasedCPULimit, increasedMemLimit, increasedMemLimit}}}},
	)
	return out
}
