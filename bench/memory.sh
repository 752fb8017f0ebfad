#!/usr/bin/env bash
# Memory benchmark: resident memory of a node cache on a simulated node, for the node-cache build as the
# manifests run it, the same build with upstream node-cache's Corefile, and unbound, in interleaved rounds.
#
#   bench/memory.sh                          # 3 rounds
#   ROUNDS=5 RATE=20000 bench/memory.sh
#
# The simulated node is bench/simnode.sh's, as test/simnode lays it out: a Pod (10.244.0.2), the
# node with kube-proxy-style DNAT for the kube-dns ClusterIPs (10.96.0.10 and kube-dns-upstream's 10.96.0.11),
# a cluster-DNS Pod (10.244.1.2, a node-cache build with a template answering every A query under
# svc.cluster.local) and the node's resolver (192.0.2.53). Every address exists only in those namespaces.
#
# Variants, each started afresh in the node namespace in every round, in an order that rotates:
#   shipped   cmd/node-cache with the arguments and Corefile of examples/kubernetes/nodelocaldns-iptables.yaml
#   upstream  the same build and arguments with upstream node-cache's Corefile
#             (corefile/testdata/upstream-template.Corefile, its variables filled as upstream's install does)
#   unbound   Debian's unbound, forwarding cluster.local and the reverse zones to kube-dns-upstream over TCP and
#             everything else to the node's resolver, TTLs clamped to 5-30 s (5 s negative) as the Corefile does
# Each answers on 169.254.20.10 (the Pod asks that address, so kube-proxy's DNAT of 10.96.0.10 does not
# matter to unbound, which installs no NOTRACK rules).
#
# Per run, from /proc/PID/status of the cache:
#   start    VmRSS once it answers, plus 1 s
#   names    VmRSS after NAMES distinct names (svcN.nsM.svc.cluster.local A), each asked once (NAMES_REPEAT
#            times in a row with NAMES_REPEAT=N, so that wirecache's repeats_only stores them too: full caches),
#            at NAMES_RATE q/s
#   peak     VmHWM after DURATION s of mixed load at RATE q/s: HOT_PERCENT % of queries for the first HOT of
#            those names, the rest for names never asked before; the high-water mark is reset (clear_refs)
#            when the mixed load starts, so this is the most the cache held under it
#   early    VmHWM before that reset: the most it held while starting and taking the names (a node-cache
#            build maps much of its binary while starting, until it unmaps it after the start)
# and, from the cluster DNS's metrics (A queries asked), "fetched", how many of the NAMES names' queries
# reached it, and "refetched", how many did when the same names were asked again, each once, right after
# (before the mixed load).
# dnsperf must see only NOERROR answers and at most 0.1 % of queries lost, or the run fails; the lost
# queries are reported.
#
# NODE_CACHE=PATH measures that build (and PATH-full beside it, if any) instead of building cmd/node-cache
# as its Dockerfile does (static, stripped, the lean node-cache and node-cache-full); the cluster DNS and the
# node's resolver run a copy of it. NODE_CACHE_ALT=PATH adds the variant "alt", the shipped one with that build (an
# executable script that execs a build with other settings will do), to measure a change in the same rounds.
# PROFILE_DIR=DIR saves the cache's /proc/PID/smaps and status at each of the three points into DIR, for
# every variant, and, for node-cache builds (which need the pprof plugin), adds `pprof 127.0.0.1:6060` to the
# cache's first server block and saves heap profiles (.heap, and .txt with the runtime's MemStats) and the
# goroutines. Fetching a profile maps much of the binary's function tables, so with PROFILE_DIR a node-cache
# build's figures after the start are higher than without. KEEP=1 keeps the logs.
#
# Needs root, iproute2, iptables, dnsperf and unbound (installed with apt-get when missing), go.
# Kills only the processes it started; removes its namespaces, links and files at exit.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
NAMES=${NAMES:-10000}
DURATION=${DURATION:-10}
RATE=${RATE:-10000}
NAMES_RATE=${NAMES_RATE:-2000}
NAMES_REPEAT=${NAMES_REPEAT:-1}
HOT=${HOT:-1000}
HOT_PERCENT=${HOT_PERCENT:-90}
VARIANTS=${VARIANTS:-shipped upstream unbound}

cd "$(dirname "$0")/.."
# shellcheck source=bench/simnode.sh
. bench/simnode.sh

