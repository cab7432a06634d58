package bpf

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// ErrNotSupported is matched (errors.Is) by errors of Probe and Load that
// are caused by a kernel lacking what the programs need: BTF, a program,
// map or attach type, a hook. Those errors also still match cilium/ebpf's
// own ebpf.ErrNotSupported where that was the cause.
var ErrNotSupported = errors.New("bpf: not supported by this kernel")

func notSupported(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrNotSupported, what, err)
}

// classify wraps err so that it matches ErrNotSupported when cilium/ebpf
// says the kernel lacks a feature or an attach target, or the verifier
// refuses something that newer kernels allow.
func classify(what string, err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, btf.ErrNotFound) || verifierTooOld(err) {
		return notSupported(what, err)
	}
	return fmt.Errorf("bpf: %s: %w", what, err)
}

// verifierTooOld recognises the verifier of kernels before 6.1, which
// allows tracing programs only preallocated hash maps.
func verifierTooOld(err error) bool {
	var ve *ebpf.VerifierError
	if !errors.As(err, &ve) {
		return false
	}
	for _, line := range ve.Log {
		if strings.Contains(line, "can only use preallocated hash map") {
			return true
		}
	}
	return false
}

// Probe checks quickly whether Load can work here: kernel BTF, the
// kernel's per-task run-queue accounting, the map types, and that trivial programs of the attach types Load uses load and
// attach: tp_btf on sched_switch and the OOM hook Load would pick
// (tp_btf/mark_victim, or fentry on older kernels). It needs the
// same privileges as Load. Missing kernel features give an error matching
// ErrNotSupported; a lack of privileges gives a permission error.
func Probe() error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("bpf: raising RLIMIT_MEMLOCK: %w", err)
	}
	kernel, err := btf.LoadKernelSpec()
	if err != nil {
		return notSupported("kernel BTF", err)
	}
	if err := haveSchedInfo(kernel); err != nil {
		return err
	}
	for _, mt := range []ebpf.MapType{ebpf.Hash, ebpf.PerCPUHash, ebpf.Array, ebpf.PerCPUArray, ebpf.Queue, ebpf.TaskStorage, ebpf.RingBuf} {
		if err := features.HaveMapType(mt); err != nil {
			return classify("map type "+mt.String(), err)
		}
	}
	oom, err := chooseOOMHook(kernel, "")
	if err != nil {
		return err
	}
	if err := probeAttach(kernel, ebpf.AttachTraceRawTp, "sched_switch"); err != nil {
		return err
	}
	return probeAttach(kernel, oom.attach, oom.target)
}

// haveSchedInfo checks that the kernel accounts each task's run-queue wait
// (task_struct.sched_info, CONFIG_SCHED_INFO: on with CONFIG_SCHEDSTATS or
// CONFIG_TASK_DELAY_ACCT, as in Debian's and most distributions' kernels),
// which the sched_switch program reads instead of a clock.
func haveSchedInfo(kernel *btf.Spec) error {
	var task *btf.Struct
	if err := kernel.TypeByName("task_struct", &task); err != nil {
		return notSupported("task_struct in kernel BTF", err)
	}
	for _, m := range task.Members {
		if m.Name != "sched_info" {
			continue
		}
		si, ok := btf.UnderlyingType(m.Type).(*btf.Struct)
		if !ok {
			break
		}
		found := 0
		for _, f := range si.Members {
			if f.Name == "run_delay" || f.Name == "pcount" {
				found++
			}
		}
		if found == 2 {
			return nil
		}
		break
	}
	return notSupported("run-queue accounting", errors.New("task_struct has no sched_info.run_delay and .pcount (kernel built without CONFIG_SCHED_INFO)"))
}

func probeAttach(kernel *btf.Spec, at ebpf.AttachType, to string) error {
	what := fmt.Sprintf("%s program on %s", at, to)
	prog, err := ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Name:       "resize_probe",
		Type:       ebpf.Tracing,
		AttachType: at,
		AttachTo:   to,
		License:    "Dual MIT/GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
	}, ebpf.ProgramOptions{KernelTypes: kernel})
	if err != nil {
		return classify("loading "+what, err)
	}
	defer prog.Close()
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	if err != nil {
		return classify("attaching "+what, err)
	}
	return l.Close()
}
