//go:build linux

package hostile

import (
	"fmt"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/stats"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// BenchmarkHotLookupsUnderAttack measures what a well-behaved Pod keeps of its hot lookups while a hostile
// Pod runs testAttack's mix (idle and slow-loris connections opened again as the cache closes them, held
// connections, the flood of odd queries). Each Pod is a process of its own in a namespace of its own, as on a
// node (podLookupsIn, startAttacker): the well-behaved one's workers ask the hot names back to back, as fast
// as the cache answers, for a window with no attack and a window under attack, in rounds that alternate
// which comes first, so that the machine's own drift falls on both alike. It reports the lookups' rate and
// p99 under attack as fractions of the same round's undisturbed figures, over the rounds (acrossOrders).
//
//	HOSTILE_ROUNDS=5 go test -run '^$' -bench HotLookupsUnderAttack -benchtime 1x ./test/hostile/
//
// HOSTILE_ATTACKS narrows the mix to some of idle, loris, held and flood (comma-separated), or names decoy:
// the flood aimed at a port nothing listens on in the hostile Pod's own namespace, which measures what the
// attacker's own work takes from the well-behaved Pod on a shared machine, the cache seeing none of it.
// HOSTILE_FLOOD (a regular expression) narrows the flood to the odd cases whose names it matches.
// HOSTILE_CACHE=unbound puts unbound where the cache serves (rig.startUnbound, with the cache's TCP bounds as
// far as unbound has them: rig.boundUnboundTCP), under every attack but loris: what the bar to beat keeps
// of the same Pod's lookups under the same attack. HOSTILE_OVER_TCP=N sends every
// Nth of the well-behaved Pod's lookups over TCP instead of every tenth (1: all of them, 0: none), to see
// what each transport costs the cache. Each round also logs where the CPU time of each window went (cpuUse).
//
// bench/hostile.sh runs it. It is a measurement, not a test: a shared machine's load moves both figures.
func BenchmarkHotLookupsUnderAttack(b *testing.B) {
	rounds := 3
	if v := os.Getenv("HOSTILE_ROUNDS"); v != "" {
		var err error
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			b.Fatalf("HOSTILE_ROUNDS=%q: want a positive number", v)
		}
	}
	attacks := []string{"idle", "loris", "held", "flood"}
	if v := os.Getenv("HOSTILE_ATTACKS"); v != "" {
		attacks = strings.Split(v, ",")
	}
	overTCP := tcpEvery
	if v := os.Getenv("HOSTILE_OVER_TCP"); v != "" {
		var err error
		if overTCP, err = strconv.Atoi(v); err != nil || overTCP < 0 {
			b.Fatalf("HOSTILE_OVER_TCP=%q: want how often a lookup goes over TCP (1 every lookup, %d every %dth, 0 none)", v, tcpEvery, tcpEvery)
		}
	}
	server := serveNodeCache
	if v := os.Getenv("HOSTILE_CACHE"); v != "" {
		server = v
	}
	if server == serveUnbound && slices.Contains(attacks, "loris") {
		// unbound does not close a connection that sends a byte within every tcp-idle-timeout (with the
		// timeout at 3 s, one sending a byte every 250 ms was open 12 s on, where one sending nothing was
		// closed at 3 s): the attacker, which waits for the cache to close them, fails.
		b.Fatal("HOSTILE_CACHE=unbound does not close slow-loris connections: leave loris out of HOSTILE_ATTACKS (idle,held,flood)")
	}
	if v := os.Getenv(floodEnv); v != "" {
		re, err := regexp.Compile(v)
		if err != nil {
			b.Fatalf("%s=%q: %v", floodEnv, v, err)
		}
		if len(floodSent(re)) == 0 {
			b.Fatalf("%s=%q matches no odd case's name", floodEnv, v)
		}
	}
	const (
		workers = 4
		window  = 3 * time.Second
		// pacedRate is the well-behaved Pod's pace in the paced windows: the lookups a busy node's Pods
		// make in all, as issue 28 puts it, far below what the cache answers at full speed.
		pacedRate = 2000
	)
	r := newRig(b, server)
	rest := r.atRest(b)
	b.ResetTimer()
	for range b.N {
		// ratios[name][0] are the rounds that measure undisturbed first, [1] those that measure the attack
		// first.
		ratios := map[string]*[2][]float64{}
		add := func(name string, order int, v float64) {
			if ratios[name] == nil {
				ratios[name] = new([2][]float64)
			}
			ratios[name][order] = append(ratios[name][order], v)
		}
		for round := range rounds {
			for _, pace := range []struct {
				name  string
				every time.Duration // between a worker's lookups; 0 is back to back
			}{
				{"back to back", 0},
				{fmt.Sprintf("at %d/s", pacedRate), workers * time.Second / pacedRate},
			} {
				var quiet, attacked podLookups
				var quietCPU, attackedCPU cpuUse
				spec := lookupsSpec{Workers: workers, Window: window, Every: pace.every, OverTCP: overTCP}
				measure := func(attack bool) {
					var a *simnode.Process
					if attack {
						attacker := r.startAttacker(b, attacks)
						defer func() {
							attacker.stop(b)
							r.restAgain(b, rest)
						}()
						a = attacker.p
						time.Sleep(time.Second) // the connections open, the flood is on
					}
					l, use := r.podLookupsIn(b, spec, a)
					if attack {
						attacked, attackedCPU = l, use
					} else {
						quiet, quietCPU = l, use
					}
				}
				first := round%2 == 1
				measure(first)
				measure(!first)
				r.alive(b)
				rate := func(l podLookups) float64 { return float64(l.answered) / l.elapsed.Seconds() }
				unit := strings.ReplaceAll(pace.name, " ", "-")
				order := round % 2 // first is set in the rounds that measure the attack first
				add("rate-"+unit, order, rate(attacked)/rate(quiet))
				add("p99-"+unit, order, float64(p99(attacked))/float64(p99(quiet)))
				b.Logf("round %d, %s: undisturbed %v; %v. Under attack %v; %v",
					round+1, pace.name, quiet, quietCPU, attacked, attackedCPU)
				if quiet.failed+attacked.failed > 0 {
					b.Errorf("round %d, %s: lookups failed: %s %s", round+1, pace.name, quiet.first, attacked.first)
				}
			}
		}
		for _, name := range slices.Sorted(maps.Keys(ratios)) {
			byOrder := ratios[name]
			if len(byOrder[1]) > 0 {
				b.Logf("%s under attack / undisturbed: median %.3f in the rounds that measure undisturbed first, %.3f in those that measure the attack first",
					name, stats.Median(byOrder[0]), stats.Median(byOrder[1]))
			}
			// How far the figure over these rounds may be from the one over many more: the spread from
			// round to round is larger than most changes to the cache move it.
			lo, hi := stats.Interval(byOrder[:], func(g [][]float64) float64 { return acrossOrders([2][]float64{g[0], g[1]}) }, 0.9, 2000)
			b.Logf("%s under attack / undisturbed: %.3f over %d rounds, 90 %% bootstrap interval %.3f to %.3f",
				name, acrossOrders(*byOrder), len(byOrder[0])+len(byOrder[1]), lo, hi)
			b.ReportMetric(acrossOrders(*byOrder), name+"-under-attack/undisturbed")
		}
	}
}

