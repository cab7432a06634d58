# resize-agent. `make demo` runs the main job, `make test` runs every test.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
export GOFLAGS ?= -buildvcs=false

BIN := bin
CMDS := resize-agent resizectl
VM_PAYLOAD := $(BIN)/vm-payload

.PHONY: all build test test-unit test-vm test-k8s test-kubelet-fit test-monitoring test-node image demo vet clean generate check-generate fuzz

all: build

# bin/resize-agent, bin/resizectl and bin/kubectl-resize (the kubectl
# plugin: docs/kubectl-resize.md), every command under cmd/.
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
# here with their reason and run in the VM below. test/k8s is left to
# test-k8s, which builds its API server and runs it once (here it would run
# a second time whenever the cache is warm, 75 s under -race).
test-unit: vet
	go test -race -count=1 $$(go list ./... | grep -v '/test/k8s$$')

# The real-kernel tests, in a QEMU VM with cgroup v2 (and containerd).
test-vm:
	test/run-vm-tests.sh

# The Kubernetes intake and status path against a real kube-apiserver and
# etcd (built from the Go module proxy, cached), and the manifests.
test-k8s:
	test/k8s/run.sh

# agent/kube/fit against kubelet 1.37.2's own resize admission.
test-kubelet-fit:
	test/kubeletfit/run.sh

# The agent's image without Docker: static resize-agent and resizectl for
# linux/amd64 and linux/arm64, one OCI index in an OCI layout tarball that
# `ctr images import` and `kind load image-archive` accept (deploy/image).
IMAGE ?= docker.io/library/resize-agent:dev
IMAGE_ARCHIVE ?= $(BIN)/resize-agent-image.tar
IMAGE_ARCHS := amd64 arm64

image:
	@set -e; for a in $(IMAGE_ARCHS); do \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$a go build -trimpath -ldflags "-s -w" -o $(BIN)/image/linux_$$a/ ./cmd/resize-agent ./cmd/resizectl; \
	done
	go run ./deploy/image -name $(IMAGE) -o $(IMAGE_ARCHIVE) $(foreach a,$(IMAGE_ARCHS),-platform linux/$(a)=$(BIN)/image/linux_$(a))
	@echo "wrote $(IMAGE_ARCHIVE) ($(IMAGE) for $(IMAGE_ARCHS))"

# A real Kubernetes node in the VM (kubelet, containerd, systemd) registered
# with a control plane on the host; the agent deployed from deploy/ and the
# e2e tests in test/node run against it (test/node/run.sh). Fails if the
# node cannot be brought up.
# The node's image holds only the host's arch (the VM is this machine's);
# `make image` alone writes both.
test-node: IMAGE_ARCHS := $(shell go env GOARCH)
test-node: image
	test/node/run.sh

# docs/walkthrough.md part 2 run for real on that node (test/node
# TestWalkthrough): its marked blocks as they stand, each one's output
# checked. One VM: flock /tmp/vm.lock make walkthrough.
.PHONY: walkthrough dashboard-images
walkthrough: IMAGE_ARCHS := $(shell go env GOARCH)
walkthrough: image
	test/node/run.sh -test.run '^TestWalkthrough$$'

# The walkthrough again with Prometheus (built from the module proxy,
# test/tools.sh) scraping the agent throughout; the dashboard's key panels
# are evaluated over the run into docs/img/dashboard/*.tsv and drawn with
# gnuplot into docs/img/dashboard-*.png (docs/img/dashboard.sh). Commit both.
dashboard-images: IMAGE_ARCHS := $(shell go env GOARCH)
dashboard-images: image
	RESIZE_AGENT_PROMETHEUS=$$(test/tools.sh prometheus) NODE_PROMETHEUS=$(CURDIR)/docs/img/dashboard \
		test/node/run.sh -test.run '^TestWalkthrough$$'
	docs/img/dashboard.sh

# Fuzzing: go test -fuzz takes one package and one target per run. Each
# target runs for a number of executions, not a duration: with a duration,
# Go 1.26's coordinator can report its own deadline as a failure
# ("context deadline exceeded", golang/go#75804), which a loaded CI machine
# hits. The counts take 5-15 s each on a quiet 2-core machine. FUZZTIME
# (a duration or Nx) overrides them for a longer local run. Minimising a new
# input is capped at 1 s: the default 60 s, spent on the 4-70 KB seeds,
# stalled the run. Seed corpora are in each package's testdata/fuzz.
FUZZ_TARGETS := ./cgroup:FuzzCleanPath:80000 ./cgroup:FuzzParseProcCgroup:100000 \
	./agent/intent:FuzzValidate:20000 ./agent/apiserver:FuzzDecode:20000
FUZZTIME ?=

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; n=$${rest#*:}; \
		budget=$(if $(FUZZTIME),$(FUZZTIME),$${n}x); \
		echo "== $$name ($$pkg) for $$budget"; \
		go test -run '^$$' -fuzz "^$$name$$" -fuzztime "$$budget" -fuzzminimizetime 1s "$$pkg"; \
	done

# The alerting and recording rules: promtool (built from the module proxy,
# cached) checks them and runs their unit tests (every alert firing and not
# firing). test-unit checks that the dashboard and rules name only metrics
# the agent exports.
test-monitoring:
	@promtool=$$(test/tools.sh promtool) && $$promtool check rules deploy/monitoring/rules.yaml && \
		cd deploy/monitoring && $$promtool test rules rules_test.yaml

# Every test (test/all.sh): the host tests, the VM suite with the
# Kubernetes builds beside it, the API server tests, the real node last
# (TEST_NODE=0 leaves it out).
test:
	test/all.sh

# The main job: the agent resizing a running container, one Infeasible
# resize, and the metrics. On a host without usable cgroup v2 controllers it
# runs inside the VM harness.
demo:
	test/demo/demo.sh

# Benchmarks: Go microbenchmarks on the host, then the agent against runc,
# containerd and CRI (ratios to a bare cgroup write) in the VM; rewrites
# docs/benchmarks.md's bench block. BENCH_N=100 for a quick run.
.PHONY: bench
bench:
	test/bench/bench.sh

# The pictures under docs/img, rendered from their Graphviz sources
# (docs/img/render.sh; commit the .dot and the .png together), and the
# dashboard's panels redrawn from the committed data of the last
# make dashboard-images (docs/img/dashboard.sh).
.PHONY: docs-images
docs-images:
	docs/img/render.sh
	docs/img/dashboard.sh

clean:
	rm -rf $(BIN)
