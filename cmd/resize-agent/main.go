// Command resize-agent is the node-level cgroup v2 resize agent daemon.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/resizer/resize-agent/cgroup"
)

func main() {
	o, err := Load(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "resize-agent:", err)
		os.Exit(2)
	}
	o.dropCaps = true
	log := newLogger(o)
	disableHugePages(log)
	if err := setMemoryLimit(log); err != nil {
		fmt.Fprintln(os.Stderr, "resize-agent:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("resize-agent stopped", "err", err)
		fmt.Fprintln(os.Stderr, "resize-agent:", err)
		if errors.Is(err, cgroup.ErrNotCgroup2) || errors.Is(err, cgroup.ErrMissingController) {
			fmt.Fprintln(os.Stderr, "hint: on such a host, 'make demo' runs the agent in a VM with a cgroup v2 kernel")
		}
		os.Exit(1)
	}
}

func newLogger(o *Options) *slog.Logger {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(strings.ToUpper(o.LogLevel))); err != nil {
		lvl = slog.LevelInfo
	}
	ho := &slog.HandlerOptions{Level: lvl}
	if o.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, ho))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, ho))
}
