#!/usr/bin/env bash
# What a well-behaved Pod keeps of its hot lookups while a hostile Pod attacks the node cache: the hostile
# tier's BenchmarkHotLookupsUnderAttack (test/hostile), on a simulated node with the shipped configuration.
#
#   bench/hostile.sh               # 3 rounds
#   ROUNDS=5 bench/hostile.sh
#   ATTACKS=flood bench/hostile.sh # one part of the attack only: idle, loris, held, flood (comma-separated)
#
# Each round measures 4 workers asking the hot names back to back for 3 s with no attack and for 3 s under
# the attack (idle and slow-loris connections opened again as the cache closes them, held connections, a
# flood of odd queries at 1,000/s), alternating which comes first. It prints each round, with the CPU time
# the cache used in each window, and the medians of the rate and the p99 under attack as fractions of the
# undisturbed figures (rate-under-attack/undisturbed, p99-under-attack/undisturbed). The workers, the attack and the cache share the machine: on 2 cores the
# attacker's own CPU is part of what the figures show.
#
# Needs root, go, ip, iptables, nft, conntrack, sysctl. Every address exists only in namespaces the
# benchmark creates and removes; it kills only the processes it started.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
ATTACKS=${ATTACKS:-idle,loris,held,flood}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "hostile bench: ROUNDS must be a positive integer" >&2; exit 1; }
cd "$(dirname "$0")/.."
HOSTILE_ROUNDS=$ROUNDS HOSTILE_ATTACKS=$ATTACKS NODELOCALDNS_REQUIRE_PRIVILEGED=1 \
    go test -count=1 -run '^$' -bench '^BenchmarkHotLookupsUnderAttack$' -benchtime 1x -v ./test/hostile/
