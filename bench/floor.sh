#!/usr/bin/env bash
# What a query costs at the rates a node sees, against the floor: the CPU time per query of the node-cache
# build as the manifests run it and of unbound, and of bench/floor.c, a server that answers each query with one
# recvfrom and one sendto and does nothing else (no cache, no upstream), in interleaved rounds on the simulated
# node. Below a few thousand queries a second each query finds a server asleep, and waking it, receiving,
# sending and waking the client cost more than answering; the floor is that part, which every server pays.
#
#   NICE=-10 bench/floor.sh                  # 5 rounds
#   ROUNDS=3 RATES="200 2000" bench/floor.sh
#
# The simulated node, the CPUs (the server alone on SERVER_CPU, dnsperf and the cluster DNS on CLIENT_CPU),
# NICE, the hot names and the mix are bench/cpu.sh's (bench/simnode.sh). Variants (VARIANTS, default "floor
# unbound shipped"; NODE_CACHE_ALT=PATH adds "alt"), each started afresh in every round in an order that
# rotates, get every hot name once and then, for each of RATES:
#   hits RATE   DURATION s of the hot names at RATE q/s: CPU µs per query
#   mix RATE    DURATION s of the mix (HOT_PERCENT % hot names, the rest new, half NXDOMAIN) at RATE q/s: CPU µs
#               per query; the floor answers every name itself, so its figure is the least a mix can cost
# and last the hot names at full speed (q/s and µs per query). It prints each round, with the context switches
# of the server's threads per query (sw/q: at these rates one when a query wakes the server and it sleeps
# again, and one more whenever the client its reply wakes preempts it; unpinned, SERVER_CPU=0,1, that is
# what the CPU per query moves with from run to run), then per variant the medians over the rounds and the
# median of the per-round ratios to the floor and to unbound. CPU time is that of all the server's threads
# (schedstat) over each dnsperf run, as in bench/cpu.sh.
#
# Needs root, iproute2, iptables, dnsperf, unbound, cc, go, taskset, 2 CPUs. Kills only the processes it
# started; removes its namespaces, links and files at exit.
set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
RATES=${RATES:-200 2000}
HOT=${HOT:-1000}
HOT_PERCENT=${HOT_PERCENT:-90}
VARIANTS=${VARIANTS:-floor unbound shipped}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
NICE=${NICE:-0}

cd "$(dirname "$0")/.."
# shellcheck source=bench/simnode.sh
. bench/simnode.sh

die() { echo "floor bench: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
simnode_positive ROUNDS DURATION HOT
simnode_rates RATES
simnode_server_settings
simnode_require_tools go ip iptables iptables-restore dnsperf unbound taskset cc

work=$(mktemp -d /tmp/floor-bench.XXXXXX)
pids=()
trap simnode_cleanup EXIT

simnode_up "nlfloor$$"
simnode_node_cache
simnode_floor
simnode_cluster_dns "$((NICE - 5 < -20 ? -20 : NICE - 5))" taskset -c "$CLIENT_CPU"
simnode_corefiles
simnode_unbound_conf

hot_file=$work/queries.hot
simnode_hot "$hot_file"

results=$work/results
: >"$results"
echo
echo "nice $NICE; load: $(uptime | sed 's/.*load average/load average/') on $(nproc) CPUs"
echo "$ROUNDS rounds of: for each of $RATES q/s, the hot names and the mix ($HOT_PERCENT % hot) for $DURATION s each;"
echo "then the hot names at full speed for $DURATION s"
printf '%-5s %-9s %-6s %9s %9s %8s %6s %6s\n' round variant phase rate "q/s" "µs/q" "sw/q" failed
read -r -a variants <<<"$VARIANTS"
first=1000000 # the mix's new names: a range of their own for every run
for round in $(seq 1 "$ROUNDS"); do
    n=${#variants[@]}
    for i in $(seq 0 $((n - 1))); do
        variant=${variants[$(((i + round - 1) % n))]}
        simnode_start "$variant" nice -n "$NICE" taskset -c "$SERVER_CPU"
        simnode_ready "$variant" svc1.ready.svc.cluster.local
        simnode_dnsperf "$hot_file" -Q 5000
        rows=()
        for rate in $RATES; do
            simnode_dnsperf "$hot_file" -n "$((rate * DURATION / HOT + 1))" -Q "$rate" -l "$DURATION"
            rows+=("$round $variant hits $rate $qps $us_per_query $failed $switches_per_query")
            simnode_mix "$work/queries.mix" $((rate * DURATION)) "$first" "$HOT_PERCENT"
            first=$((first + 1000000))
            tolerate_failures=1 simnode_dnsperf "$work/queries.mix" -Q "$rate"
            rows+=("$round $variant mix $rate $qps $us_per_query $failed $switches_per_query")
        done
        simnode_dnsperf "$hot_file" -n 1000000 -l "$DURATION"
        rows+=("$round $variant full 0 $qps $us_per_query $failed $switches_per_query")
        simnode_stop "$variant"
        for row in "${rows[@]}"; do
            read -r r v p t q u f w <<<"$row"
            printf '%-5s %-9s %-6s %9s %9s %8s %6s %6s\n' "$r" "$v" "$p" "$([ "$t" = 0 ] && echo full || echo "$t")" "$q" "$u" "$w" "$f"
            echo "$row" >>"$results"
        done
    done
done

echo
echo "medians over $ROUNDS rounds; the ratios are medians of the per-round ratios to the floor and to unbound:"
printf '%-9s %-6s %9s %9s %8s %9s %9s\n' variant phase rate "q/s" "µs/q" "/floor" "/unbound"
for variant in "${variants[@]}"; do
    awk -v v="$variant" "$simnode_awk_median"'
        function ratio(base,    i, k, a) {
            k = 0
            for (i = 1; i <= nr; i++) if ((rd[i], base, ph[i], rt[i]) in us && us[rd[i], base, ph[i], rt[i]] > 0) a[++k] = uv[i] / us[rd[i], base, ph[i], rt[i]]
            return k ? sprintf("%.2fx", median(a, k)) : "-"
        }
        { us[$1, $2, $3, $4] = $6 }
        $2 == v { if (!(($3, $4) in seen)) { seen[$3, $4] = 1; order[++np] = $3 SUBSEP $4 } }
        { rows[++nrows] = $0 }
        END {
            for (j = 1; j <= np; j++) {
                split(order[j], pr, SUBSEP)
                nr = 0; delete q; delete u
                for (l = 1; l <= nrows; l++) {
                    split(rows[l], f, " ")
                    if (f[2] == v && f[3] == pr[1] && f[4] == pr[2]) { nr++; q[nr] = f[5]; u[nr] = f[6]; rd[nr] = f[1]; ph[nr] = f[3]; rt[nr] = f[4]; uv[nr] = f[6] }
                }
                for (i = 1; i <= nr; i++) a[i] = q[i]; mq = median(a, nr)
                for (i = 1; i <= nr; i++) a[i] = u[i]; mu = median(a, nr)
                printf "%-9s %-6s %9s %9.0f %8.1f %9s %9s\n", v, pr[1], pr[2] == 0 ? "full" : pr[2], mq, mu, ratio("floor"), ratio("unbound")
            }
        }' "$results"
done