// restFigures are what the cache under test holds at rest, before the first window: its open file
// descriptors and, for node-cache, its goroutines (unbound has no metrics endpoint, and runs no goroutines).
type restFigures struct {
	fds        int
	goroutines float64
}

// atRest returns what the cache holds once settled (rig.settled).
func (r *rig) atRest(tb testing.TB) restFigures {
	tb.Helper()
	var at restFigures
	if !r.unbound {
		p, err := r.settled()
		if err != nil {
			tb.Fatal(err)
		}
		at.goroutines = p.goroutines
	}
	at.fds = r.openFDs(tb)
	return at
}

// openFDs counts the file descriptors the cache under test holds open (what its process_open_fds says).
func (r *rig) openFDs(tb testing.TB) int {
	tb.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", r.cache.Cmd.Process.Pid))
	if err != nil {
		tb.Fatalf("counting the cache's open file descriptors: %v", err)
	}
	return len(fds)
}

// restAgain waits until the cache is back at rest (at, read before the first window) after an attack: every
// connection of the attack closed, its held refusals reset (open file descriptors within a few of at's)
// and, for node-cache, its goroutines ended, so that no window starts while the cache still winds down the
// attack of the window before it (in rounds that start with the attack, the previous round's last window
// was under attack too). Its goroutines may stay above rest's by the ones each fast path keeps for the
// queries it hands to the plugin chain (16 idle at most, one fast path per address: wirecache's
// maxIdleServers), which the attack's queries to the cluster DNS, held for an answer, may have started. A
// cache that does not get back there within closeBound holds on to something the attack left, and the
// benchmark fails.
func (r *rig) restAgain(tb testing.TB, at restFigures) {
	tb.Helper()
	const keptIdle = 2 * 16
	var fds int
	var now process
	back := pollUntil(time.Now().Add(closeBound), 100*time.Millisecond, func() bool {
		fds = r.openFDs(tb)
		if !r.unbound {
			var err error
			if now, err = r.scrape(cacheMetrics); err != nil {
				tb.Fatal(err)
			}
		}
		return fds <= at.fds+8 && (r.unbound || now.goroutines <= at.goroutines+16+keptIdle)
	})
	if !back {
		tb.Fatalf("the cache is not back at rest %v after an attack: %d file descriptors open, %.0f goroutines; at rest %d, %.0f",
			closeBound, fds, now.goroutines, at.fds, at.goroutines)
	}
}

