#!/usr/bin/env bash
# Builds the node-cache image the chart and the manifests run, without a container engine: the Go toolchain
# builds the two binaries as cmd/node-cache/Dockerfile does, apt-get downloads the Debian packages of the
# iptables commands (both flavours, iptables-legacy and iptables-nft) and what they link, dpkg-deb unpacks
# them, and build/ociimage writes an OCI image layout of two layers (the Debian packages; the binaries).
#
# Reproducible: the same source, Go toolchain and .deb files give the same digest. Every file is owned by
# root, packed in lexical order, with every timestamp SOURCE_DATE_EPOCH (by default the commit time of HEAD).
# The .deb files are the versions apt's lists name when the build runs, kept in bin/image-cache/debs; the
# image lists them in /var/lib/dpkg/status.d (as distroless images do, for scanners) and so does
# bin/image.packages.
#
#   build/image.sh                     bin/image (OCI layout) and bin/node-cache-image.tar (oci-archive)
#   IMAGE_OUT=DIR build/image.sh       DIR/image and DIR/node-cache-image.tar instead
#   IMAGE_CACHE=DIR build/image.sh     the .deb files in DIR instead of bin/image-cache
#
# Import with `ctr -n k8s.io images import bin/node-cache-image.tar` or `skopeo copy oci:bin/image:TAG
# docker://REGISTRY/node-cache:TAG`.
set -euo pipefail
umask 022

GO=${GO:-go}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
out=${IMAGE_OUT:-$repo/bin}
cache=${IMAGE_CACHE:-$repo/bin/image-cache}

# The name and tag the chart deploys by default: values.yaml's image.repository and Chart.yaml's appVersion.
name=$(sed -n '/^image:/,/^[^ #]/s/^  repository: *//p' charts/node-local-dns/values.yaml)
tag=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/node-local-dns/Chart.yaml)
if [ -z "$name" ] || [ -z "$tag" ]; then
	echo "image.sh: no image.repository in charts/node-local-dns/values.yaml or appVersion in Chart.yaml" >&2
	exit 1
fi
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	if ! SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null); then
		echo "image.sh: not in a git checkout; set SOURCE_DATE_EPOCH" >&2
		exit 1
	fi
fi
export SOURCE_DATE_EPOCH
arch=$("$GO" env GOARCH)
debarch=$(dpkg --print-architecture)
if [ "$arch" != "$debarch" ]; then
	echo "image.sh: Go builds for $arch and apt fetches $debarch packages; build on a $arch machine" >&2
	exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=$work/base app=$work/app
mkdir -p "$base" "$app" "$cache/debs"

# The binaries, as cmd/node-cache/Dockerfile builds them: static, the lean one the manifests start and the full
# one it execs for a Corefile using trace.
ldflags="-s -w -buildid="
CGO_ENABLED=0 GOOS=linux GOARCH=$arch "$GO" build -trimpath -ldflags="$ldflags" -tags nodecache_lean -o "$app/node-cache" ./cmd/node-cache
CGO_ENABLED=0 GOOS=linux GOARCH=$arch "$GO" build -trimpath -ldflags="$ldflags" -o "$app/node-cache-full" ./cmd/node-cache
chmod 0755 "$app/node-cache" "$app/node-cache-full"

# iptables and its dependency closure (Depends and Pre-Depends), and base-files (/etc/os-release, for
# scanners and people), at the versions apt's lists name. No nftables package: in kube-proxy's nftables mode
# the cache writes its table over netlink and runs no command.
mapfile -t packages < <(
	{
		echo base-files
		apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
			--no-enhances iptables | grep -v '^ ' | grep -v '^<'
	} | sort -u
)
# apt's lists may be missing or older than the mirror's files: as root, update them once and ask again.
if ! uris=$(apt-get download --print-uris "${packages[@]}" 2>"$work/apt.err") &&
	! { [ "$(id -u)" -eq 0 ] && apt-get update -qq && uris=$(apt-get download --print-uris "${packages[@]}" 2>"$work/apt.err"); }; then
	cat "$work/apt.err" >&2
	echo "image.sh: apt-get cannot find ${packages[*]}; run apt-get update (as root)" >&2
	exit 1
