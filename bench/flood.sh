#!/usr/bin/env bash
# Flood benchmark: resident memory of a node cache while one Pod asks a flood of distinct names with large
# answers (a zone it controls, reached through the `.` block), and how another Pod's hot names fare meanwhile,
# on a simulated node, for the node-cache build as the manifests run it and unbound given the same byte budget,
# in interleaved rounds.
#
#   bench/flood.sh                           # 1 round, shipped and unbound
#   ROUNDS=3 VARIANTS="shipped unbound upstream" bench/flood.sh
#
# The simulated node is bench/simnode.sh's (see bench/memory.sh). The node's resolver (192.0.2.53) answers
# every TXT query under flood.example, and the cluster DNS every TXT query under flood.svc.cluster.local, with
# 14 TXT records of 240 bytes: 3,860 and 4,010 bytes uncompressed, near the largest answer wirecache stores (larger
# ones it never holds, so they cost it nothing), about 3,600 as sent. Both are node-cache builds with the template
# plugin; the resolver answers every A query with one record, the cluster DNS every A query under
# svc.cluster.local. The flood's names alternate between the two zones, so it can fill the caches of both the
# `.` block and the cluster block: most of the budget.
#
# Variants, each started afresh in every round, in an order that rotates:
#   shipped   cmd/node-cache with the arguments and Corefile of examples/kubernetes/nodelocaldns-iptables.yaml
#             (its caches' budget: 12 MiB, corefile.DefaultCacheMemory: 7.5 MiB for the cluster block, 3 for `.`)
#   unbound   Debian's unbound as bench/memory.sh runs it, with msg-cache-size and rrset-cache-size adding up
#             to the same budget (BUDGET_KIB, 12288: 4096k and 8192k)
#   upstream  the same node-cache build with upstream node-cache's Corefile, whose cache plugin bounds entries,
#             not bytes: what the flood does without a byte budget
#
# Per run, from /proc/PID/status of the cache:
#   start    VmRSS once it answers and the hot names were asked twice, plus 1 s
#   peak     VmHWM at the end of the flood: FLOOD distinct names (nN.flood.example and nN.flood.svc.cluster.local
#            TXT, alternately), each asked twice in a row, over TCP (so the whole answer is cached), at
#            FLOOD_RATE q/s (what dnsperf reaches is reported)
#   end      VmRSS then
# During the flood a second client in the Pod asks HOT names (half svcN.nsM.svc.cluster.local A, half
# hotN.example.org A, asked before the flood) at HOT_RATE q/s over UDP; its q/s, lost queries and average and
# maximum latency are reported (dnsperf), and "hot up" counts the A queries that reached the cluster DNS and
# the node's resolver during the flood: the hot names' misses (their TTLs are 30 s, so each name is asked
# again about once per 30 s even when nothing is evicted). A run fails only when dnsperf fails or when a hot
# answer is not NOERROR.
#
# NODE_CACHE=PATH measures that build instead of building cmd/node-cache as its Dockerfile does. KEEP=1 keeps
# the logs.
#
# Needs root, iproute2, iptables, dnsperf and unbound (installed with apt-get when missing), go.
# Kills only the processes it started; removes its namespaces, links and files at exit.
set -euo pipefail

ROUNDS=${ROUNDS:-1}
FLOOD=${FLOOD:-50000}
FLOOD_RATE=${FLOOD_RATE:-5000}
HOT=${HOT:-1000}
HOT_RATE=${HOT_RATE:-1000}
BUDGET_KIB=${BUDGET_KIB:-12288}
VARIANTS=${VARIANTS:-shipped unbound}

cd "$(dirname "$0")/.."
# shellcheck source=bench/simnode.sh
. bench/simnode.sh

