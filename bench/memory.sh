#!/usr/bin/env bash
# Memory benchmark: resident memory of a node cache on a simulated node, for the node-cache build as the
# manifests run it, the same build with upstream node-cache's Corefile, and unbound, in interleaved rounds.
#
#   bench/memory.sh                          # 3 rounds
#   ROUNDS=5 RATE=20000 bench/memory.sh
#
# The simulated node is built from network namespaces, as test/simnode lays it out: a Pod (10.244.0.2), the
# node with kube-proxy-style DNAT for the kube-dns ClusterIPs (10.96.0.10 and kube-dns-upstream's 10.96.0.11),
# a cluster-DNS Pod (10.244.1.2, a node-cache build with a template answering every A query under
# svc.cluster.local) and the node's resolver (192.0.2.53). Every address exists only in those namespaces.
#
# Variants, each started afresh in the node namespace in every round, in an order that rotates:
#   shipped   examples/node-cache with the arguments and Corefile of examples/kubernetes/nodelocaldns-iptables.yaml
#   upstream  the same build and arguments with upstream node-cache's Corefile
#             (corefile/testdata/upstream-template.Corefile, its variables filled as upstream's install does)
#   unbound   Debian's unbound, forwarding cluster.local and the reverse zones to kube-dns-upstream over TCP and
#             everything else to the node's resolver, TTLs clamped to 5-30 s (5 s negative) as the Corefile does
# Each answers on 169.254.20.10 (the Pod asks that address, so kube-proxy's DNAT of 10.96.0.10 does not
# matter to unbound, which installs no NOTRACK rules).
#
# Per run, from /proc/PID/status of the cache:
#   start    VmRSS once it answers, plus 1 s
#   names    VmRSS after NAMES distinct names (svcN.nsM.svc.cluster.local A), each asked once, at NAMES_RATE q/s
#   peak     VmHWM after DURATION s of mixed load at RATE q/s: HOT_PERCENT % of queries for the first HOT of
#            those names, the rest for names never asked before
# dnsperf must see only NOERROR answers and at most 0.1 % of queries lost, or the run fails; the lost
# queries are reported.
#
# NODE_CACHE=PATH measures that build instead of building examples/node-cache as its Dockerfile does (static,
# stripped); the cluster DNS and the node's resolver run it too. PROFILE_DIR=DIR (with a build that has the
# pprof plugin) adds `pprof 127.0.0.1:6060` to the cache's first server block and saves heap profiles
# (.heap, and .txt with the runtime's MemStats) at each of the three points into DIR. KEEP=1 keeps the logs.
#
# Needs root, iproute2, iptables, dnsperf and unbound (installed with apt-get when missing), go.
# Kills only the processes it started; removes its namespaces, links and files at exit.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
NAMES=${NAMES:-10000}
DURATION=${DURATION:-10}
RATE=${RATE:-10000}
NAMES_RATE=${NAMES_RATE:-2000}
HOT=${HOT:-1000}
HOT_PERCENT=${HOT_PERCENT:-90}
VARIANTS=${VARIANTS:-shipped upstream unbound}

cd "$(dirname "$0")/.."
repo=$(pwd)

die() { echo "memory bench: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
for v in ROUNDS NAMES DURATION RATE NAMES_RATE HOT; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer"
done
[[ $HOT_PERCENT =~ ^[0-9]+$ && $HOT_PERCENT -le 100 ]] || die "HOT_PERCENT must be 0-100"
[ "$HOT" -le "$NAMES" ] || die "HOT must not exceed NAMES"
missing=()
command -v dnsperf >/dev/null || missing+=(dnsperf)
command -v unbound >/dev/null || missing+=(unbound)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} (Debian packages)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
        die "could not install ${missing[*]}"
fi
for tool in go ip iptables iptables-restore dnsperf unbound; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done

# Addresses of the simulated node (test/simnode's).
POD_IP=10.244.0.2 NODE_POD_IP=10.244.0.1
DNS_POD_IP=10.244.1.2 NODE_DNS_IP=10.244.1.1
EXT_IP=192.0.2.53 NODE_EXT_IP=192.0.2.1
KUBE_DNS_IP=10.96.0.10 UPSTREAM_IP=10.96.0.11 LOCAL_IP=169.254.20.10