fi
: >"$work/packages"
missing=()
while read -r _ file _ _; do
	[ -f "$cache/debs/$file" ] || missing+=("${file%%_*}")
done <<<"$uris"
if [ ${#missing[@]} -gt 0 ]; then
	# As root, apt would download as _apt, which cannot write the cache: root downloads.
	(cd "$cache/debs" && apt-get download -qq -o APT::Sandbox::User="$(id -un)" "${missing[@]}")
fi
while read -r _ file _ sum; do
	deb=$cache/debs/$file
	if [ "$(sha256sum "$deb" | cut -d' ' -f1)" != "${sum#SHA256:}" ]; then
		rm -f "$deb"
		echo "image.sh: $deb does not have the SHA256 apt's lists give (${sum#SHA256:}); removed, run again" >&2
		exit 1
	fi
	dpkg-deb -x "$deb" "$work/unpacked"
	pkg=$(dpkg-deb -f "$deb" Package)
	mkdir -p "$base/var/lib/dpkg/status.d"
	{
		dpkg-deb -f "$deb" Package Version Architecture Source Maintainer Depends Pre-Depends Homepage Description
		echo "Status: install ok installed"
	} >"$base/var/lib/dpkg/status.d/$pkg"
	echo "$pkg $(dpkg-deb -f "$deb" Version) ${sum#SHA256:}" >>"$work/packages"
done <<<"$uris"

# Merged /usr, as Debian 12 lays out a system: /bin, /sbin, /lib and /lib64 are links into /usr.
for d in bin sbin lib lib64; do
	if [ -d "$work/unpacked/$d" ]; then
		mkdir -p "$work/unpacked/usr/$d"
		cp -a "$work/unpacked/$d/." "$work/unpacked/usr/$d/"
		rm -rf "${work:?}/unpacked/$d"
	fi
	ln -s "usr/$d" "$work/unpacked/$d"
done
# Documentation aside from the copyright files; manual pages, lintian overrides.
find "$work/unpacked/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
find "$work/unpacked/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$work/unpacked/usr/share/man" "$work/unpacked/usr/share/lintian" "$work/unpacked/usr/share/info"
cp -a "$work/unpacked/." "$base/"

# What the maintainer scripts would do: iptables's update-alternatives points the plain names at the nft
# flavour (Debian's default); the cache itself runs iptables-legacy or iptables-nft by name.
for t in iptables ip6tables; do
	for s in "" -save -restore; do
		ln -s "$t-nft$s" "$base/usr/sbin/$t$s"
	done
done
# root and nobody; /tmp for the pidfile; /run for the lock files the manifests mount.
mkdir -p "$base/tmp" "$base/run" "$base/etc"
chmod 1777 "$base/tmp"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$base/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$base/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\nprotocols: files\nservices: files\n' >"$base/etc/nsswitch.conf"
mkdir -p "$base/root"
chmod 0700 "$base/root"

mkdir -p "$out"
"$GO" run ./build/ociimage -out "$out/image" -archive "$out/node-cache-image.tar" -name "$name" -tag "$tag" -arch "$arch" \
	-layer "debian $(grep -c . "$work/packages") packages ($debarch): iptables (legacy and nft) and what it links=$base" \
	-layer "node-cache and node-cache-full ($("$GO" env GOVERSION), CGO_ENABLED=0 -trimpath)=$app" \
	-entrypoint /node-cache \
	-env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	-label "org.opencontainers.image.title=node-cache" \
	-label "org.opencontainers.image.version=$tag" \
	-label "org.opencontainers.image.source=https://github.com/nodelocaldns/nodelocaldns" | tee "$work/summary"
cp "$work/packages" "$out/image.packages"
