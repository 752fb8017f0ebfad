//go:build linux

package hostile

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkHotLookupsUnderAttack measures what a well-behaved Pod keeps of its hot lookups while a hostile
// Pod runs testAttack's mix (idle and slow-loris connections opened again as the cache closes them, held
// connections, the flood of odd queries): workers ask the hot names back to back, as fast as the cache
// answers, for a window with no attack and a window under attack, in rounds that alternate which comes
// first, so that the machine's own drift falls on both alike. It reports the medians over the rounds of
// the lookups' rate and p99 under attack, as fractions of the same round's undisturbed figures.
//
//	HOSTILE_ROUNDS=5 go test -run '^$' -bench HotLookupsUnderAttack -benchtime 1x ./test/hostile/
//
// HOSTILE_ATTACKS narrows the mix to some of idle, loris, held and flood (comma-separated). Each round also
// logs the CPU time the cache used in each window.
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
	const (
		workers = 4
		window  = 3 * time.Second
	)
	r := newRig(b)
	b.ResetTimer()
	for range b.N {
		var rateRatios, p99Ratios []float64
		for round := range rounds {
			var quiet, attacked podLookups
			var quietCPU, attackedCPU time.Duration
			measure := func(attack bool) {
				if !attack {
					cpu := r.cacheCPU(b)
					quiet = r.closedLoop(b, workers, window)
					quietCPU = r.cacheCPU(b) - cpu
					return
				}
				stop := make(chan struct{})
				done := r.attackUntil(stop, attacks)
				time.Sleep(time.Second) // the connections open, the flood is on
				cpu := r.cacheCPU(b)
				attacked = r.closedLoop(b, workers, window)
				attackedCPU = r.cacheCPU(b) - cpu
				close(stop)
				<-done
			}
			first := round%2 == 1
			measure(first)
			measure(!first)
			r.alive(b)
			rate := func(l podLookups) float64 { return float64(l.answered) / l.elapsed.Seconds() }
			rateRatios = append(rateRatios, rate(attacked)/rate(quiet))
			p99Ratios = append(p99Ratios, float64(p99(attacked))/float64(p99(quiet)))
			b.Logf("round %d: undisturbed %v, the cache's CPU %v; under attack %v, the cache's CPU %v", round+1,
				quiet, quietCPU.Round(time.Millisecond), attacked, attackedCPU.Round(time.Millisecond))
			if quiet.failed+attacked.failed > 0 {
				b.Errorf("round %d: lookups failed: %s %s", round+1, quiet.first, attacked.first)
			}
		}
		b.ReportMetric(median(rateRatios), "rate-under-attack/undisturbed")
		b.ReportMetric(median(p99Ratios), "p99-under-attack/undisturbed")
	}
}

// closedLoop runs workers well-behaved Pods asking back to back for d, and returns their lookups together.
func (r *rig) closedLoop(tb testing.TB, workers int, d time.Duration) podLookups {
	var mu sync.Mutex
	var all podLookups
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			var mine podLookups
			err := r.n.Do(r.n.PodNS, func() error {
				for i := w * 1000; time.Since(start) < d; i++ {
					problem, took, retried := lookupHot(i)
					if retried {
						mine.retried++
					}
					if problem != "" {
						mine.failed++
						if mine.first == "" {
							mine.first = problem
						}
						continue
					}
					mine.answered++
					mine.latencies = append(mine.latencies, took)
				}
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				tb.Error(err)
			}
			all.answered += mine.answered
			all.failed += mine.failed
			all.retried += mine.retried
			all.latencies = append(all.latencies, mine.latencies...)
			if all.first == "" {
				all.first = mine.first
			}
		})
	}
	wg.Wait()
	all.elapsed = time.Since(start)
	return all
}

// attackUntil runs testAttack's mix, the attacks named (idle, loris, held, flood), until stop is closed: the
// idle and slow-loris connections are opened again each time the cache has closed them, the held
// connections and the flood repeat. done is closed once everything it opened is closed.
func (r *rig) attackUntil(stop <-chan struct{}, attacks []string) (done <-chan struct{}) {
	finished := make(chan struct{})
	var wg sync.WaitGroup
	repeat := func(fn func() error) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := fn(); err != nil {
					fmt.Fprintf(os.Stderr, "attack: %v\n", err)
					return
				}
			}
		})
	}
	for _, a := range attacks {
		switch a {
		case "idle":
			repeat(func() error { _, err := r.idle(idleConns); return err })
		case "loris":
			repeat(func() error { _, err := r.loris(lorisConns); return err })
		case "held":
			repeat(func() error { _, err := r.held(heldConns); return err })
		case "flood":
			repeat(func() error { _, err := r.flood(floodRate); return err }) // a second's worth at a time
		default:
			fmt.Fprintf(os.Stderr, "attack: no attack %q (idle, loris, held, flood)\n", a)
		}
	}
	go func() {
		wg.Wait()
		close(finished)
	}()
	return finished
}

// cacheCPU is the CPU time the cache under test has used so far (user and system, from /proc).
func (r *rig) cacheCPU(tb testing.TB) time.Duration {
	tb.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.cache.Cmd.Process.Pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command's name, which is in parentheses and may hold spaces: utime and stime are
	// the 12th and 13th of them, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("reading the cache's CPU time from %q", stat)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

func p99(l podLookups) time.Duration {
	if len(l.latencies) == 0 {
		return 0
	}
	lat := slices.Sorted(slices.Values(l.latencies))
	return lat[len(lat)*99/100]
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}
