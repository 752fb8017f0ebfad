#!/usr/bin/env bash
# Load benchmark for the wirecache plugin: cache hits served by the node-cache build on loopback, with and
# without wirecache in the same server block, measured in interleaved rounds in the same run.
#
#   bench/wirecache.sh                      # 3 rounds of 10 s per variant
#   ROUNDS=5 DURATION=20 bench/wirecache.sh
#
# Two node-cache servers run side by side, pinned to CPU 0 with GOMAXPROCS=1 (one server core): "stock"
# (node-cache's cluster.local block: errors, clamp, cache, forward, prometheus) and "wirecache" (the same
# block with wirecache). A third process, the
# stand-in upstream, serves the zone from a file; it is only asked while the caches warm up. dnsperf, pinned
# to CPU 1, sends a small hit-only query set at full speed. Each round runs both variants, alternating which
# goes first; CPU time is the server's utime+stime from /proc/PID/stat over the dnsperf run.
#
# Needs: go, dnsperf (Debian package dnsperf), taskset (util-linux), 2 CPUs. Listens only on 127.0.0.1.
# Kills only the processes it started.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}      # seconds per dnsperf run
CLIENTS=${CLIENTS:-4}         # dnsperf -c
OUTSTANDING=${OUTSTANDING:-200} # dnsperf -q
BASE_PORT=${BASE_PORT:-25300}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}

cd "$(dirname "$0")/.."
repo=$(pwd)

die() { echo "wirecache bench: $*" >&2; exit 1; }
for tool in go dnsperf taskset; do
    command -v "$tool" >/dev/null || die "$tool is not installed (dnsperf: apt-get install dnsperf)"
done
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs: one for the server, one for dnsperf"
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $DURATION =~ ^[1-9][0-9]*$ ]] || die "ROUNDS and DURATION must be positive integers"

