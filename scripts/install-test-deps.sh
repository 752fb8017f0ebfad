#!/usr/bin/env bash
# Installs what `make test` needs: golangci-lint (which `make check` runs), helm, etcd, kube-apiserver and
# kube-proxy, all built pinned from the Go module proxy (no root needed), and the system tools the tests use,
# from Debian packages, when any is missing (as root). The privileged tests fail (they do not skip) under
# `make test` when a tool is absent, so this runs first.
#
#   scripts/install-test-deps.sh              install what is missing
#   scripts/install-test-deps.sh --lint-path  print where golangci-lint is (or goes), install nothing
set -euo pipefail

GO=${GO:-go}
if ! command -v "$GO" >/dev/null 2>&1; then
	echo "install-test-deps: $GO is not on PATH (under sudo, run: sudo env PATH=\"\$PATH\" make test)" >&2
	exit 1
fi

# golangci-lint, pinned; one directory per version under GOPATH, shared by every clone on the machine.
golangci_lint_version=v2.15.0
gopath=$("$GO" env GOPATH)
golangci_lint="${gopath%%:*}/tools/golangci-lint-$golangci_lint_version/golangci-lint"
if [ "${1:-}" = "--lint-path" ]; then
	echo "$golangci_lint"
	exit 0
fi
if ! [ -x "$golangci_lint" ]; then
	echo "install-test-deps: building golangci-lint $golangci_lint_version into $(dirname "$golangci_lint")" \
		"(go install; a few minutes the first time)" >&2
	GOBIN=$(dirname "$golangci_lint") GOFLAGS= "$GO" install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$golangci_lint_version"
fi

# helm, pinned, for the chart's tests (examples/kubernetes): `go install`ed into the repository's bin/tools,
# where the tests look for it. Rebuilt only when the binary there is not this version.
HELM_VERSION=v3.22.0
repo=$(cd "$(dirname "$0")/.." && pwd)
helm_bin="$repo/bin/tools/helm"
if ! "$GO" version -m "$helm_bin" 2>/dev/null | grep -qP "^\tmod\thelm\.sh/helm/v3\t${HELM_VERSION}\t"; then
	echo "install-test-deps: building helm $HELM_VERSION into $helm_bin with go install (the first build downloads its modules, a few minutes)"
	GOBIN="$repo/bin/tools" "$GO" install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
	echo "install-test-deps: $("$helm_bin" version --short) installed"
fi

# etcd and kube-apiserver for the Kubernetes API tests, and kube-proxy for the simulated node's rules, built
# from the Go module proxy once and cached.
"$(dirname "$0")/build-kube-apiserver.sh"

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
	# The image's tests (test/image): build/image.sh unpacks Debian packages, umoci unpacks the image and
	# runc runs it (crun 1.8, Debian 12's, refuses machines with cgroups in hybrid mode).
	[dpkg-deb]=dpkg
	[umoci]=umoci
	[runc]=runc
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
