#!/usr/bin/env bash
# Figures of a node cache on a simulated node, drawn with gnuplot: CPU time per query against the query rate,
# from idle to full speed, and resident memory over a run, for the node-cache build as the manifests run it,
# the same build with upstream node-cache's Corefile, and unbound.
#
#   NICE=-10 bench/plot.sh                           # 3 rounds, into bench/figures/
#   ROUNDS=2 DURATION=5 OUT=/tmp/figures bench/plot.sh
#   PLOT_ONLY=1 bench/plot.sh                        # draws the images again from the TSV files in OUT
#
# The simulated node, the variants (shipped, upstream, unbound), the query mix (HOT_PERCENT % of queries for
# HOT names answered before, the rest new names, half of them NXDOMAIN), the CPUs (the cache alone on
# SERVER_CPU, dnsperf and the cluster DNS on CLIENT_CPU) and NICE are bench/cpu.sh's; CPU time is that of all
# the cache's threads (schedstat), as there.
#
# The sweep: in each of ROUNDS rounds every variant, in an order that rotates, starts afresh, gets every hot
# name once, and then:
#   idle     no query for SETTLE s, then IDLE s measured: CPU ms per second
#   RATE     for each of RATES (q/s): DURATION s of the mix at that rate (names no earlier phase asked): CPU µs
#            per query, and CPU ms per second (µs/query times the q/s dnsperf achieved)
#   full     DURATION s of the mix at full speed: q/s, CPU µs per query
# sweep-rounds.tsv has every round's figures, sweep.tsv their medians over the rounds in which dnsperf
# reached at least 90 % of the rate offered (on a loaded machine a client that falls behind sends in bursts,
# which a cache likely answers for less CPU per query: such a round did not measure that rate), over all rounds
# where none did, with the rounds used (0 then) and failed (queries lost or answered other than NOERROR and
# NXDOMAIN, summed over all rounds); cpu-per-query.png draws µs/query against the rate
# offered (log x axis), full speed last, one line per variant with its idle CPU in the key; a point where
# dnsperf reached less than 90 % of the rate offered (the machine's load, or the cache's), and the full-speed
# one, is hollow and says the q/s reached.
#
# Memory: after the rounds, one run per variant, its VmRSS sampled every SAMPLE s from its start: START s
# after the start, NAMES distinct names (svcN.nsM, A) at NAMES_RATE q/s; 2 s later, DURATION s of the mix at
# full speed; then 2 s more. rss.tsv has the samples (seconds since the start, MiB), rss-phases.tsv when
# each phase began and ended, rss.png draws RSS over time with one line per variant, its phases in the key and
# dashed lines in its colour where its mix began and ended.
#
# Every TSV begins with comment lines (#) saying when, with which settings and at what load average (at the
# start and at the end) it was measured. dnsperf must answer every phase; lost queries and other answers are
# counted in failed, not fatal. NODE_CACHE=PATH measures that build; NODE_CACHE_ALT=PATH adds the variant
# "alt". KEEP=1 keeps the logs. Needs root, iproute2, iptables, dnsperf, unbound and gnuplot (Debian's
# gnuplot-nox; installed with apt-get when missing), go, taskset, 2 CPUs. Kills only the processes it
# started; removes its namespaces, links and files at exit.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
RATES=${RATES:-200 500 1000 2000 5000 10000}
IDLE=${IDLE:-10}
SETTLE=${SETTLE:-3}
HOT=${HOT:-1000}
HOT_PERCENT=${HOT_PERCENT:-90}
MAX_QPS=${MAX_QPS:-300000} # sizes the full-speed query file: no new name repeats below this rate
NAMES=${NAMES:-10000}
NAMES_RATE=${NAMES_RATE:-2000}
START=${START:-3}
SAMPLE=${SAMPLE:-0.5}
VARIANTS=${VARIANTS:-shipped upstream unbound}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
NICE=${NICE:-0}
OUT=${OUT:-bench/figures}