die() { echo "flood bench: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
simnode_positive ROUNDS FLOOD FLOOD_RATE HOT HOT_RATE BUDGET_KIB
[ "$HOT" -ge 2 ] || die "HOT must be at least 2"
simnode_require_tools go ip iptables iptables-restore dnsperf unbound

work=$(mktemp -d /tmp/flood-bench.XXXXXX)
pids=()
trap simnode_cleanup EXIT

simnode_up "nlflood$$"
simnode_node_cache

# floodTXT: the answer lines of the flood's TXT template.
floodTXT() {
    local txt i
    txt=$(printf 'x%.0s' $(seq 1 238))
    for i in $(seq -w 1 14); do
        echo "        answer \"{{ .Name }} 60 IN TXT $i$txt\""
    done
}
cat >"$work/Corefile.clusterdns" <<EOF
cluster.local:53 {
    bind $DNS_POD_IP
    prometheus 127.0.0.1:9153
    template IN TXT flood.svc.cluster.local {
$(floodTXT)
    }
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
# The node's resolver: the flood's zone, and an A record for every other name.
{
    echo ".:53 {"
    echo "    bind $EXT_IP"
    echo "    prometheus 127.0.0.1:9153"
    echo "    template IN TXT flood.example {"
    floodTXT
    echo "    }"
    echo "    template IN A {"
    echo "        answer \"{{ .Name }} 60 IN A 192.0.2.80\""
    echo "    }"
    echo "}"
} >"$work/Corefile.ext"
simnode_start_upstreams 0 probe.svc.cluster.local
for q in "$ns_ext $EXT_IP n0.flood.example" "$ns_dns $DNS_POD_IP n1.flood.svc.cluster.local"; do
    read -r ns server name <<<"$q"
    size=$(in_ns "$ns" dig +tcp +short @"$server" "$name" TXT | wc -c)
    [ "$size" -gt 3000 ] || die "$name: the flood's answers are too small ($size bytes of text)"
done

simnode_corefiles
simnode_unbound_conf
msg_kib=$((BUDGET_KIB / 3))
sed -i "s/^server:$/server:\n    msg-cache-size: ${msg_kib}k\n    rrset-cache-size: $((BUDGET_KIB - msg_kib))k/" "$work/unbound.conf"
unbound-checkconf "$work/unbound.conf" >/dev/null || die "unbound-checkconf rejects $work/unbound.conf"

seq 0 $((FLOOD - 1)) | awk '{ z = $1 % 2 ? "flood.svc.cluster.local" : "flood.example"; printf "n%d.%s TXT\nn%d.%s TXT\n", $1, z, $1, z }' \
    >"$work/queries.flood"
seq 1 "$HOT" | awk '{ if ($1 % 2) printf "svc%d.ns%d.svc.cluster.local A\n", $1, $1 % 97; else printf "hot%d.example.org A\n", $1 }' \
    >"$work/queries.hot"
flood_seconds=$(((2 * FLOOD + FLOOD_RATE - 1) / FLOOD_RATE))

kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
field() { awk -v k="$1" '$0 ~ k { print $NF; exit }' <<<"$2"; }
# upstreamA: the A queries the cluster DNS and the node's resolver were asked so far.
upstreamA() {
    local ns total=0 n
    for ns in "$ns_dns" "$ns_ext"; do
        n=$(in_ns "$ns" curl -sf http://127.0.0.1:9153/metrics |
            awk '/^coredns_dns_requests_total\{/ && /type="A"/ { s += $NF } END { printf "%d", s }') || die "no metrics from $ns"
        total=$((total + n))
    done
    echo "$total"
}

echo
echo "$FLOOD distinct names with 3.9 KiB TXT answers (half under flood.example, half under flood.svc.cluster.local),"
echo "each asked twice over TCP at $FLOOD_RATE q/s (${flood_seconds} s at that rate),"
echo "while $HOT hot names are asked at $HOT_RATE q/s over UDP; budget $BUDGET_KIB KiB (unbound: msg ${msg_kib}k, rrset $((BUDGET_KIB - msg_kib))k); $ROUNDS rounds"
printf '%-6s %-9s %9s %9s %9s %8s %8s | %8s %6s %7s %7s %7s   %s\n' round variant "start MiB" "peak MiB" "end MiB" \
    "flood/s" "fl.lost" "hot q/s" "lost" "avg ms" "max ms" "hot up" "(anon MiB start end)"
results=$work/results
: >"$results"
read -r -a variants <<<"$VARIANTS"
for round in $(seq 1 "$ROUNDS"); do
    n=${#variants[@]}
    for i in $(seq 0 $((n - 1))); do
        variant=${variants[$(((i + round - 1) % n))]}
        simnode_start "$variant"
        simnode_ready "$variant" ready.kube-system.svc.cluster.local
        # The hot names, asked once (and a second time, for caches that store a name on its second ask).
        for _ in 1 2; do
            in_ns "$ns_pod" dnsperf -s "$LOCAL_IP" -d "$work/queries.hot" -n 1 -Q 2000 -c 2 >/dev/null 2>&1 ||
                die "$variant: dnsperf for the hot names failed"
        done
        sleep 1
        start_kib=$(kib "$cache_pid" VmRSS) start_anon=$(kib "$cache_pid" RssAnon)
        up_before=$(upstreamA)
        in_ns "$ns_pod" dnsperf -s "$LOCAL_IP" -d "$work/queries.hot" -l "$flood_seconds" -Q "$HOT_RATE" -c 2 -t 2 \
            >"$work/$variant/hot.out" 2>&1 &
        hot_pid=$!
        in_ns "$ns_pod" dnsperf -m tcp -s "$LOCAL_IP" -d "$work/queries.flood" -n 1 -Q "$FLOOD_RATE" -c 4 -q 200 -t 5 \
            >"$work/$variant/flood.out" 2>&1 || die "$variant: the flood's dnsperf failed: $(tail -5 "$work/$variant/flood.out")"
        wait "$hot_pid" || die "$variant: the hot names' dnsperf failed: $(tail -5 "$work/$variant/hot.out")"
        peak_kib=$(kib "$cache_pid" VmHWM) end_kib=$(kib "$cache_pid" VmRSS) end_anon=$(kib "$cache_pid" RssAnon)
        up=$(($(upstreamA) - up_before))
        simnode_stop "$variant"
        flood=$(cat "$work/$variant/flood.out") hot=$(cat "$work/$variant/hot.out")
        grep -q 'Response codes: *NOERROR [0-9]* (100\.00%)' <<<"$hot" || die "$variant: hot answers other than NOERROR: $hot"
        printf '%-6s %-9s %9s %9s %9s %8.0f %8s | %8.0f %6s %7.2f %7.1f %7s   (%s %s)\n' "$round" "$variant" "$(mib "$start_kib")" \
            "$(mib "$peak_kib")" "$(mib "$end_kib")" "$(field 'Queries per second:' "$flood")" "$(awk '/Queries lost:/ { print $3 }' <<<"$flood")" \
            "$(field 'Queries per second:' "$hot")" "$(awk '/Queries lost:/ { print $3 }' <<<"$hot")" \
            "$(awk '/Average Latency/ { print $4 * 1000 }' <<<"$hot")" "$(awk '/Average Latency/ { gsub(/\)/, "", $8); print $8 * 1000 }' <<<"$hot")" \
            "$up" "$(mib "$start_anon")" "$(mib "$end_anon")"
        echo "$variant $start_kib $peak_kib $end_kib" >>"$results"
    done
done

echo
echo "median over $ROUNDS rounds (MiB):"
printf '%-9s %10s %10s %10s\n' variant start peak end
for variant in "${variants[@]}"; do
    awk -v v="$variant" "$simnode_awk_median"'
        $1 == v { n++; s[n] = $2; p[n] = $3; e[n] = $4 }
        END { printf "%-9s %10.1f %10.1f %10.1f\n", v, median(s, n) / 1024, median(p, n) / 1024, median(e, n) / 1024 }' "$results"
done