prefix="nlmem$$"
ns_node=$prefix-node ns_pod=$prefix-pod ns_dns=$prefix-dns ns_ext=$prefix-ext
work=$(mktemp -d /tmp/memory-bench.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    for ns in "$ns_pod" "$ns_dns" "$ns_ext" "$ns_node"; do
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "/etc/netns/$ns_node" "/etc/netns/$ns_pod"
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# The node.
for ns in "$ns_node" "$ns_pod" "$ns_dns" "$ns_ext"; do
    ip netns add "$ns"
    in_ns "$ns" ip link set lo up
done
connect() { # NS NAME IP NODE_IP
    in_ns "$ns_node" ip link add "to-$2" type veth peer name "tmp-$2"
    in_ns "$ns_node" ip link set "tmp-$2" netns "$1"
    in_ns "$1" ip link set "tmp-$2" name eth0
    in_ns "$ns_node" ip addr add "$4/24" dev "to-$2"
    in_ns "$1" ip addr add "$3/24" dev eth0
    in_ns "$ns_node" ip link set "to-$2" up
    in_ns "$1" ip link set eth0 up
    in_ns "$1" ip route add default via "$4"
}
connect "$ns_pod" pod "$POD_IP" "$NODE_POD_IP"
connect "$ns_dns" dns "$DNS_POD_IP" "$NODE_DNS_IP"
connect "$ns_ext" ext "$EXT_IP" "$NODE_EXT_IP"
in_ns "$ns_node" ip route add default via "$EXT_IP"
in_ns "$ns_node" sysctl -qw net.ipv4.ip_forward=1
{
    echo '*nat'
    echo ':KUBE-SERVICES - [0:0]'
    echo ':KUBE-SVC-KUBEDNS - [0:0]'
    echo '-A PREROUTING -j KUBE-SERVICES'
    echo '-A OUTPUT -j KUBE-SERVICES'
    for ip in "$KUBE_DNS_IP" "$UPSTREAM_IP"; do
        for proto in udp tcp; do
            echo "-A KUBE-SERVICES -d $ip/32 -p $proto -m $proto --dport 53 -j KUBE-SVC-KUBEDNS"
        done
    done
    for proto in udp tcp; do
        echo "-A KUBE-SVC-KUBEDNS -p $proto -m $proto -j DNAT --to-destination $DNS_POD_IP:53"
    done
    echo 'COMMIT'
} | in_ns "$ns_node" iptables-restore --noflush
# The node's resolv.conf (the cache's dnsPolicy: Default) and the Pod's.
mkdir -p "/etc/netns/$ns_node" "/etc/netns/$ns_pod"
echo "nameserver $EXT_IP" >"/etc/netns/$ns_node/resolv.conf"
echo "nameserver $LOCAL_IP" >"/etc/netns/$ns_pod/resolv.conf"

if [ -n "${NODE_CACHE:-}" ]; then
    cp "$NODE_CACHE" "$work/node-cache"
else
    # As examples/node-cache/Dockerfile builds it.
    echo "building examples/node-cache as its Dockerfile does"
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$work/node-cache" ./examples/node-cache
fi

# The cluster DNS and the node's resolver: the same build, answering every A query.
cat >"$work/Corefile.clusterdns" <<EOF
cluster.local:53 {
    bind $DNS_POD_IP
    template IN A cluster.local {
        answer "{{ .Name }} 30 IN A 10.97.0.1"
    }
}
in-addr.arpa:53 ip6.arpa:53 {
    bind $DNS_POD_IP
    template ANY ANY {
        rcode NXDOMAIN
    }
}
EOF
cat >"$work/Corefile.ext" <<EOF
.:53 {
    bind $EXT_IP
    template IN A {
        answer "{{ .Name }} 60 IN A 192.0.2.80"
    }
}
EOF
ip netns exec "$ns_dns" "$work/node-cache" -conf "$work/Corefile.clusterdns" >"$work/clusterdns.log" 2>&1 &
pids+=($!)
ip netns exec "$ns_ext" "$work/node-cache" -conf "$work/Corefile.ext" >"$work/ext.log" 2>&1 &
pids+=($!)

# wait_dns NS SERVER NAME: waits up to 20 s for SERVER to answer NAME from namespace NS.
wait_dns() {
    for _ in $(seq 1 200); do
        if in_ns "$1" dig +short +tries=1 +time=1 @"$2" "$3" A 2>/dev/null | grep -q .; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}
wait_dns "$ns_dns" "$DNS_POD_IP" probe.svc.cluster.local || die "the cluster DNS does not answer; see $work/clusterdns.log"
wait_dns "$ns_ext" "$EXT_IP" probe.example.org || die "the node's resolver does not answer"

# The Corefiles. The shipped one is the ConfigMap of the iptables manifest; upstream's has its install-time
# variables filled in as upstream's instructions do with sed.
manifest=examples/kubernetes/nodelocaldns-iptables.yaml
awk '/^  Corefile: \|$/ { on = 1; next } on && /^---$/ { exit } on { sub(/^        /, ""); print }' "$manifest" \
    >"$work/Corefile.base.shipped"
grep -q '^cluster.local:53 {' "$work/Corefile.base.shipped" || die "no Corefile found in $manifest"
sed -e 's/__PILLAR__DNS__DOMAIN__/cluster.local/g' -e "s/__PILLAR__LOCAL__DNS__/$LOCAL_IP/g" \
    -e "s/__PILLAR__DNS__SERVER__/$KUBE_DNS_IP/g" corefile/testdata/upstream-template.Corefile >"$work/Corefile.base.upstream"
if [ -n "${PROFILE_DIR:-}" ]; then
    mkdir -p "$PROFILE_DIR"
    for f in "$work"/Corefile.base.*; do
        sed -i '0,/^ *errors$/s//    errors\n    pprof 127.0.0.1:6060/' "$f"
    done
fi
# profile VARIANT ROUND POINT: saves heap profiles when PROFILE_DIR is set.
profile() {
    [ -n "${PROFILE_DIR:-}" ] && [ "$1" != unbound ] || return 0
    local url=http://127.0.0.1:6060/debug/pprof/heap out=$PROFILE_DIR/$1-$2-$3
    ip netns exec "$ns_node" curl -sf -o "$out.heap" "$url" && ip netns exec "$ns_node" curl -sf -o "$out.txt" "$url?debug=1" ||
        die "$1: no heap profile from 127.0.0.1:6060 (does the build have pprof?)"
}

cat >"$work/unbound.conf" <<EOF
server:
    interface: $LOCAL_IP
    interface: $KUBE_DNS_IP
    port: 53
    do-daemonize: no
    username: ""
    chroot: ""
    directory: "$work"
    pidfile: "$work/unbound.pid"
    use-syslog: no
    logfile: ""
    verbosity: 0
    access-control: 0.0.0.0/0 allow
    module-config: "iterator"
    domain-insecure: "cluster.local"
    unblock-lan-zones: yes
    insecure-lan-zones: yes
    cache-min-ttl: 5
    cache-max-ttl: 30
    cache-max-negative-ttl: 5
forward-zone:
    name: "cluster.local."
    forward-addr: $UPSTREAM_IP
    forward-tcp-upstream: yes
forward-zone:
    name: "in-addr.arpa."
    forward-addr: $UPSTREAM_IP
    forward-tcp-upstream: yes
forward-zone:
    name: "ip6.arpa."
    forward-addr: $UPSTREAM_IP
    forward-tcp-upstream: yes
forward-zone:
    name: "."
    forward-addr: $EXT_IP
EOF
unbound-checkconf "$work/unbound.conf" >/dev/null || die "unbound-checkconf rejects $work/unbound.conf"

# Queries: NAMES distinct names, then the mixed load (RATE * DURATION queries, so no new name repeats).
seq 1 "$NAMES" | awk '{ printf "svc%d.ns%d.svc.cluster.local A\n", $1, $1 % 97 }' >"$work/queries.names"
awk -v n=$((RATE * DURATION)) -v names="$NAMES" -v hot="$HOT" -v pct="$HOT_PERCENT" 'BEGIN {
    srand(1); fresh = names
    for (i = 0; i < n; i++) {
        if (rand() * 100 < pct) { k = 1 + int(rand() * hot) } else { k = ++fresh }
        printf "svc%d.ns%d.svc.cluster.local A\n", k, k % 97
    }
}' >"$work/queries.mixed"

