#!/usr/bin/env bash
# CPU benchmark: queries per second, CPU time per query and latency of a node cache on a simulated node, for
# the node-cache build as the manifests run it, the same build with upstream node-cache's Corefile, and
# unbound, in interleaved rounds.
#
#   bench/cpu.sh                             # 3 rounds
#   ROUNDS=5 DURATION=20 bench/cpu.sh
#
# The simulated node is bench/simnode.sh's, as test/simnode lays it out: a Pod (10.244.0.2), the node with
# kube-proxy-style DNAT for the kube-dns ClusterIPs (10.96.0.10 and kube-dns-upstream's 10.96.0.11), a
# cluster-DNS Pod (10.244.1.2, a node-cache build with templates: svcN.* names have an A record, xN.* names
# are NXDOMAIN with an SOA) and the node's resolver (192.0.2.53). Every address exists only in those
# namespaces. The Pod asks 169.254.20.10 over its veth.
#
# Variants, each started afresh in the node namespace in every round, in an order that rotates:
#   shipped   cmd/node-cache with the arguments and Corefile of examples/kubernetes/nodelocaldns-iptables.yaml
#   upstream  the same build and arguments with upstream node-cache's Corefile
#   unbound   Debian's unbound, forwarding cluster.local to kube-dns-upstream over TCP, TTLs clamped to
#             5-30 s (5 s negative) as the Corefile does
# The cache runs on CPU 0 alone (taskset; Go sizes GOMAXPROCS from it, unbound runs one thread); dnsperf and
# the cluster DNS run on CPU 1. CPU time is that of all the cache's threads (schedstat, ns) over each dnsperf
# run (simnode_dnsperf).
#
# Phases of a run (each query file holds names no earlier phase asked, so a "new" name is a miss):
#   hits     DURATION s at full speed over HOT names all answered before (A, NOERROR): q/s and CPU µs/query
#   mixed    DURATION s at full speed: HOT_PERCENT % of queries for the HOT names, the rest for new names, half
#            of them NXDOMAIN (xN.*): q/s and CPU µs/query, and the CPU µs a miss adds to the mix, derived from
#            the hits phase of the same run: (mixed µs/q - HOT_PERCENT % of hits µs/q) / the share of misses
#   latency  DURATION s of the same mix at RATE q/s: p50 and p99 of dnsperf's per-query latency, and CPU µs
#            per query at that rate
#   misses   DURATION s at MISS_RATE q/s of new names only: CPU µs per miss, and the TCP connections the
#            cluster DNS accepted during the phase (SYNs counted in its namespace). Misses this far apart
#            each find the cache idle, so the figure includes waking it (and, for Go, its runtime) twice.
#   loaded   DURATION s at full speed of new names only: CPU µs per miss while misses keep the cache busy
#            (the cost a miss adds to a loaded node)
# In the hits and latency phases, dnsperf must see only NOERROR and NXDOMAIN answers and at most 0.1 % of
# queries lost, or the run fails; in the mixed and both misses phases, the queries lost or answered otherwise
# (SERVFAIL when the upstream exchange failed) are reported ("failed").
#
# On a machine shared with other work, NICE=-10 (say) runs the caches, dnsperf and the cluster DNS at that
# nice level, so that the figures say more about the caches than about the scheduler.
#
# NODE_CACHE=PATH measures that build instead of building cmd/node-cache as its Dockerfile does;
# NODE_CACHE_ALT=PATH adds the variant "alt", the shipped one with that build, to measure a change.
# PERF_DIR=DIR records `perf record -e cpu-clock -g` of the cache over each PERF_PHASE (hits, mixed, latency, misses or loaded; default mixed) into DIR
# (build NODE_CACHE without -s for Go symbols). KEEP=1 keeps the logs. Needs root, iproute2, iptables, dnsperf and unbound (installed with apt-get when missing), go,
# taskset, 2 CPUs. Kills only the processes it started; removes its namespaces, links and files at exit.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
HOT=${HOT:-1000}
HOT_PERCENT=${HOT_PERCENT:-90}
RATE=${RATE:-2000}
MISS_RATE=${MISS_RATE:-2000}
MAX_QPS=${MAX_QPS:-300000} # sizes the full-speed query files: no new name repeats below this rate
VARIANTS=${VARIANTS:-shipped upstream unbound}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
NICE=${NICE:-0}

