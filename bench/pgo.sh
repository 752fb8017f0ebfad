#!/usr/bin/env bash
# The CPU profile Go's compiler optimises node-cache with: cmd/node-cache/default.pgo, which `go build` of
# cmd/node-cache (the Dockerfile's, the tests', `make build`) uses by default (profile-guided optimisation:
# the hot calls it names are inlined, and a hot call through an interface calls the type the profile saw most
# there directly, behind a check of the type: `go build -gcflags=all=-m=1` says "PGO devirtualizing" for each).
# This script records it where the cache runs: on bench/simnode.sh's simulated node, the build and Corefile as
# examples/kubernetes/nodelocaldns-iptables.yaml starts them (with CoreDNS's pprof plugin added to serve the
# profile), over the work a node gives it.
#
#   bench/pgo.sh                              # writes cmd/node-cache/default.pgo
#   OUT=/tmp/node-cache.pgo DURATION=20 bench/pgo.sh
#
# One profile (CoreDNS's /debug/pprof/profile) over four phases of DURATION s each, after every hot name was
# asked once: hot names at full speed, the mix (HOT_PERCENT % hot names, the rest new names, half NXDOMAIN) at
# full speed, new names only at full speed (misses over TCP to the cluster DNS), and new names at MISS_RATE q/s
# (each miss finds the cache idle). The full-speed phases give most of the samples; which calls are hot is the
# same at every rate. The build profiled is the one the Dockerfile makes from this tree, with the default.pgo
# there is: profiling a build optimised with an earlier profile is what Go's documentation recommends.
#
# NODE_CACHE=PATH profiles that build instead of building cmd/node-cache as its Dockerfile does.
#
# Needs root (network namespaces), iproute2, iptables, dnsperf, curl, go, taskset, 2 CPUs. Kills only the
# processes it started; removes its namespaces, links and files at exit.
set -euo pipefail

DURATION=${DURATION:-10}
HOT=${HOT:-1000}
HOT_PERCENT=${HOT_PERCENT:-90}
MISS_RATE=${MISS_RATE:-2000}
MAX_QPS=${MAX_QPS:-300000} # sizes the full-speed query files: no new name repeats below this rate
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
NICE=${NICE:-0}
PPROF_PORT=6060

cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/cmd/node-cache/default.pgo}
# shellcheck source=bench/simnode.sh
. bench/simnode.sh

die() { echo "pgo bench: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
simnode_positive DURATION HOT MISS_RATE MAX_QPS
simnode_server_settings
simnode_require_tools go ip iptables iptables-restore dnsperf curl taskset

work=$(mktemp -d /tmp/pgo-bench.XXXXXX)
pids=()
trap simnode_cleanup EXIT

simnode_up "nlpgo$$"
unset NODE_CACHE_ALT
simnode_node_cache
simnode_cluster_dns "$((NICE - 5 < -20 ? -20 : NICE - 5))" taskset -c "$CLIENT_CPU"
simnode_corefiles
# pprof in the first server block, on the node's address facing the Pod (only inside these namespaces).
sed -i "0,/^    errors$/s//    errors\n    pprof $NODE_POD_IP:$PPROF_PORT/" "$work/Corefile.base.shipped"
grep -q "pprof $NODE_POD_IP:$PPROF_PORT" "$work/Corefile.base.shipped" || die "could not add pprof to the shipped Corefile"

hot_file=$work/queries.hot
simnode_hot "$hot_file"
full=$((MAX_QPS * DURATION))
simnode_mix "$work/queries.mixed" "$full" 1000000 "$HOT_PERCENT"
simnode_mix "$work/queries.loaded" "$full" 300000000 0
simnode_mix "$work/queries.misses" $((MISS_RATE * DURATION)) 200000000 0

variant=shipped
simnode_start shipped nice -n "$NICE" taskset -c "$SERVER_CPU"
simnode_ready shipped svc1.ready.svc.cluster.local
simnode_dnsperf "$hot_file" -Q 5000

profile=$work/cpu.pprof
seconds=$((4 * DURATION + 2))
in_ns "$ns_node" curl -sf -o "$profile" "http://$NODE_POD_IP:$PPROF_PORT/debug/pprof/profile?seconds=$seconds" &
curl_pid=$!
pids+=("$curl_pid")
sleep 1
simnode_dnsperf "$hot_file" -n 1000000 -l "$DURATION"
echo "hits: $qps q/s, $us_per_query µs/query"
tolerate_failures=1 simnode_dnsperf "$work/queries.mixed" -l "$DURATION"
echo "mix: $qps q/s, $us_per_query µs/query ($failed failed)"
tolerate_failures=1 simnode_dnsperf "$work/queries.loaded" -l "$DURATION"
echo "misses at full speed: $qps q/s, $us_per_query µs/miss ($failed failed)"
tolerate_failures=1 simnode_dnsperf "$work/queries.misses" -Q "$MISS_RATE"
echo "misses at $MISS_RATE q/s: $us_per_query µs/miss ($failed failed)"
wait "$curl_pid" || die "no profile from the cache's pprof endpoint; see $work/shipped/log"
simnode_stop shipped

# A profile the compiler can use names functions; check before replacing the one there is.
top=$(go tool pprof -top "$profile" 2>&1) || die "the profile does not parse: $top"
grep -q 'plugin/wirecache' <<<"$top" || die "the profile saw no wirecache function"
cp "$profile" "$OUT"
echo "wrote $OUT ($(stat -c %s "$OUT") bytes)"
