#!/usr/bin/env bash
# Installs the system tools the tests use, from Debian packages, when any is missing.
# The privileged tests fail (they do not skip) under `make test` when a tool is absent, so this runs first.
set -euo pipefail

# etcd and kube-apiserver for the Kubernetes API tests, built from the Go module proxy once and cached.
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
