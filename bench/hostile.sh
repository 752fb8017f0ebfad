#!/usr/bin/env bash
# What a well-behaved Pod keeps of its hot lookups while a hostile Pod attacks the node cache: the hostile
# tier's BenchmarkHotLookupsUnderAttack (test/hostile), on a simulated node with the shipped configuration.
#
#   bench/hostile.sh               # 3 rounds
#   ROUNDS=5 bench/hostile.sh
#   ATTACKS=flood bench/hostile.sh # one part of the attack only: idle, loris, held, flood (comma-separated)
#   ATTACKS=flood FLOOD='^class ' bench/hostile.sh
#                                  # the flood of only the odd cases (test/hostile/cases_test.go) whose names
#                                  # the regular expression matches
#   ATTACKS=decoy bench/hostile.sh # the flood aimed at a port nothing listens on in the attacker's own
#                                  # namespace: what the attacker's own work takes from the well-behaved Pod
#                                  # on the shared machine, with nothing for the cache to do
#   CACHE=unbound ATTACKS=idle,held,flood bench/hostile.sh
#                                  # the control: unbound (Debian's) where the cache serves, on the same
#                                  # link, addresses and NOTRACK rules, configured as bench/cpu.sh configures
#                                  # it, with the cache's bound on TCP connections in all (1,024) and CoreDNS's
#                                  # 3 s read timeout; every attack but loris, since unbound does not close a
#                                  # connection that sends a byte within each idle timeout
#   OVER_TCP=1 ATTACKS=decoy bench/hostile.sh
#                                  # every lookup of the well-behaved Pod over TCP (0: none; default 10,
#                                  # every tenth): what each transport costs the cache, in the undisturbed
#                                  # windows
#
# Each Pod is a process of its own in a Pod network namespace of its own (the test binary run again, in the
# namespaces simnode.Node adds), as on a node: the attacker's goroutines, garbage collector, sockets and
# ports are not the well-behaved Pod's, and neither shares the benchmark's process, which holds the relay in
# front of the cluster DNS. The attacker runs Go with one P (GOMAXPROCS=1, as node-cache does) whatever the
# environment gives the cache, so that its runtime's hand-offs between threads do not take the shared cores.
# Each round measures the well-behaved Pod (4 workers asking the hot names, every tenth lookup over TCP)
# twice: back to back, as fast as the cache answers, and paced at 2,000 lookups a second (what a busy node's
# Pods ask in all); each for 3 s with no attack and for 3 s under the attack (idle
# and slow-loris connections opened again as the cache closes them, held connections, a flood of odd queries
# at 1,000/s), alternating which comes first. It prints each round, with the lookups over TCP apart and where
# each window's CPU time went (the cache, the well-behaved Pod, the attacker, the cluster DNS, the relay, and
# the machine in all), and the rate and the p99 under attack as fractions of the undisturbed figures over the
# rounds (rate-...-under-attack/undisturbed, p99-...-under-attack/undisturbed: the geometric mean of the
# medians of the rounds of each order, since the window that comes second is the faster; both medians are
# logged, and a 90 % bootstrap interval of the figure over the rounds: rounds differ by more than most
# changes to the cache move it).
# The cache's listeners defer accepting connections that send nothing (NODECACHE_TCP_DEFER_ACCEPT, which the
# cache takes from this environment; =0 measures without). The Pods, the cluster DNS and the cache share the
# machine: back to back, each worker waits for its answer before it asks again, so the rate is bound by the
# lookups' round trips and the well-behaved Pod's own CPU (on the 2-core build machine, busy about 4.6 of
# each window's 6 s of CPU, with the attack or without, 3.7 s of it the well-behaved Pod's), and the rate
# kept is how much the attack slows them; paced, it is whether the Pod's lookups still get done, and how fast.
#
# On a machine shared with other work, run it at a higher priority than that work (its processes inherit
# it, so the cache, the workers and the attacker stay equal): nice -n -15 bench/hostile.sh
#
# Needs root, go, ip, iptables, nft, conntrack, sysctl (and unbound for CACHE=unbound). Every address exists
# only in namespaces the benchmark creates and removes; it kills only the processes it started.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
ATTACKS=${ATTACKS:-idle,loris,held,flood}
CACHE=${CACHE:-node-cache}
OVER_TCP=${OVER_TCP:-10}
FLOOD=${FLOOD:-}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "hostile bench: ROUNDS must be a positive integer" >&2; exit 1; }
cd "$(dirname "$0")/.."
HOSTILE_ROUNDS=$ROUNDS HOSTILE_ATTACKS=$ATTACKS HOSTILE_FLOOD=$FLOOD HOSTILE_CACHE=$CACHE HOSTILE_OVER_TCP=$OVER_TCP NODELOCALDNS_REQUIRE_PRIVILEGED=1 \
    go test -count=1 -run '^$' -bench '^BenchmarkHotLookupsUnderAttack$' -benchtime 1x -v ./test/hostile/
