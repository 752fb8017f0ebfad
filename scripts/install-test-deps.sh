#!/usr/bin/env bash
# Installs what `make test` needs: golangci-lint (built with `go install`, no root needed), which `make check`
# runs, and the system tools the tests use, from Debian packages, when any is missing (as root). The
# privileged tests fail (they do not skip) under `make test` when a tool is absent, so this runs first.
#
#   scripts/install-test-deps.sh              install what is missing
#   scripts/install-test-deps.sh --lint-path  print where golangci-lint is (or goes), install nothing
set -euo pipefail

# golangci-lint, pinned; one directory per version under GOPATH, shared by every clone on the machine.
golangci_lint_version=v2.15.0
go=${GO:-go}
gopath=$("$go" env GOPATH)
golangci_lint="${gopath%%:*}/tools/golangci-lint-$golangci_lint_version/golangci-lint"
if [ "${1:-}" = "--lint-path" ]; then
	echo "$golangci_lint"
	exit 0
fi
if ! [ -x "$golangci_lint" ]; then
	echo "install-test-deps: building golangci-lint $golangci_lint_version into $(dirname "$golangci_lint")" \
		"(go install; a few minutes the first time)" >&2
	GOBIN=$(dirname "$golangci_lint") GOFLAGS= "$go" install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$golangci_lint_version"
fi

# tool -> Debian package
declare -A package_of=(
	[iptables]=iptables
	[ip6tables]=iptables
	[iptables-legacy]=iptables
	[iptables-nft]=iptables
	[iptables-restore]=iptables
	[conntrack]=conntrack
	[ip]=iproute2
	[dig]=dnsutils
	[getent]=libc-bin
	[nft]=nftables
)

missing=()
for tool in "${!package_of[@]}"; do
	if ! command -v "$tool" >/dev/null 2>&1 && ! [ -x "/usr/sbin/$tool" ] && ! [ -x "/sbin/$tool" ]; then
		missing+=("${package_of[$tool]}")
	fi
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" -ne 0 ]; then
	echo "install-test-deps: missing Debian packages: $packages; run as root or install them yourself" >&2
	exit 1
fi
echo "install-test-deps: installing $packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # one word per package
apt-get install -y -qq --no-install-recommends $packages >/dev/null
