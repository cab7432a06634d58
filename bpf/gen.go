package bpf

// The BPF object is compiled from pressure.bpf.c by bpf2go (pinned in go.mod
// as a tool) with Debian 12's clang-14 and llvm-strip-14, little-endian
// only. The generated pressure_bpfel.go and pressure_bpfel.o are committed;
// `go generate ./bpf/...` rebuilds them byte for byte.
//
//go:generate go tool bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel pressure pressure.bpf.c -- -Wall -Werror
