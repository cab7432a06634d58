package intent_test

import (
	"errors"
	"testing"

	"github.com/resizer/resize-agent/agent/intent"
)

func TestScope(t *testing.T) {
	def := intent.Scope{Roots: intent.DefaultTargetRoots}
	whole := intent.Scope{Roots: []string{"/"}, Allowed: []string{"/system.slice/containerd.service"}}
	for _, tc := range []struct {
		scope intent.Scope
		path  string
		ok    bool
	}{
		{def, "/kubepods/burstable/pod1/web", true},
		{def, "/kubepods.slice/kubepods-burstable.slice/x.scope", true},
		{def, "/kubepods", false}, // the root itself
		{def, "/kubepods.slice", false},
		{def, "/kubepodsX/a", false}, // a prefix is not a parent
		{def, "/system.slice/kubelet.service", false},
		{def, "/system.slice/containerd.service", false},
		{def, "/init.scope", false},
		{def, "/user.slice/user-0.slice", false},
		{def, "/kubepods/x/evil.service", false}, // a host service, even below the root
		{whole, "/pod/web", true},
		{whole, "/system.slice/kubelet.service", false},
		{whole, "/system.slice/containerd.service", true}, // allowed by name
		{whole, "/system.slice/containerd.service/sub", true},
		{whole, "/init.scope", false},
		{whole, "/machine.slice/vm.scope", true},
	} {
		err := tc.scope.Check("target", tc.path)
		if tc.ok != (err == nil) {
			t.Errorf("%v: %s: %v", tc.scope, tc.path, err)
		}
		if err != nil && (!errors.Is(err, intent.ErrOutsideTargetRoot) || !errors.Is(err, intent.ErrInvalid)) {
			t.Errorf("%s: %v does not match the sentinels", tc.path, err)
		}
	}
}