cd "$(dirname "$0")/.."
# shellcheck source=bench/simnode.sh
. bench/simnode.sh

die() { echo "plot bench: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, apt-get)"

# summarize: sweep.tsv from sweep-rounds.tsv in OUT: per variant and phase, in the order measured, the
# medians over the rounds in which dnsperf reached at least 90 % of the rate offered (all rounds where none
# did; rounds says how many), failed summed over all rounds.
summarize() {
    local rounds=$OUT/sweep-rounds.tsv
    [ -s "$rounds" ] || die "no sweep-rounds.tsv in $OUT"
    {
        grep '^#' "$rounds"
        echo "# medians over the rounds (of those in sweep-rounds.tsv) in which dnsperf reached at least 90 % of the rate offered, or over all where none did; failed is summed over all rounds"
        printf 'variant\tphase\ttarget_qps\tqps\tus_per_query\tcpu_ms_per_s\trounds\tfailed\n'
        awk -F '\t' "$simnode_awk_median"'
            /^#/ || $1 == "round" { next }
            !(($2, $3) in seen) { seen[$2, $3] = 1; order[++k] = $2 SUBSEP $3 }
            { key = $2 SUBSEP $3; t[key] = $4; all[key]++; f[key] += $8
              ok = $3 == "idle" || $3 == "full" || $5 >= 0.9 * $4
              i = ++n[key, ok]; q[key, ok, i] = $5; u[key, ok, i] = $6; m[key, ok, i] = $7 }
            END {
                for (j = 1; j <= k; j++) {
                    key = order[j]; split(key, vp, SUBSEP); ok = n[key, 1] > 0
                    c = n[key, ok]
                    for (i = 1; i <= c; i++) a[i] = q[key, ok, i]; mq = median(a, c)
                    for (i = 1; i <= c; i++) a[i] = u[key, ok, i]; mu = vp[2] == "idle" ? "-" : sprintf("%.1f", median(a, c))
                    for (i = 1; i <= c; i++) a[i] = m[key, ok, i]; mm = median(a, c)
                    printf "%s\t%s\t%s\t%.0f\t%s\t%.3f\t%d\t%d\n", vp[1], vp[2], t[key], mq, mu, mm, ok ? c : 0, f[key]
                }
            }' "$rounds"
    } >"$OUT/sweep.tsv"
}

# draw: the images from the TSV files in OUT.
draw() {
    local sweep=$OUT/sweep.tsv rss=$OUT/rss.tsv phases=$OUT/rss-phases.tsv variant plots=() idle about i rates tics fullx
    [ -s "$sweep" ] && [ -s "$rss" ] && [ -s "$phases" ] || die "no sweep.tsv, rss.tsv and rss-phases.tsv in $OUT"
    about=$(sed -n 's/^# load: //p' "$sweep" | head -1)
    # x: the rate offered, full speed a place of its own to the right; a point where dnsperf reached less than
    # 90 % of the rate offered is hollow, and it and the full-speed point say the q/s reached.
    rates=$(awk '!/^#/ && $1 != "variant" && $2 != "idle" && $2 != "full" { print $3 }' "$sweep" | sort -nu)
    fullx=$(($(tail -1 <<<"$rates") * 3))
    tics=$(for r in $rates; do printf '"%s" %s, ' "$r" "$r"; done)
    i=0
    for variant in $(awk '!/^#/ && $1 != "variant" { print $1 }' "$sweep" | uniq); do
        i=$((i + 1))
        idle=$(awk -v v="$variant" '$1 == v && $2 == "idle" { print $6 }' "$sweep")
        local x="(strcol(1) eq '$variant' && strcol(2) ne 'idle' ? (strcol(2) eq 'full' ? $fullx : \$3) : NaN)"
        local short="(strcol(2) eq 'full' || \$4 < 0.9 * \$3)"
        plots+=("'$sweep' using $x:5 with lines lw 2 lc $i title '$variant (idle: $idle ms of CPU per s)'"
            "'' using $x:($short ? NaN : \$5) with points pt 7 ps 1.2 lc $i notitle"
            "'' using $x:($short ? \$5 : NaN) with points pt 6 ps 1.6 lw 2 lc $i notitle"
            "'' using $x:($short ? \$5 : NaN):(sprintf('%d q/s', \$4)) with labels offset char 0,$([ "$i" -eq 3 ] && echo -1.2 || echo 1.1) font ',9' tc lt $i notitle")
    done
    {
        echo "set encoding utf8"
        echo "set terminal pngcairo enhanced size 960,600 font 'sans,11'"
        echo "set output '$OUT/cpu-per-query.png'"
        echo "set datafile separator '\t'"
        echo "set title \"CPU time per query of the mix ($HOT_PERCENT % hot names, the rest new), by the rate offered\\n{/*0.8 $about}\""
        echo "set logscale x"
        echo "set xrange [$(($(head -1 <<<"$rates") / 2)):$((fullx * 2))]"
        echo "set xtics (${tics}\"full speed\" $fullx)"
        echo "set xlabel \"queries per second offered\\n{/*0.8 hollow, with the q/s reached: full speed, or dnsperf reached less than 90 % of the rate offered}\""
        echo "set ylabel 'CPU µs per query'"
        echo "set yrange [0:*]"
        echo "set grid"
        echo "set key top right"
        echo "plot $(IFS=,; echo "${plots[*]}")"
    } | gnuplot || die "gnuplot could not draw $OUT/cpu-per-query.png"

    # RSS: each variant's phases in its key, and dashed lines in its colour where its mix began and ended.
    plots=()
    i=0
    local arrows=()
    for variant in $(awk '!/^#/ && $1 != "variant" { print $1 }' "$rss" | uniq); do
        i=$((i + 1))
        local when
        when=$(awk -F '\t' -v v="$variant" '$1 == v { printf "%s%s %.0f-%.0f s", n++ ? ", " : "", $2, $3, $4 }' "$phases")
        plots+=("'$rss' using (strcol(1) eq '$variant' ? \$2 : NaN):3 with lines lw 2 lc $i title '$variant ($when)'")
        while read -r a b; do
            arrows+=("set arrow from $a, graph 0 to $a, graph 1 nohead dt 2 lc $i" "set arrow from $b, graph 0 to $b, graph 1 nohead dt 2 lc $i")
        done < <(awk -F '\t' -v v="$variant" '$1 == v && $2 == "mix" { print $3, $4 }' "$phases")
    done
    {
        echo "set encoding utf8"
        echo "set terminal pngcairo enhanced size 960,600 font 'sans,11'"
        echo "set output '$OUT/rss.png'"
        echo "set datafile separator '\t'"
        echo "set title \"Resident memory over one run: $(awk -F '\t' '$2 == "names" { print $5; exit }' "$phases"), then the mix at full speed (between the dashed lines)\\n{/*0.8 $about}\""
        echo "set xlabel 'seconds since the start'"
        echo "set ylabel 'RSS, MiB'"
        echo "set yrange [0:*]"
        echo "set grid"
        echo "set key bottom right"
        printf '%s\n' "${arrows[@]}"
        echo "plot $(IFS=,; echo "${plots[*]}")"
    } | gnuplot || die "gnuplot could not draw $OUT/rss.png"
    echo "drew $OUT/cpu-per-query.png and $OUT/rss.png"
}

if [ -n "${PLOT_ONLY:-}" ]; then
    simnode_require_tools gnuplot
    summarize
    draw
    exit 0
fi

simnode_positive ROUNDS DURATION IDLE SETTLE HOT MAX_QPS NAMES NAMES_RATE START
simnode_rates RATES
[[ $SAMPLE =~ ^[0-9]*\.?[0-9]+$ ]] || die "SAMPLE must be a number of seconds"
simnode_server_settings
[ "$HOT" -le "$NAMES" ] || die "HOT must not exceed NAMES"
simnode_require_tools go ip iptables iptables-restore dnsperf unbound taskset gnuplot
mkdir -p "$OUT"

work=$(mktemp -d /tmp/plot-bench.XXXXXX)
pids=()
trap simnode_cleanup EXIT

load() { uptime | sed 's/.*load average: */load average /'; }
load_start=$(load)

simnode_up "nlplot$$"
simnode_node_cache
# The cluster DNS above dnsperf on their shared CPU, as in bench/cpu.sh.
simnode_cluster_dns "$((NICE - 5 < -20 ? -20 : NICE - 5))" taskset -c "$CLIENT_CPU"
simnode_corefiles
simnode_unbound_conf

# Query files (simnode_mix), each rate's new names a range of their own.
hot_file=$work/queries.hot
simnode_hot "$hot_file"
first=1000000
for rate in $RATES; do
    simnode_mix "$work/queries.$rate" $((rate * DURATION)) "$first" "$HOT_PERCENT"
    first=$((first + 1000000))
done
full=$((MAX_QPS * DURATION))
simnode_mix "$work/queries.full" "$full" 100000000 "$HOT_PERCENT"
seq 1 "$NAMES" | awk '{ printf "svc%d.ns%d.svc.cluster.local A\n", $1, $1 % 97 }' >"$work/queries.names"

results=$work/results
: >"$results"
echo
echo "nice $NICE; $load_start on $(nproc) CPUs"
echo "$ROUNDS rounds of: idle ($SETTLE s, then $IDLE s measured), the mix ($HOT_PERCENT % hot) for $DURATION s at each of"
echo "$RATES q/s, then at full speed"
printf '%-5s %-9s %-6s %9s %8s %8s %6s\n' round variant phase "q/s" "µs/q" "ms/s" failed
read -r -a variants <<<"$VARIANTS"
for round in $(seq 1 "$ROUNDS"); do
    n=${#variants[@]}
    for i in $(seq 0 $((n - 1))); do
        variant=${variants[$(((i + round - 1) % n))]}
        simnode_start "$variant" nice -n "$NICE" taskset -c "$SERVER_CPU"
        simnode_ready "$variant" svc1.ready.svc.cluster.local
        tolerate_failures=1 simnode_dnsperf "$hot_file" -Q 5000
        sleep "$SETTLE"
        c0=$(simnode_cpu_ns "$cache_pid")
        sleep "$IDLE"
        ms=$(awk -v c="$(($(simnode_cpu_ns "$cache_pid") - c0))" -v t="$IDLE" 'BEGIN { printf "%.3f", c / 1e6 / t }')
        rows=("$round $variant idle 0 0 - $ms 0")
        for rate in $RATES full; do
            if [ "$rate" = full ]; then
                tolerate_failures=1 simnode_dnsperf "$work/queries.full" -l "$DURATION"
                [ "$completed" -lt "$full" ] || die "$variant: the full-speed run used up its query file; raise MAX_QPS"
            else
                tolerate_failures=1 simnode_dnsperf "$work/queries.$rate" -Q "$rate"
            fi
            ms=$(awk -v u="$us_per_query" -v q="$qps" 'BEGIN { printf "%.3f", u * q / 1e3 }')
            rows+=("$round $variant $rate $( [ "$rate" = full ] && echo 0 || echo "$rate") $qps $us_per_query $ms $failed")
        done
        simnode_stop "$variant"
        for row in "${rows[@]}"; do
            read -r r v p _ q u m f <<<"$row"
            printf '%-5s %-9s %-6s %9s %8s %8s %6s\n' "$r" "$v" "$p" "$q" "$u" "$m" "$f"
            echo "$row" >>"$results"
        done
    done
done

# The memory runs. sample PID FILE: VmRSS of PID every SAMPLE s (seconds since t0, MiB) while it runs.
now() { date +%s.%N; }
since() { awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
sleep_until() { sleep "$(awk -v a="$t0" -v b="$(now)" -v t="$1" 'BEGIN { d = a + t - b; printf "%.2f", (d > 0 ? d : 0) }')"; }
sample() {
    local kib
    while kib=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$1/status" 2>/dev/null) && [ -n "$kib" ]; do
        printf '%s\t%s\t%s\n' "$variant" "$(since)" "$(awk -v k="$kib" 'BEGIN { printf "%.1f", k / 1024 }')"
        sleep "$SAMPLE"
    done >>"$2"
}
rss=$work/rss phases=$work/phases
: >"$rss"
: >"$phases"
names_s=$((NAMES / NAMES_RATE))
echo
echo "memory: $NAMES names at $NAMES_RATE q/s from $START s, then $DURATION s of the mix at full speed; VmRSS every $SAMPLE s"
printf '%-9s %9s %9s %9s %9s %6s\n' variant "start MiB" "names MiB" "peak MiB" "mix q/s" failed
for variant in "${variants[@]}"; do
    simnode_start "$variant" nice -n "$NICE" taskset -c "$SERVER_CPU"
    t0=$(now)
    sample "$cache_pid" "$rss" &
    sampler=$!
    pids+=("$sampler")
    simnode_ready "$variant" svc1.ready.svc.cluster.local
    sleep_until "$START"
    start_mib=$(awk '$1 == "VmRSS:" { printf "%.1f", $2 / 1024 }' "/proc/$cache_pid/status")
    a=$(since)
    tolerate_failures=1 simnode_dnsperf "$work/queries.names" -Q "$NAMES_RATE"
    b=$(since) names_failed=$failed
    names_mib=$(awk '$1 == "VmRSS:" { printf "%.1f", $2 / 1024 }' "/proc/$cache_pid/status")
    printf '%s\t%s\t%s\t%s\n' "$variant" names "$a" "$b" >>"$phases"
    sleep_until $((START + names_s + 2))
    a=$(since)
    tolerate_failures=1 simnode_dnsperf "$work/queries.full" -l "$DURATION"
    b=$(since)
    [ "$completed" -lt "$full" ] || die "$variant: the full-speed run used up its query file; raise MAX_QPS"
    printf '%s\t%s\t%s\t%s\n' "$variant" mix "$a" "$b" >>"$phases"
    peak_mib=$(awk '$1 == "VmHWM:" { printf "%.1f", $2 / 1024 }' "/proc/$cache_pid/status")
    sleep 2
    simnode_stop "$variant"
    wait "$sampler" 2>/dev/null || true
    printf '%-9s %9s %9s %9s %9s %6s\n' "$variant" "$start_mib" "$names_mib" "$peak_mib" "$qps" $((names_failed + failed))
done
load_end=$(load)

# The TSV files, each headed by what was measured.
header() {
    echo "# bench/plot.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs; ROUNDS=$ROUNDS DURATION=$DURATION IDLE=$IDLE RATES=\"$RATES\" HOT=$HOT HOT_PERCENT=$HOT_PERCENT NAMES=$NAMES NAMES_RATE=$NAMES_RATE NICE=$NICE"
    echo "# load: $load_start at the start, $load_end at the end; nice $NICE"
}
{
    header
    printf 'round\tvariant\tphase\ttarget_qps\tqps\tus_per_query\tcpu_ms_per_s\tfailed\n'
    tr ' ' '\t' <"$results"
} >"$OUT/sweep-rounds.tsv"
{
    header
    printf 'variant\tseconds\trss_mib\n'
    cat "$rss"
} >"$OUT/rss.tsv"
{
    header
    printf 'variant\tphase\tstart_s\tend_s\tlabel\n'
    awk -F '\t' -v names="$NAMES" -v rate="$NAMES_RATE" 'BEGIN { OFS = "\t" }
        { print $1, $2, $3, $4, $2 == "names" ? names " names at " rate " q/s" : "the mix at full speed" }' "$phases"
} >"$OUT/rss-phases.tsv"

echo
summarize
echo "medians over the rounds that reached at least 90 % of the rate offered ($OUT/sweep.tsv):"
column -t -s "$(printf '\t')" < <(grep -v '^#' "$OUT/sweep.tsv")
draw
