# resize-agent. `make demo` runs the main job, `make test` runs every test.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
export GOFLAGS ?= -buildvcs=false

BIN := bin
CMDS := resize-agent resizectl
VM_PAYLOAD := $(BIN)/vm-payload

.PHONY: all build test test-unit test-vm test-k8s demo vet clean generate check-generate fuzz

all: build

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 go build -trimpath -o $(BIN)/ ./cmd/...

# The eBPF object and its Go bindings are generated (bpf2go, Debian's
# clang-14/llvm-14) and committed; check-generate fails if they are stale.
generate:
	go generate ./bpf/...

check-generate: generate
	git diff --exit-code -- bpf/ || { echo "bpf/: generated files differ from the committed ones; run make generate and commit"; exit 1; }

vet:
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi

# Unit tests run anywhere; tests that need a real cgroup v2 hierarchy skip
# here with their reason and run in the VM below.
test-unit: vet
	go test -race -count=1 ./...

# The real-kernel tests, in a QEMU VM with cgroup v2 (and containerd).
test-vm:
	test/run-vm-tests.sh

# The Kubernetes intake and status path against a real kube-apiserver and
# etcd (built from the Go module proxy, cached), and the manifests.
test-k8s:
	test/k8s/run.sh

# Fuzzing, each target for FUZZTIME: go test -fuzz takes one package and
# one target per run. The seed corpora are in each package's testdata/fuzz.
FUZZTIME ?= 20s
FUZZ_TARGETS := ./cgroup:FuzzCleanPath ./cgroup:FuzzParseProcCgroup ./agent/intent:FuzzValidate ./agent/api:FuzzDecode

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "== $${t#*:} ($${t%%:*}) for $(FUZZTIME)"; \
		go test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) $${t%%:*}; \
	done

test: FUZZTIME = 10s
test: test-unit fuzz test-vm test-k8s

# The main job: the agent resizing a running container, one Infeasible
# resize, and the metrics. On a host without usable cgroup v2 controllers it
# runs inside the VM harness.
demo:
	test/demo/demo.sh

# Benchmarks: Go microbenchmarks on the host, then the agent against runc,
# containerd and CRI (ratios to a bare cgroup write) in the VM; rewrites
# README.md's bench block. BENCH_N=100 for a quick run.
.PHONY: bench
bench:
	test/bench/bench.sh

clean:
	rm -rf $(BIN)