cd "$(dirname "$0")/.."
# shellcheck source=bench/simnode.sh
. bench/simnode.sh

die() { echo "cpu bench: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
simnode_positive ROUNDS DURATION HOT RATE MISS_RATE MAX_QPS
simnode_server_settings
simnode_require_tools go ip iptables iptables-restore dnsperf unbound taskset
[ -z "${PERF_DIR:-}" ] || command -v perf >/dev/null || die "PERF_DIR needs perf (Debian package linux-perf)"

work=$(mktemp -d /tmp/cpu-bench.XXXXXX)
pids=()
trap simnode_cleanup EXIT

simnode_up "nlcpu$$"
# Counts the TCP connections the cluster DNS accepts.
in_ns "$ns_dns" iptables -A INPUT -p tcp --dport 53 --syn

simnode_node_cache

# The cluster DNS runs at a higher priority than dnsperf on their shared CPU, so that a miss waits on the
# cache rather than on a starved upstream.
simnode_cluster_dns "$((NICE - 5 < -20 ? -20 : NICE - 5))" taskset -c "$CLIENT_CPU"

simnode_corefiles
simnode_unbound_conf

# Query files (simnode_mix): each phase takes its own range of new names.
hot_file=$work/queries.hot
simnode_hot "$hot_file"
full=$((MAX_QPS * DURATION))
simnode_mix "$work/queries.mixed" "$full" 1000000 "$HOT_PERCENT"
simnode_mix "$work/queries.latency" $((RATE * DURATION)) 100000000 "$HOT_PERCENT"
simnode_mix "$work/queries.misses" $((MISS_RATE * DURATION)) 200000000 0
simnode_mix "$work/queries.loaded" "$full" 300000000 0

syns() { in_ns "$ns_dns" iptables -nvxL INPUT | awk '/tcp dpt:53/ { print $1; exit }'; }

# record_profile PHASE: with PERF_DIR, records the cache's CPU profile for DURATION s from now, when PHASE is
# PERF_PHASE.
record_profile() {
    perf_pid=
    [ -n "${PERF_DIR:-}" ] && [ "$1" = "${PERF_PHASE:-mixed}" ] || return 0
    mkdir -p "$PERF_DIR"
    perf record -e cpu-clock -g -p "$cache_pid" -o "$PERF_DIR/$variant-$1-$round.data" -- sleep "$DURATION" >/dev/null 2>&1 &
    perf_pid=$!
}
wait_profile() { [ -z "$perf_pid" ] || wait "$perf_pid" || true; }

results=$work/results
: >"$results"
echo
echo "nice $NICE; load: $(uptime | sed 's/.*load average/load average/') on $(nproc) CPUs"
echo "$ROUNDS rounds of: hits ($HOT names, full speed, $DURATION s), mixed ($HOT_PERCENT % hot, full speed, $DURATION s),"
echo "latency (the mix at $RATE q/s, $DURATION s), misses (new names at $MISS_RATE q/s, $DURATION s),"
echo "loaded (new names at full speed, $DURATION s)"
printf '%-5s %-9s %9s %8s %9s %8s %8s %8s %8s %8s %9s %6s %9s %9s %6s\n' round variant "hits q/s" "µs/q" "mixed q/s" "µs/q" "µs/miss" \
    "p50 ms" "p99 ms" "µs/q" "µs/miss" conns "loaded/s" "µs/miss" failed
read -r -a variants <<<"$VARIANTS"
for round in $(seq 1 "$ROUNDS"); do
    n=${#variants[@]}
    for i in $(seq 0 $((n - 1))); do
        variant=${variants[$(((i + round - 1) % n))]}
        simnode_start "$variant" nice -n "$NICE" taskset -c "$SERVER_CPU"
        simnode_ready "$variant" svc1.ready.svc.cluster.local
        # Warm-up: every hot name asked once.
        simnode_dnsperf "$hot_file" -Q 5000
        record_profile hits
        simnode_dnsperf "$hot_file" -n 1000000 -l "$DURATION"
        hits_qps=$qps hits_us=$us_per_query
        wait_profile
        record_profile mixed
        tolerate_failures=1 simnode_dnsperf "$work/queries.mixed" -l "$DURATION"
        mixed_failed=$failed
        [ "$completed" -lt "$full" ] || die "$variant: the mixed run used up its query file; raise MAX_QPS"
        mixed_qps=$qps mixed_us=$us_per_query
        mixed_miss_us=$(awk -v m="$mixed_us" -v h="$hits_us" -v p="$HOT_PERCENT" \
            'BEGIN { if (p == 100) print "-"; else printf "%.1f", (m - p / 100 * h) / (1 - p / 100) }')
        wait_profile
        record_profile latency
        simnode_dnsperf "$work/queries.latency" -Q "$RATE" -v
        wait_profile
        read -r p50 p99 < <(awk '$1 == ">" { print $NF * 1000 }' <<<"$dnsperf_out" | sort -n |
            awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; printf "%.3f %.3f\n", v[int(NR * 0.5 + 0.5)], v[int(NR * 0.99 + 0.5)] }') ||
            die "$variant: no per-query latencies in dnsperf -v output"
        rate_us=$us_per_query
        s0=$(syns)
        record_profile misses
        tolerate_failures=1 simnode_dnsperf "$work/queries.misses" -Q "$MISS_RATE"
        wait_profile
        miss_us=$us_per_query conns=$(($(syns) - s0)) misses_failed=$failed
        record_profile loaded
        tolerate_failures=1 simnode_dnsperf "$work/queries.loaded" -l "$DURATION"
        wait_profile
        [ "$completed" -lt "$full" ] || die "$variant: the loaded misses run used up its query file; raise MAX_QPS"
        loaded_qps=$qps loaded_us=$us_per_query failed=$((mixed_failed + misses_failed + failed))
        simnode_stop "$variant"
        printf '%-5s %-9s %9s %8s %9s %8s %8s %8s %8s %8s %9s %6s %9s %9s %6s\n' "$round" "$variant" "$hits_qps" "$hits_us" "$mixed_qps" \
            "$mixed_us" "$mixed_miss_us" "$p50" "$p99" "$rate_us" "$miss_us" "$conns" "$loaded_qps" "$loaded_us" "$failed"
        echo "$round $variant $hits_qps $hits_us $mixed_qps $mixed_us $mixed_miss_us $p50 $p99 $rate_us $miss_us $conns $loaded_qps $loaded_us $failed" >>"$results"
    done
done

echo
echo "median over $ROUNDS rounds; q/s also as the ratio to upstream's Corefile in the same round (median of ratios):"
printf '%-9s %9s %6s %8s %9s %6s %8s %8s %8s %8s %8s %9s %6s %9s %9s %6s\n' variant "hits q/s" ratio "µs/q" "mixed q/s" ratio "µs/q" \
    "µs/miss" "p50 ms" "p99 ms" "µs/q" "µs/miss" conns "loaded/s" "µs/miss" failed
for variant in "${variants[@]}"; do
    awk -v v="$variant" "$simnode_awk_median"'
        function ratio(r) { return r > 0 ? sprintf("%.2fx", r) : "-" }
        $2 == "upstream" { uh[$1] = $3; um[$1] = $5 }
        $2 == v { n++; r[n] = $1; for (f = 3; f <= 15; f++) c[f, n] = $f }
        END {
            for (f = 3; f <= 15; f++) { for (i = 1; i <= n; i++) a[i] = c[f, i]; m[f] = median(a, n) }
            k = 0; for (i = 1; i <= n; i++) if (uh[r[i]] > 0) { k++; a[k] = c[3, i] / uh[r[i]] }; rh = k ? median(a, k) : 0
            k = 0; for (i = 1; i <= n; i++) if (um[r[i]] > 0) { k++; a[k] = c[5, i] / um[r[i]] }; rm = k ? median(a, k) : 0
            printf "%-9s %9.0f %6s %8.1f %9.0f %6s %8.1f %8.1f %8.3f %8.3f %8.1f %9.1f %6.0f %9.0f %9.1f %6.0f\n", v, m[3], ratio(rh), m[4], m[5], ratio(rm), m[6], m[7], m[8], m[9], m[10], m[11], m[12], m[13], m[14], m[15]
        }' "$results"
done
