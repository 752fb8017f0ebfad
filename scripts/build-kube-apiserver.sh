#!/usr/bin/env bash
# Builds the etcd, kube-apiserver and kube-proxy binaries the Kubernetes API tests (internal/kubeapi) and the
# real kube-proxy on the simulated node (internal/kubeproxy, test/simnode) run, from the Go module proxy at the
# versions pinned in internal/kubeapi/tools/*/go.mod, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelocaldns/kubeapi/{kube-apiserver-vX.Y.Z,kube-proxy-vX.Y.Z,etcd-vX.Y.Z}
# which is where the tests look. A binary already there is kept, so only the first run builds; a new pin
# is a new file name and builds again. Called by install-test-deps.sh (so by `make test`).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
tools=$repo/internal/kubeapi/tools
dest=${XDG_CACHE_HOME:-$HOME/.cache}/nodelocaldns/kubeapi
go=${GO:-go}

# pinned MODULE GOMOD: the version GOMOD requires MODULE at.
pinned() {
	local version
	version=$(awk -v m="$1" '($1 == "require" && $2 == m) { print $3 } ($1 == m && $2 ~ /^v/) { print $2 }' "$2" | head -n 1)
	if [ -z "$version" ]; then
		echo "build-kube-apiserver: $2 does not require $1" >&2
		exit 1
	fi
	echo "$version"
}

kube_version=$(pinned k8s.io/kubernetes "$tools/kube-apiserver/go.mod")
etcd_version=$(pinned go.etcd.io/etcd/server/v3 "$tools/etcd/go.mod")
proxy_version=$(pinned k8s.io/kubernetes "$tools/kube-proxy/go.mod")
if [ "$proxy_version" != "$kube_version" ]; then
	echo "build-kube-apiserver: tools/kube-proxy pins k8s.io/kubernetes $proxy_version, tools/kube-apiserver $kube_version; pin both alike" >&2
	exit 1
fi
apiserver=$dest/kube-apiserver-$kube_version
proxy=$dest/kube-proxy-$kube_version
etcd=$dest/etcd-$etcd_version

if [ -x "$apiserver" ] && [ -x "$proxy" ] && [ -x "$etcd" ]; then
	exit 0
fi

mkdir -p "$dest"
# Two `make test` runs at once build once: the second waits here, then finds the binaries.
exec 9>"$dest/.build.lock"
flock 9

# build DIR OUTPUT LDFLAGS: builds the main package in DIR (its own module) into OUTPUT, via a temporary
# file so that an interrupted build never leaves a binary that looks finished.
build() {
	local dir=$1 out=$2 ldflags=$3
	[ -x "$out" ] && return 0
	local started=$SECONDS
	(cd "$dir" && nice "$go" build -trimpath -ldflags "$ldflags" -o "$out.tmp" .)
	mv -f "$out.tmp" "$out"
	echo "build-kube-apiserver: built $out in $((SECONDS - started))s"
}

if [ ! -x "$etcd" ]; then
	echo "build-kube-apiserver: building etcd $etcd_version for the Kubernetes API tests (about 1 minute on 2 cores, once)"
	build "$tools/etcd" "$etcd" "-s -w"
fi
minor=${kube_version#v*.}
minor=${minor%%.*}
major=${kube_version#v}
major=${major%%.*}
kube_ldflags="-s -w \
	-X k8s.io/component-base/version.gitVersion=$kube_version \
	-X k8s.io/component-base/version.gitMajor=$major \
	-X k8s.io/component-base/version.gitMinor=$minor \
	-X k8s.io/component-base/version.gitTreeState=clean"
if [ ! -x "$apiserver" ]; then
	# The figure is from a cold build cache; README.md says how it was measured.
	echo "build-kube-apiserver: building kube-apiserver $kube_version for the Kubernetes API tests;" \
		"the first build takes about 11 CPU-minutes, ten minutes or more on 2 cores (later runs reuse $apiserver)"
	build "$tools/kube-apiserver" "$apiserver" "$kube_ldflags"
fi
if [ ! -x "$proxy" ]; then
	# kube-proxy shares most packages with kube-apiserver, so after it its build mostly links from Go's cache.
	echo "build-kube-apiserver: building kube-proxy $kube_version for the simulated node's real kube-proxy;" \
		"about 70 seconds on 2 cores after kube-apiserver's build, whose packages it reuses (later runs reuse $proxy)"
	build "$tools/kube-proxy" "$proxy" "$kube_ldflags"
fi