work=$(mktemp -d /tmp/wirecache-bench.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

upstream_port=$((BASE_PORT + 1))
declare -A port=([stock]=$((BASE_PORT + 2)) [wirecache]=$((BASE_PORT + 3)))
declare -A metrics_port=([stock]=$((BASE_PORT + 12)) [wirecache]=$((BASE_PORT + 13)))
for p in "$upstream_port" "${port[@]}" "${metrics_port[@]}"; do
    if ss -Hlnut "( sport = :$p )" 2>/dev/null | grep -q .; then
        die "port $p is in use; set BASE_PORT"
    fi
done

# The node-cache build, which compiles wirecache in.
go build -o "$work/node-cache" ./cmd/node-cache

# The zone and the queries: 16 services, A and AAAA, all answered from the caches after warm-up.
{
    echo '$ORIGIN cluster.local.'
    echo '@ 3600 IN SOA ns.dns hostmaster 1 7200 3600 1209600 30'
    echo '@ 3600 IN NS ns.dns'
    echo 'ns.dns 3600 IN A 10.96.0.10'
    for i in $(seq 1 16); do
        echo "svc$i.default.svc 30 IN A 10.96.1.$i"
        echo "svc$i.default.svc 30 IN AAAA fd00::1:$i"
    done
} >"$work/cluster.local.db"
for i in $(seq 1 16); do
    echo "svc$i.default.svc.cluster.local A"
    echo "svc$i.default.svc.cluster.local AAAA"
done >"$work/queries"

cat >"$work/Corefile.upstream" <<EOF
cluster.local:$upstream_port {
    bind 127.0.0.1
    file $work/cluster.local.db
}
EOF
# The cluster-domain block node-cache renders (corefile.Config defaults), minus what is off the query path
# (health, ready, reload, loop); the variants differ only in the wirecache line.
cat >"$work/Corefile.stock" <<EOF
cluster.local:${port[stock]} {
    errors
    clamp {
        success 5 30
        denial 5 5
    }
    cache {
        success 9984 30
        denial 9984 5
    }
    bind 127.0.0.1
    forward . 127.0.0.1:$upstream_port {
        force_tcp
    }
    prometheus 127.0.0.1:${metrics_port[stock]}
}
EOF
sed -e "s/:${port[stock]} {/:${port[wirecache]} {/" -e "s/:${metrics_port[stock]}\$/:${metrics_port[wirecache]}/" \
    -e 's/^    errors$/    errors\n    wirecache/' "$work/Corefile.stock" >"$work/Corefile.wirecache"
echo "server block with wirecache (stock: the same without the wirecache line, on port ${port[stock]}):"
sed 's/^/    /' "$work/Corefile.wirecache"

# start NAME CPU COREFILE: runs a node-cache pinned to CPU with one P; sets started_pid.
start() {
    local name=$1 cpu=$2 corefile=$3
    GOMAXPROCS=1 taskset -c "$cpu" "$work/node-cache" -conf "$corefile" >"$work/$name.log" 2>&1 &
    started_pid=$!
    pids+=("$started_pid")
}

# wait_udp PORT: waits up to 10 s for a UDP listener on 127.0.0.1:PORT.
wait_udp() {
    for _ in $(seq 1 100); do
        ss -Hlnu "( sport = :$1 )" | grep -q . && return 0
        sleep 0.1
    done
    die "nothing listens on udp 127.0.0.1:$1; see the server logs in $work"
}

# metric VARIANT NAME: the sum of a metric's samples from the variant's /metrics, without curl.
metric() {
    local body
    exec 3<>"/dev/tcp/127.0.0.1/${metrics_port[$1]}"
    printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
    body=$(cat <&3)
    exec 3<&-
    awk -v name="$2" '$1 == name || index($1, name "{") == 1 { s += $NF } END { printf "%.0f\n", s }' <<<"$body"
}

# cpu_ticks PID: utime+stime in clock ticks (fields 14 and 15 of /proc/PID/stat, after the command name).
cpu_ticks() { awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }

start upstream "$CLIENT_CPU" "$work/Corefile.upstream"
wait_udp "$upstream_port"
declare -A pid
for variant in stock wirecache; do
    start "$variant" "$SERVER_CPU" "$work/Corefile.$variant"
    pid[$variant]=$started_pid
    wait_udp "${port[$variant]}"
    # Warm up: the first pass fills cache (and wirecache), the rest are hits.
    taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "${port[$variant]}" -d "$work/queries" -n 20 >/dev/null
done

clk_tck=$(getconf CLK_TCK)
results="$work/results"
: >"$results"
echo
# "server core" is the server's CPU time over the run's wall time: well under 100 % means something else
# took the server's CPU during that run, and its q/s is lower for it.
printf '%-6s %-10s %12s %12s %10s %14s %12s\n' round variant queries "q/s" lost "CPU-us/query" "server core"
for round in $(seq 1 "$ROUNDS"); do
    order=(stock wirecache)
    [ $((round % 2)) -eq 0 ] && order=(wirecache stock)
    for variant in "${order[@]}"; do
        hits_before=$(metric "$variant" coredns_wirecache_hits_total)
        cache_before=$(metric "$variant" coredns_cache_hits_total)
        ticks_before=$(cpu_ticks "${pid[$variant]}")
        out=$(taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "${port[$variant]}" -d "$work/queries" \
            -l "$DURATION" -c "$CLIENTS" -q "$OUTSTANDING")
        ticks_after=$(cpu_ticks "${pid[$variant]}")
        hits=$(($(metric "$variant" coredns_wirecache_hits_total) - hits_before))
        cache_hits=$(($(metric "$variant" coredns_cache_hits_total) - cache_before))
        completed=$(awk '/Queries completed:/ { print $3 }' <<<"$out")
        lost=$(awk '/Queries lost:/ { print $3 }' <<<"$out")
        qps=$(awk '/Queries per second:/ { printf "%.0f", $4 }' <<<"$out")
        [ -n "$completed" ] && [ "$completed" -gt 0 ] || die "dnsperf completed no queries: $out"
        cpu_us=$(awk -v t=$((ticks_after - ticks_before)) -v hz="$clk_tck" -v n="$completed" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }')
        # Every query must be a hit of the layer under test, or the figures compare something else.
        served=$cache_hits
        [ "$variant" = wirecache ] && served=$hits
        awk -v s="$served" -v n="$completed" 'BEGIN { exit !(s >= 0.99 * n) }' ||
            die "$variant: only $served of $completed queries were hits of the layer under test"
        runtime=$(awk '/Run time \(s\):/ { print $4 }' <<<"$out")
        core=$(awk -v t=$((ticks_after - ticks_before)) -v hz="$clk_tck" -v s="$runtime" 'BEGIN { printf "%.0f%%", t / hz / s * 100 }')
        printf '%-6s %-10s %12s %12s %10s %14s %12s\n' "$round" "$variant" "$completed" "$qps" "$lost" "$cpu_us" "$core"
        echo "$round $variant $qps $cpu_us" >>"$results"
    done
done

echo
awk -v rounds="$ROUNDS" '
    # median of a[1..n], sorted in place (insertion sort: mawk has no asort)
    function median(a, n,    i, j, v) {
        for (i = 2; i <= n; i++) { v = a[i]; for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { qps[$1, $2] = $3; cpu[$1, $2] = $4 }
    END {
        for (r = 1; r <= rounds; r++) {
            qr[r] = qps[r, "wirecache"] / qps[r, "stock"]; cr[r] = cpu[r, "stock"] / cpu[r, "wirecache"]
            printf "round %d: q/s wirecache/stock %.2fx   CPU-us/query stock/wirecache %.2fx\n", r, qr[r], cr[r]
            sq += qps[r, "stock"]; wq += qps[r, "wirecache"]; sc += cpu[r, "stock"]; wc += cpu[r, "wirecache"]
        }
        printf "\nmean over %d rounds: stock %.0f q/s, %.2f CPU-us/query; wirecache %.0f q/s, %.2f CPU-us/query\n", \
            rounds, sq / rounds, sc / rounds, wq / rounds, wc / rounds
        printf "ratio of the means: %.2fx q/s, %.2fx less CPU per query\n", wq / sq, sc / wc
        printf "median of the per-round ratios: %.2fx q/s, %.2fx less CPU per query\n", median(qr, rounds), median(cr, rounds)
    }' "$results"
