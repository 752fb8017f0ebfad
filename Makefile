# The two commands a new user needs are `make demo` and `make test`; CI runs `make test` through .ci/run.
GO ?= go
# Privileged tests (network namespaces, links, iptables) fail rather than skip when root or a tool is missing.
export NODELOCALDNS_REQUIRE_PRIVILEGED = 1

.PHONY: demo test test-deps check build image fuzz

# A node cache on 127.0.0.1:5300 in front of a stand-in cluster DNS on 127.0.0.1:5301; no root needed.
demo:
	$(GO) run ./cmd/node-cache -conf examples/demo/Corefile

# Installs golangci-lint and the system tools the tests need (as root, from Debian packages), checks (gofmt,
# go vet, go mod tidy, golangci-lint, a darwin cross-build), then runs every test. The timeout is per package:
# test/faults, the longest, builds dozens of simulated nodes with a real kube-proxy and takes 10 to 20 minutes
# on two busy cores.
test: test-deps check
	$(GO) test -count=1 -timeout 45m ./...

test-deps:
	GO=$(GO) ./scripts/install-test-deps.sh

# golangci-lint as scripts/install-test-deps.sh installs it (pinned version, under GOPATH); override to use another.
GOLANGCI_LINT ?= $(shell GO=$(GO) ./scripts/install-test-deps.sh --lint-path)

check:
	@unformatted=$$(gofmt -l .); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) mod tidy -diff
	@if [ ! -x "$(GOLANGCI_LINT)" ]; then \
		echo "make check: golangci-lint is not installed at $(GOLANGCI_LINT);" \
			"run ./scripts/install-test-deps.sh (no root needed for it) or set GOLANGCI_LINT=/path/to/golangci-lint" >&2; \
		exit 1; \
	fi
	$(GOLANGCI_LINT) run --allow-serial-runners ./...
	@# What is Linux's says so in build constraints: a CoreDNS built elsewhere with our plugins must compile
	@# (notrack then refuses the Corefile), so every package and test builds for darwin too.
	GOOS=darwin GOARCH=arm64 $(GO) build ./...
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...

build:
	$(GO) build -o bin/node-cache ./cmd/node-cache

# The image the chart and the manifests run (ghcr.io/nodelocaldns/node-cache:APPVERSION), with no container
# engine: bin/image (an OCI layout) and bin/node-cache-image.tar (the same as an oci-archive), reproducibly
# (build/image.sh says how). Debian packages come through apt-get; a second build reuses them and Go's cache.
image:
	GO=$(GO) ./build/image.sh

# Each fuzz target for FUZZTIME; `make test` runs their committed seed corpora as ordinary tests.
FUZZTIME ?= 20s
fuzz:
	for f in FuzzKubeDNSConfigMap FuzzCorefileParse FuzzProbeResponse; do \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./test/faults/ || exit 1; \
	done