# start VARIANT: starts the cache in the node namespace; sets cache_pid. `ip netns exec` and env exec in
# place, so $! is the cache's own PID.
start() {
    local variant=$1 dir=$work/$1
    rm -rf "$dir"
    mkdir -p "$dir"
    case $variant in
    shipped | upstream)
        cp "$work/Corefile.base.$variant" "$dir/Corefile.base"
        mkdir "$dir/kube-dns" # the manifest's optional kube-dns ConfigMap volume, with no ConfigMap
        # The manifest's arguments, with the paths of this run; KUBE_DNS_UPSTREAM_* as the kubelet sets them.
        ip netns exec "$ns_node" env KUBE_DNS_UPSTREAM_SERVICE_HOST=$UPSTREAM_IP KUBE_DNS_UPSTREAM_SERVICE_PORT=53 \
            XTABLES_LOCKFILE="$dir/xtables.lock" \
            "$work/node-cache" -localip "$LOCAL_IP,$KUBE_DNS_IP" -conf "$dir/Corefile" \
            -basecorefile "$dir/Corefile.base" -kubednscm "$dir/kube-dns" -upstreamsvc kube-dns-upstream \
            -pidfile "$dir/node-cache.pid" -health-port 8080 -prometheus-listen-address "$NODE_POD_IP:9253" \
            -lockfile "$dir/nodelocaldns.lock" >"$dir/log" 2>&1 &
        ;;
    unbound)
        # unbound puts no address on a link: a portless bridge holds them, as node-cache's notrack does.
        in_ns "$ns_node" ip link add ubound type bridge
        in_ns "$ns_node" ip addr add "$LOCAL_IP/32" dev ubound
        in_ns "$ns_node" ip addr add "$KUBE_DNS_IP/32" dev ubound
        in_ns "$ns_node" ip link set ubound up
        ip netns exec "$ns_node" unbound -d -c "$work/unbound.conf" >"$dir/log" 2>&1 &
        ;;
    esac
    cache_pid=$!
    pids+=("$cache_pid")
}

