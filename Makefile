# omnicache — a bare `make` prints the targets.
GO      ?= go
# The library module (the root) and the CLI's (cmd/, its own module: the
# library's go.mod carries none of the CLI's dependencies). go.work joins
# them, so every command runs from the root; ./... alone is the root's.
PKGS    ?= ./... ./cmd/...
FUZZTIME ?= 30s
FUZZPKGS ?= ./fuzz/ ./mirror/
BENCH   ?= .
COUNT   ?= 6

.PHONY: help test test-go test-python python python-cuda python-deps python-wheel bench-python redis race vet check bench benchcmp fuzz generate check-generate tidy gpu-test gpu-replay gpu-bundle profile replay replay-full fit

help: ## print the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

test: test-go test-python ## run the Go and the Python tests (the README's test command; what CI runs)

test-go: ## run the Go tests with -race; without redis-server the Redis tests are skipped and listed
	@if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then \
		echo "make test: redis-server not installed: the Redis tier tests will be skipped."; \
		echo "make test: install it with 'sudo apt-get install redis-server' (or 'make redis') to run them."; fi
	@skips=$$(mktemp); \
	OMNICACHE_REDIS_SKIPS=$$skips $(GO) test -race -count=1 $(PKGS); rc=$$?; \
	if [ -s $$skips ]; then \
		echo "make test: $$(wc -l < $$skips) tests SKIPPED, redis-server not installed (sudo apt-get install redis-server, or make redis):"; \
		sort $$skips | sed 's/^/  /'; fi; \
	rm -f $$skips; exit $$rc