die() { echo "memory bench: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
simnode_positive ROUNDS NAMES DURATION RATE NAMES_RATE NAMES_REPEAT HOT
[[ $HOT_PERCENT =~ ^[0-9]+$ && $HOT_PERCENT -le 100 ]] || die "HOT_PERCENT must be 0-100"
[ "$HOT" -le "$NAMES" ] || die "HOT must not exceed NAMES"
simnode_require_tools go ip iptables iptables-restore dnsperf unbound

work=$(mktemp -d /tmp/memory-bench.XXXXXX)
pids=()
trap simnode_cleanup EXIT

simnode_up "nlmem$$"

simnode_node_cache
# The cluster DNS and the node's resolver: the same build, answering every A query.
cat >"$work/Corefile.clusterdns" <<EOF
cluster.local:53 {
    bind $DNS_POD_IP
    prometheus 127.0.0.1:9153
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
simnode_start_upstreams 0 probe.svc.cluster.local

simnode_corefiles
if [ -n "${PROFILE_DIR:-}" ]; then
    mkdir -p "$PROFILE_DIR"
    for f in "$work"/Corefile.base.*; do
        sed -i '0,/^ *errors$/s//    errors\n    pprof 127.0.0.1:6060/' "$f"
    done
fi
# profile VARIANT ROUND POINT: saves the cache's /proc/PID/smaps and status (every variant) and heap profiles
# and goroutines (node-cache builds) when PROFILE_DIR is set.
profile() {
    [ -n "${PROFILE_DIR:-}" ] || return 0
    local url=http://127.0.0.1:6060/debug/pprof out=$PROFILE_DIR/$1-$2-$3
    cat "/proc/$cache_pid/smaps" >"$out.smaps"
    cat "/proc/$cache_pid/status" >"$out.status"
    [ "$1" != unbound ] || return 0
    ip netns exec "$ns_node" curl -sf -o "$out.heap" "$url/heap" &&
        ip netns exec "$ns_node" curl -sf -o "$out.txt" "$url/heap?debug=1" &&
        ip netns exec "$ns_node" curl -sf -o "$out.goroutines" "$url/goroutine?debug=1" ||
        die "$1: no heap profile from 127.0.0.1:6060 (does the build have pprof?)"
}
# clusterA: the A queries the cluster DNS was asked so far.
clusterA() {
    in_ns "$ns_dns" curl -sf http://127.0.0.1:9153/metrics |
        awk '/^coredns_dns_requests_total\{/ && /type="A"/ { s += $NF } END { printf "%d", s }' || die "no metrics from the cluster DNS"
}

simnode_unbound_conf

# Queries: NAMES distinct names, then the mixed load (RATE * DURATION queries, so no new name repeats).
seq 1 "$NAMES" | awk -v r="$NAMES_REPEAT" '{ for (i = 0; i < r; i++) printf "svc%d.ns%d.svc.cluster.local A\n", $1, $1 % 97 }' >"$work/queries.names"
seq 1 "$NAMES" | awk '{ printf "svc%d.ns%d.svc.cluster.local A\n", $1, $1 % 97 }' >"$work/queries.again"
awk -v n=$((RATE * DURATION)) -v names="$NAMES" -v hot="$HOT" -v pct="$HOT_PERCENT" 'BEGIN {
    srand(1); fresh = names
    for (i = 0; i < n; i++) {
        if (rand() * 100 < pct) { k = 1 + int(rand() * hot) } else { k = ++fresh }
        printf "svc%d.ns%d.svc.cluster.local A\n", k, k % 97
    }
}' >"$work/queries.mixed"

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
printf '%-6s %-9s %10s %10s %10s %10s %10s %6s %8s %9s   %s\n' round variant "start MiB" "names MiB" "peak MiB" "early MiB" "mixed q/s" lost fetched refetched "(anon MiB)"
read -r -a variants <<<"$VARIANTS"
for round in $(seq 1 "$ROUNDS"); do
    n=${#variants[@]}
    for i in $(seq 0 $((n - 1))); do
        variant=${variants[$(((i + round - 1) % n))]}
        simnode_start "$variant"
        simnode_ready "$variant" ready.kube-system.svc.cluster.local
        sleep 1
        start_kib=$(kib "$cache_pid" VmRSS) start_anon=$(kib "$cache_pid" RssAnon)
        profile "$variant" "$round" start
        up0=$(clusterA)
        perf "$work/queries.names" -n 1 -Q "$NAMES_RATE"
        names_lost=$lost
        names_kib=$(kib "$cache_pid" VmRSS) names_anon=$(kib "$cache_pid" RssAnon)
        profile "$variant" "$round" names
        # The second pass: the same names again, each once; refetched counts those that reached the cluster DNS.
        up1=$(clusterA)
        perf "$work/queries.again" -n 1 -Q "$NAMES_RATE"
        names_lost=$((names_lost + lost))
        up2=$(clusterA)
        fetched=$((up1 - up0)) refetched=$((up2 - up1))
        early_kib=$(kib "$cache_pid" VmHWM)
        echo 5 >"/proc/$cache_pid/clear_refs" # resets VmHWM to VmRSS
        perf "$work/queries.mixed" -l "$DURATION" -Q "$RATE"
        peak_kib=$(kib "$cache_pid" VmHWM) end_anon=$(kib "$cache_pid" RssAnon)
        profile "$variant" "$round" peak
        simnode_stop "$variant"
        printf '%-6s %-9s %10s %10s %10s %10s %10s %6s %8s %9s   (%s %s %s)\n' "$round" "$variant" "$(mib "$start_kib")" \
            "$(mib "$names_kib")" "$(mib "$peak_kib")" "$(mib "$early_kib")" "$qps" $((names_lost + lost)) "$fetched" "$refetched" \
            "$(mib "$start_anon")" "$(mib "$names_anon")" "$(mib "$end_anon")"
        echo "$variant $start_kib $names_kib $peak_kib $refetched $early_kib" >>"$results"
    done
done

echo
echo "median over $ROUNDS rounds (MiB):"
printf '%-9s %10s %10s %10s %10s %10s\n' variant start names peak early refetched
for variant in "${variants[@]}"; do
    awk -v v="$variant" "$simnode_awk_median"'
        $1 == v { n++; s[n] = $2; m[n] = $3; p[n] = $4; r[n] = $5; e[n] = $6 }
        END { printf "%-9s %10.1f %10.1f %10.1f %10.1f %10d\n", v, median(s, n) / 1024, median(m, n) / 1024, median(p, n) / 1024, median(e, n) / 1024, median(r, n) }' "$results"
done
