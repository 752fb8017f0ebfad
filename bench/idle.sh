#!/usr/bin/env bash
# Idle benchmark: what a node cache costs on a node that asks it nothing, on a simulated node, for the
# node-cache build as the manifests run it (alone, and with its fail-open guard beside it), the same build
# with upstream node-cache's Corefile, and unbound, in interleaved rounds.
#
#   bench/idle.sh                    # 3 rounds of 10 s
#   ROUNDS=5 IDLE=20 bench/idle.sh
#
# The simulated node is bench/simnode.sh's (see bench/cpu.sh). Each variant starts afresh, answers a warm-up
# of WARM lookups on each of its two addresses (hot names and misses, so that its caches, connections and
# goroutines are those of a node in use, where Pods and the guard's probes ask both), then gets no query at
# all for SETTLE s and is measured over the next IDLE s:
#   CPU ms/s   the CPU time of all its threads (the first field of /proc/PID/task/*/schedstat, ns on a CPU),
#              per second of idle
#   wakes/s    the context switches of all its threads (voluntary and not, /proc/PID/task/*/status), per
#              second: how often it wakes
# Variants: shipped, upstream and unbound as in bench/cpu.sh, each alone; guarded is the shipped cache with
# its guard beside it, started as the manifests start it (-guard -localip ... -guard.serviceips ...
# -upstreamsvc), measured over the same seconds: the cache's row (guarded, which answers the guard's probes)
# and the guard's (guard). -daemonset is left out on both, there being no API server.
#
# PERF_DIR=DIR records `perf record -e sched:sched_switch -g` of each node-cache process over its idle span
# into DIR (build NODE_CACHE without -s for Go symbols): `perf report -i FILE --stdio --no-children` then
# says what woke it.
# NODE_CACHE=PATH measures that build; NODE_CACHE_ALT=PATH adds the variant "alt". Needs root, iproute2,
# iptables, dnsperf and unbound, go, 2 CPUs. Kills only the processes it started.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
IDLE=${IDLE:-10}
SETTLE=${SETTLE:-3}
WARM=${WARM:-2000}
VARIANTS=${VARIANTS:-shipped guarded upstream unbound}

cd "$(dirname "$0")/.."
# shellcheck source=bench/simnode.sh
. bench/simnode.sh

die() { echo "idle bench: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
simnode_positive ROUNDS IDLE SETTLE WARM
simnode_require_tools go ip iptables iptables-restore dnsperf unbound

work=$(mktemp -d /tmp/idle-bench.XXXXXX)
pids=()
trap simnode_cleanup EXIT

simnode_up "nlidle$$"
simnode_node_cache

simnode_cluster_dns 0

simnode_corefiles
simnode_unbound_conf

# The warm-up: hot names twice, new names once, half of them NXDOMAIN, and a few names outside the cluster.
awk -v n="$WARM" 'BEGIN {
    for (i = 0; i < n; i++) {
        k = i % (n / 4)
        if (i % 10 == 9) printf "host%d.example.org A\n", k
        else if (i % 2) printf "x%d.ns%d.svc.cluster.local A\n", i, i % 97
        else printf "svc%d.ns%d.svc.cluster.local A\n", k, k % 97
    }
}' >"$work/queries.warm"

# measure PID...: prints "CPU ms/s wakes/s" of each process over the same IDLE s, one line each.
measure() {
    local pid c0=() w0=() i=0
    for pid in "$@"; do
        c0+=("$(simnode_cpu_ns "$pid")") w0+=("$(simnode_switches "$pid")")
    done
    local perf=()
    if [ -n "${PERF_DIR:-}" ]; then
        mkdir -p "$PERF_DIR"
        for pid in "$@"; do
            perf record -q -e sched:sched_switch -g -p "$pid" -o "$PERF_DIR/$variant-$pid-$round.data" -- sleep "$IDLE" >/dev/null 2>&1 &
            perf+=($!)
        done
    fi
    sleep "$IDLE"
    [ ${#perf[@]} -eq 0 ] || wait "${perf[@]}" || true
    for pid in "$@"; do
        awk -v c0="${c0[$i]}" -v c1="$(simnode_cpu_ns "$pid")" -v w0="${w0[$i]}" -v w1="$(simnode_switches "$pid")" -v t="$IDLE" \
            'BEGIN { printf "%.3f %.1f\n", (c1 - c0) / 1e6 / t, (w1 - w0) / t }'
        i=$((i + 1))
    done
}

start_guard() {
    ip netns exec "$ns_node" env KUBE_DNS_UPSTREAM_SERVICE_HOST=$UPSTREAM_IP KUBE_DNS_UPSTREAM_SERVICE_PORT=53 \
        XTABLES_LOCKFILE="$work/shipped/xtables.lock" \
        "$work/node-cache" -guard -localip "$LOCAL_IP,$KUBE_DNS_IP" -guard.serviceips "$KUBE_DNS_IP" \
        -upstreamsvc kube-dns-upstream -metrics-listen-address "$NODE_POD_IP:9254" \
        -guard.lockpath "$work/guard.lock" -lockfile "$work/shipped/nodelocaldns.lock" >"$work/guard.log" 2>&1 &
    guard_pid=$!
    pids+=("$guard_pid")
}

results=$work/results
: >"$results"
echo "load: $(uptime | sed 's/.*load average/load average/') on $(nproc) CPUs"
echo "$ROUNDS rounds: warm-up of $WARM lookups on each address, $SETTLE s to settle, then $IDLE s with no query"
printf '%-5s %-9s %9s %8s\n' round variant "CPU ms/s" "wakes/s"
read -r -a variants <<<"$VARIANTS"
for round in $(seq 1 "$ROUNDS"); do
    n=${#variants[@]}
    for i in $(seq 0 $((n - 1))); do
        variant=${variants[$(((i + round - 1) % n))]}
        started=$variant
        [ "$variant" != guarded ] || started=shipped
        simnode_start "$started"
        simnode_ready "$started" svc1.ready.svc.cluster.local
        guard_pid=
        [ "$variant" != guarded ] || start_guard
        # On both addresses, as a node's Pods and the guard's probes ask both.
        for ip in "$LOCAL_IP" "$KUBE_DNS_IP"; do
            ip netns exec "$ns_pod" dnsperf -s "$ip" -d "$work/queries.warm" -n 1 -Q 2000 >/dev/null 2>&1 ||
                die "$variant: the warm-up on $ip failed"
        done
        sleep "$SETTLE"
        names=("$variant") procs=("$cache_pid")
        if [ -n "$guard_pid" ]; then
            names+=(guard) procs+=("$guard_pid")
        fi
        j=0
        while read -r cpu_ms wakes_s; do
            printf '%-5s %-9s %9s %8s\n' "$round" "${names[$j]}" "$cpu_ms" "$wakes_s"
            echo "$round ${names[$j]} $cpu_ms $wakes_s" >>"$results"
            j=$((j + 1))
        done < <(measure "${procs[@]}")
        if [ -n "$guard_pid" ]; then
            kill -TERM "$guard_pid" 2>/dev/null || true
            wait "$guard_pid" 2>/dev/null || true
        fi
        simnode_stop "$started"
    done
done

echo
echo "median over $ROUNDS rounds:"
printf '%-9s %9s %8s\n' variant "CPU ms/s" "wakes/s"
for variant in "${variants[@]}" guard; do
    awk -v v="$variant" "$simnode_awk_median"'
        $2 == v { n++; c[n] = $3; w[n] = $4 }
        END { if (n) printf "%-9s %9.3f %8.1f\n", v, median(c, n), median(w, n) }' "$results"
done