# The C ABI (internal/capi/) as a shared library inside the Python package. Only
# omnicache_* symbols are exported (internal/capi/omnicache.map).
PYTHON  ?= /usr/bin/python3
PYLIB   := python/omnicache/_lib
CAPI_SRC := $(wildcard internal/capi/*.go internal/capi/*.c internal/capi/*.h internal/capi/*.map) $(filter-out %_test.go,$(wildcard *.go */*.go */*/*.go))

# The package's extension omnicache._fast (python/omnicache/_fast.c): the
# per-step calls without ctypes/cffi. Built against $(PYTHON)'s headers
# (Debian's python3-dev); it does not link libomnicache.so.
PYINC   = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PYEXT   = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
PYFAST  = python/omnicache/_fast$(PYEXT)

python: $(PYLIB)/libomnicache.so $(PYLIB)/omnicache.h $(PYFAST) ## build libomnicache.so, its header and the _fast extension into the Python package

$(PYFAST): python/omnicache/_fast.c
	@test -f "$(PYINC)/Python.h" || { echo "make python: $(PYINC)/Python.h missing: install python3-dev (make python-deps)" >&2; exit 1; }
	$(CC) -O2 -Wall -Werror -fPIC -shared -I$(PYINC) -o $@ $<

$(PYLIB)/libomnicache.so: $(CAPI_SRC) go.mod
	@mkdir -p $(PYLIB)
	$(GO) build -buildmode=c-shared -trimpath -ldflags="-s -extldflags=-Wl,--version-script=$(CURDIR)/internal/capi/omnicache.map" -o $@ ./internal/capi
	@rm -f $(PYLIB)/libomnicache.h # cgo's generated header; the public one is internal/capi/omnicache.h
	@if nm -D --defined-only $@ | awk '{print $$3}' | grep -v '^omnicache_' ; then echo "symbols other than omnicache_* exported" >&2; rm -f $@; exit 1; fi

python-cuda: ## build the library with the CUDA device into .gpu/libomnicache-cuda.so (same CGO flags as gpu-test; load it with OMNICACHE_LIB)
	$(GO) vet -tags cuda ./gpu/ ./internal/capi/
	$(GO) build -tags cuda -buildmode=c-shared -trimpath -ldflags="-s -extldflags=-Wl,--version-script=$(CURDIR)/internal/capi/omnicache.map" -o .gpu/libomnicache-cuda.so ./internal/capi
	@rm -f .gpu/libomnicache-cuda.h
	cp internal/capi/omnicache.h .gpu/omnicache.h
	@if nm -D --defined-only .gpu/libomnicache-cuda.so | awk '{print $$3}' | grep -v '^omnicache_' ; then echo "symbols other than omnicache_* exported" >&2; exit 1; fi

$(PYLIB)/omnicache.h: internal/capi/omnicache.h
	@mkdir -p $(PYLIB)
	cp $< $@

python-deps: ## install Debian's python3 packages the Python tests need when missing (.ci/python.sh)
	@bash .ci/python.sh

test-python: python-deps python ## run the Python package's tests (pytest, Debian's /usr/bin/python3)
	cd python && $(PYTHON) -m pytest -q tests

bench-python: python ## per-step cost from Python vs the same step from Go, and numpy's slot mapping
	$(GO) test -c -o .bench-capi.test ./internal/capi/
	cd python && $(PYTHON) -m omnicache._bench --go-bin ../.bench-capi.test

python-wheel: python ## build the wheel (python/dist/) with Debian's setuptools and check it in a throwaway venv, no network
	rm -rf python/dist python/build
	cd python && $(PYTHON) -m pip wheel --no-build-isolation --no-deps --no-index -w dist .
	@v=$$(mktemp -d); trap 'rm -rf $$v' EXIT; \
	$(PYTHON) -m venv --system-site-packages $$v && $$v/bin/pip install -q --no-index python/dist/omnicache-*.whl && \
	cd / && $$v/bin/python -c "import numpy as np, omnicache as oc; c = oc.Cache([oc.Key('h', 8)], num_blocks=8, block_size=4); \
	c.begin(ids=[1], rows=[0], start=[0], count=[2], table=[[0, 1]], arrivals=[1]); \
	r = c.materialize(c.save([np.arange(16, dtype=np.uint8).reshape(2, 8)])); assert r.rows(0, 'h').ravel().tolist() == list(range(16)); \
	c.close(); b = oc._calls.hot().backend; assert b == 'fast', b; print('wheel checked in a throwaway venv (deleted now):', oc.__file__, oc.version(), 'calls through', b)"

redis: ## install redis-server with apt-get when missing (.ci/redis.sh; the tier tests start real servers)
	@bash .ci/redis.sh

vet: ## go vet and gofmt
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l . | tee /dev/stderr)"

check: vet test check-generate ## everything CI checks

bench: ## run the benchmarks (BENCH=regexp COUNT=n), e.g. for benchstat
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchmem -count=$(COUNT) $(PKGS)

benchcmp: ## compare the slot-mapping kernels side by side with benchstat (one column per impl)
	$(GO) test -run='^$$' -bench='BenchmarkMap' -benchmem -count=$(COUNT) ./slots/ > .bench-slots.txt
	$(GO) run golang.org/x/perf/cmd/benchstat@latest -col /impl .bench-slots.txt

fuzz: ## run every fuzz target of FUZZPKGS for FUZZTIME each
	@for p in $(FUZZPKGS); do \
		if [ ! -d "$$p" ]; then echo "== $$p: no such package, skipped"; continue; fi; \
		list=$$($(GO) test -list '^Fuzz' "$$p") || { echo "$$list"; exit 1; }; \
		for t in $$(echo "$$list" | grep '^Fuzz'); do \
			echo "== $$p $$t"; $(GO) test -run='^$$' -fuzz="^$$t$$" -fuzztime=$(FUZZTIME) "$$p" || exit 1; done; \
	done

# The generators are modules of their own, outside the workspace (GOWORK=off).
generate: ## regenerate the avo assembly
	cd slots/_asm && GOWORK=off $(GO) run . -out ../slots_amd64.s -stubs ../slots_stubs_amd64.go -pkg slots
	cd internal/spin/_asm && GOWORK=off $(GO) run . -out ../pause_amd64.s -stubs ../pause_stubs_amd64.go -pkg spin

GENERATED := slots/slots_amd64.s slots/slots_stubs_amd64.go internal/spin/pause_amd64.s internal/spin/pause_stubs_amd64.go

check-generate: ## regenerate and fail on any drift
	@tmp=$$(mktemp -d); for f in $(GENERATED); do mkdir -p $$tmp/$$(dirname $$f); cp $$f $$tmp/$$f; done; \
	$(MAKE) --no-print-directory generate >/dev/null; \
	rc=0; for f in $(GENERATED); do diff -u $$tmp/$$f $$f || rc=1; done; \
	rm -rf $$tmp; [ $$rc -eq 0 ] || { echo "generated assembly drifted: run make generate"; exit 1; }

# cmd/go.mod requires the library at the version a release of the CLI is
# built with (a placeholder between releases: go.work's replace resolves it
# to the tree); tidy points it at the tree for the run and back.
tidy: ## go mod tidy both modules (the library's, then the CLI's against the tree)
	GOWORK=off $(GO) mod tidy
	cd cmd && $(GO) mod edit -replace github.com/omnicache/omnicache=../ && \
		{ GOWORK=off $(GO) mod tidy; rc=$$?; $(GO) mod edit -dropreplace github.com/omnicache/omnicache; exit $$rc; }

gpu-test: ## build the CUDA tests+benchmarks into .gpu/ (CGO_CFLAGS=-I<dir of cuda.h> CGO_LDFLAGS=-L<dir of libcuda.so>; docs/operations.md)
	$(GO) vet -tags cuda ./gpu/ ./cmd/omnicache/
	$(GO) test -tags cuda -c -o .gpu/gpu.test ./gpu/
	$(GO) test -tags cuda -c -o .gpu/replay.test ./internal/replay/
	$(GO) test -c -o .gpu/mirror.test ./mirror/
	$(GO) test -c -o .gpu/omnicache.test .

gpu-replay: ## build the replay with the CUDA device into .gpu/omnicache (same CGO flags as gpu-test; docs/operations.md)
	$(GO) vet -tags cuda ./cmd/omnicache/
	$(GO) build -tags cuda -o .gpu/omnicache ./cmd/omnicache

# The device bundle: everything a GPU machine without Go needs, stripped to
# stay under the device tool's 64 MiB carry limit; .gpu/run.sh runs it
# (.ci/gpu-run.sh; docs/operations.md). Same CGO flags as gpu-test.
GPU_STRIP := -ldflags=-s\ -w -trimpath
GPU_BUNDLE_MAX_MIB ?= 60

gpu-bundle: ## build the CUDA tests, replay, library and Python package into .gpu/ with .gpu/run.sh (docs/operations.md)
	$(GO) vet -tags cuda ./gpu/ ./internal/replay/ ./cmd/omnicache/ ./internal/capi/
	@mkdir -p .gpu
	$(GO) test -tags cuda -c $(GPU_STRIP) -o .gpu/gpu.test ./gpu/
	$(GO) test -tags cuda -c $(GPU_STRIP) -o .gpu/replay.test ./internal/replay/
	$(GO) build -tags cuda $(GPU_STRIP) -o .gpu/omnicache ./cmd/omnicache
	$(GO) build -tags cuda -buildmode=c-shared -trimpath -ldflags="-s -w -extldflags=-Wl,--version-script=$(CURDIR)/internal/capi/omnicache.map" -o .gpu/libomnicache-cuda.so ./internal/capi
	@rm -f .gpu/libomnicache-cuda.h
	cp internal/capi/omnicache.h .gpu/omnicache.h
	cp bench/testdata/mooncake/synthetic_trace.jsonl .gpu/
	rm -rf .gpu/python && mkdir -p .gpu/python/omnicache
	cp python/omnicache/*.py python/omnicache/_fast.c .gpu/python/omnicache/
	cp -r python/tests python/tests_cuda python/examples .gpu/python/
	find .gpu/python -name __pycache__ -prune -exec rm -rf {} +
	cp .ci/gpu-run.sh .gpu/run.sh && chmod +x .gpu/run.sh
	@n=$$(du -sm .gpu | cut -f1); echo "gpu-bundle: .gpu is $$n MiB (carry limit 64)"; \
	if [ $$n -gt $(GPU_BUNDLE_MAX_MIB) ]; then echo "gpu-bundle: over $(GPU_BUNDLE_MAX_MIB) MiB: remove .gpu/extra or old files" >&2; exit 1; fi

profile: ## CPU-profile the default replay into cpu.pprof
	$(GO) run ./cmd/omnicache replay --cpuprofile cpu.pprof

replay: ## the main job on embedded defaults
	$(GO) run ./cmd/omnicache replay

replay-full: ## the whole reference table at full size, JSON Lines to full.jsonl
	$(GO) run ./cmd/omnicache replay --full --json full.jsonl

fit: ## print the replay's step-cost model fitted to the reference (the workload table's cost lines)
	$(GO) run ./cmd/omnicache fit
