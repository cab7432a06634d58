package main

import (
	"log/slog"

	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup"
)

// pressureSources returns the pressure sources: eBPF first where it loads
// (see pressure_bpf.go), and the cgroup files always.
func pressureSources(o *Options, cg *cgroup.Manager, log *slog.Logger) ([]pressure.Source, func(), error) {
	files := pressure.Files{CG: cg}
	src, closeFn, err := bpfSource(o, cg, log)
	if err != nil || src == nil {
		return []pressure.Source{files}, func() {}, err
	}
	return []pressure.Source{src, files}, closeFn, nil
}
