# The two commands a new user needs are `make demo` and `make test`; CI runs `make test` through .ci/run.
GO ?= go
# Privileged tests (network namespaces, links, iptables) fail rather than skip when root or a tool is missing.
export NODELOCALDNS_REQUIRE_PRIVILEGED = 1

.PHONY: demo test test-deps check build fuzz

# A node cache on 127.0.0.1:5300 in front of a stand-in cluster DNS on 127.0.0.1:5301; no root needed.
demo:
	$(GO) run ./examples/node-cache -conf examples/demo/Corefile

# Installs the system tools the tests need (as root, from Debian packages), checks, then runs every test.
test: test-deps check
	$(GO) test -count=1 -timeout 30m ./...

test-deps:
	GO=$(GO) ./scripts/install-test-deps.sh

check:
	@unformatted=$$(gofmt -l .); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...

build:
	$(GO) build -o bin/node-cache ./examples/node-cache

# Each fuzz target for FUZZTIME; `make test` runs their committed seed corpora as ordinary tests.
FUZZTIME ?= 20s
fuzz:
	for f in FuzzKubeDNSConfigMap FuzzCorefileParse FuzzProbeResponse; do \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./test/faults/ || exit 1; \
	done