// cpuUse is CPU time used by what shares the machine in a window of the benchmark: the cache, the
// well-behaved Pod's process (its workers), the attacker (none in an undisturbed window), the cluster DNS's
// CoreDNS, this process (the relay in front of the cluster DNS, brokenUpstream), and the machine as a whole
// (every process and the kernel's own work, on all CPUs): how busy the machine was, and whose work that was.
// Back to back the workers wait for each answer, so the machine need not be saturated. cpuNow reads all
// but pod, which is the well-behaved Pod's own count (podLookupsIn).
type cpuUse struct {
	cache, pod, attacker, clusterDNS, self, machine time.Duration
	attacked                                        bool
}

// cpuNow reads the CPU time used so far; attacker is the attacker's process, nil when none runs.
func (r *rig) cpuNow(tb testing.TB, attacker *simnode.Process) cpuUse {
	tb.Helper()
	u := cpuUse{
		cache:      processCPU(tb, r.cache.Cmd.Process.Pid),
		clusterDNS: processCPU(tb, r.backend.Cmd.Process.Pid),
		self:       processCPU(tb, os.Getpid()),
		machine:    machineBusy(tb),
	}
	if attacker != nil {
		u.attacker, u.attacked = processCPU(tb, attacker.Cmd.Process.Pid), true
	}
	return u
}

// since returns the CPU time used between before and u.
func (u cpuUse) since(before cpuUse) cpuUse {
	return cpuUse{
		cache: u.cache - before.cache, pod: u.pod - before.pod, attacker: u.attacker - before.attacker,
		clusterDNS: u.clusterDNS - before.clusterDNS, self: u.self - before.self,
		machine: u.machine - before.machine, attacked: u.attacked,
	}
}

func (u cpuUse) String() string {
	ms := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	attacker := ""
	if u.attacked {
		attacker = fmt.Sprintf(", the attacker's %v", ms(u.attacker))
	}
	return fmt.Sprintf("the cache's CPU %v, the well-behaved Pod's %v%s, the cluster DNS's %v, the relay's %v, the machine's in all %v",
		ms(u.cache), ms(u.pod), attacker, ms(u.clusterDNS), ms(u.self), ms(u.machine))
}

// processCPU is the CPU time process pid has used so far (user and system, from /proc).
func processCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command's name, which is in parentheses and may hold spaces: utime and stime are
	// the 12th and 13th of them, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("reading the CPU time of process %d from %q", pid, stat)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// machineBusy is the CPU time all CPUs have spent so far other than idle or waiting for I/O: the first line
// of /proc/stat, whose fields after "cpu" are user, nice, system, idle, iowait, irq, softirq and steal, in
// clock ticks (guest time is counted in user already).
func machineBusy(tb testing.TB) time.Duration {
	tb.Helper()
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatal(err)
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		tb.Fatalf("reading the machine's CPU time from /proc/stat: %q", line)
	}
	var busy int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			tb.Fatalf("reading the machine's CPU time from /proc/stat: %q", line)
		}
		busy += n
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

func p99(l podLookups) time.Duration {
	if len(l.latencies) == 0 {
		return 0
	}
	lat := slices.Sorted(slices.Values(l.latencies))
	return lat[len(lat)*99/100]
}

// acrossOrders is the figure over the rounds of both orders: the geometric mean of the median of the rounds
// that measure undisturbed first and that of the rounds that measure the attack first, or the one median
// there is. Whichever window of a round comes second tends to be the faster (on the 2-core build machine,
// back to back, 3 % to 4 % more lookups a second, the undisturbed window and the attacked one alike), so
// the rate kept comes out higher in the rounds that measure undisturbed first than in the others (medians
// 0.93 against 0.87 over 34 rounds); a median over all the rounds would lean to the order that had more of
// them, the first, in an odd number of rounds.
func acrossOrders(byOrder [2][]float64) float64 {
	if len(byOrder[1]) == 0 {
		return stats.Median(byOrder[0])
	}
	return math.Sqrt(stats.Median(byOrder[0]) * stats.Median(byOrder[1]))
}