# stop VARIANT: SIGTERM and wait, so the next variant finds the addresses free.
stop() {
    kill -TERM "$cache_pid" 2>/dev/null || true
    wait "$cache_pid" 2>/dev/null || true
    if [ "$1" = unbound ]; then
        in_ns "$ns_node" ip link del ubound
    fi
}

kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

# perf FILE ARGS...: runs dnsperf from the Pod; fails on lost queries or any answer but NOERROR.
perf() {
    local file=$1 out
    shift
    out=$(in_ns "$ns_pod" dnsperf -s "$LOCAL_IP" -d "$file" -c 4 -q 200 -t 5 "$@" 2>&1) || die "dnsperf failed: $out"
    completed=$(awk '/Queries completed:/ { print $3 }' <<<"$out")
    lost=$(awk '/Queries lost:/ { print $3 }' <<<"$out")
    qps=$(awk '/Queries per second:/ { printf "%.0f", $4 }' <<<"$out")
    # A few queries lost under load happen to every variant (UDP); more than 0.1 % is a broken run.
    [ -n "$lost" ] && [ $((lost * 1000)) -le "$((completed + lost))" ] || die "$variant: dnsperf lost $lost queries: $out"
    grep -q 'Response codes: *NOERROR [0-9]* (100\.00%)' <<<"$out" || die "$variant: answers other than NOERROR: $out"
}

results=$work/results
: >"$results"
echo
echo "$NAMES names, then $DURATION s at $RATE q/s ($HOT_PERCENT % of queries for $HOT hot names, the rest new); $ROUNDS rounds"
# anon: the anonymous part of RSS (heap, stacks) at start, after the names and at the end of the load; the
# rest is the binary's pages.
printf '%-6s %-9s %10s %10s %10s %10s %6s   %s\n' round variant "start MiB" "names MiB" "peak MiB" "mixed q/s" lost "(anon MiB)"
read -r -a variants <<<"$VARIANTS"
for round in $(seq 1 "$ROUNDS"); do
    n=${#variants[@]}
    for i in $(seq 0 $((n - 1))); do
        variant=${variants[$(((i + round - 1) % n))]}
        start "$variant"
        wait_dns "$ns_pod" "$LOCAL_IP" ready.kube-system.svc.cluster.local ||
            die "$variant does not answer on $LOCAL_IP; see $work/$variant/log"
        if [ "$variant" != unbound ]; then
            # node-cache answers before notrack's rules are in; the rules are part of the shipped state.
            for _ in $(seq 1 100); do grep -q 'rules in place' "$work/$variant/log" && break; sleep 0.1; done
            grep -q 'rules in place' "$work/$variant/log" ||
                die "$variant: notrack never put its rules in place: $(tail -5 "$work/$variant/log")"
        fi
        sleep 1
        start_kib=$(kib "$cache_pid" VmRSS) start_anon=$(kib "$cache_pid" RssAnon)
        profile "$variant" "$round" start
        perf "$work/queries.names" -n 1 -Q "$NAMES_RATE"
        names_lost=$lost
        names_kib=$(kib "$cache_pid" VmRSS) names_anon=$(kib "$cache_pid" RssAnon)
        profile "$variant" "$round" names
        perf "$work/queries.mixed" -l "$DURATION" -Q "$RATE"
        peak_kib=$(kib "$cache_pid" VmHWM) end_anon=$(kib "$cache_pid" RssAnon)
        profile "$variant" "$round" peak
        stop "$variant"
        printf '%-6s %-9s %10s %10s %10s %10s %6s   (%s %s %s)\n' "$round" "$variant" "$(mib "$start_kib")" \
            "$(mib "$names_kib")" "$(mib "$peak_kib")" "$qps" $((names_lost + lost)) \
            "$(mib "$start_anon")" "$(mib "$names_anon")" "$(mib "$end_anon")"
        echo "$variant $start_kib $names_kib $peak_kib" >>"$results"
    done
done

echo
echo "median over $ROUNDS rounds (MiB):"
printf '%-9s %10s %10s %10s\n' variant start names peak
for variant in "${variants[@]}"; do
    awk -v v="$variant" '
        function median(a, n,    i, j, x) {
            for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        $1 == v { n++; s[n] = $2; m[n] = $3; p[n] = $4 }
        END { printf "%-9s %10.1f %10.1f %10.1f\n", v, median(s, n) / 1024, median(m, n) / 1024, median(p, n) / 1024 }' "$results"
done
