//go:build linux

package hostile

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// lookupsEnv, set to a lookupsSpec in JSON, makes the test binary the benchmark's well-behaved Pod instead of
// running tests (see TestMain).
const lookupsEnv = "NODELOCALDNS_HOSTILE_LOOKUPS"

// lookupsReady is what the well-behaved Pod's process prints once it is ready to start its lookups, which it
// does on SIGUSR1.
const lookupsReady = "lookups: ready"

// lookupsSpec is what the benchmark asks of its well-behaved Pod's process: workers asking the hot names for
// Window, each starting a lookup every Every (0: back to back), every OverTCP-th lookup over TCP (0: none),
// and where to write what they got.
type lookupsSpec struct {
	Workers int
	Window  time.Duration
	Every   time.Duration
	OverTCP int
	Out     string // the file the process writes its lookupsReport to
}

// lookupsReport is what the well-behaved Pod's process writes: its lookups, and the CPU time it used for
// them (from its start signal to its last lookup).
type lookupsReport struct {
	Answered, Failed, Retried int
	First                     string
	Latencies, OverTCP        []time.Duration
	Elapsed                   time.Duration
	CPU                       time.Duration
}

// podLookupsIn runs the benchmark's well-behaved Pod for a window, as a process of its own in the Pod's
// namespace (the test binary run again), as the attacker is: its goroutines, its sockets and its Go
// scheduler are not those of this process, which holds the relay in front of the cluster DNS, and its CPU
// time is its own (the report's). It returns the Pod's lookups and the CPU time used while it asked
// (cpuUse, attacker nil when none runs), the Pod's own from its report.
func (r *rig) podLookupsIn(tb testing.TB, spec lookupsSpec, attacker *simnode.Process) (podLookups, cpuUse) {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatalf("finding the test binary to run the well-behaved Pod: %v", err)
	}
	spec.Out = filepath.Join(r.dir, "lookups.json")
	_ = os.Remove(spec.Out)
	js, err := json.Marshal(spec)
	if err != nil {
		tb.Fatal(err)
	}
	p := r.n.StartEnv(r.n.PodNS, append(os.Environ(), lookupsEnv+"="+string(js)), self)
	r.waitOutput(p, lookupsReady, 30*time.Second)
	before := r.cpuNow(tb, attacker)
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		tb.Fatalf("starting the well-behaved Pod's lookups: %v", err)
	}
	// Every lookup ends within glibc's two timeouts of the window's end.
	if err := p.Wait(spec.Window + glibcAttempts*glibcTimeout + 30*time.Second); err != nil {
		tb.Fatalf("the well-behaved Pod's process: %v\n%s", err, p.Output())
	}
	use := r.cpuNow(tb, attacker).since(before)
	b, err := os.ReadFile(spec.Out)
	if err != nil {
		tb.Fatalf("the well-behaved Pod's lookups: %v\n%s", err, p.Output())
	}
	var rep lookupsReport
	if err := json.Unmarshal(b, &rep); err != nil {
		tb.Fatalf("the well-behaved Pod's lookups: %v", err)
	}
	use.pod = rep.CPU
	return podLookups{
		answered: rep.Answered, failed: rep.Failed, retried: rep.Retried, first: rep.First,
		latencies: rep.Latencies, overTCP: rep.OverTCP, elapsed: rep.Elapsed,
	}, use
}

// runLookups is the well-behaved Pod's process: it says it is ready, waits for SIGUSR1, runs the lookups
// spec asks for, writes its report, and returns its exit code.
func runLookups(specJSON string) int {
	var spec lookupsSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil || spec.Workers < 1 || spec.Window <= 0 || spec.OverTCP < 0 || spec.Out == "" {
		fmt.Fprintf(os.Stderr, "lookups: %s=%q: want a lookupsSpec with workers, a window and a file (%v)\n", lookupsEnv, specJSON, err)
		return 2
	}
	start := make(chan os.Signal, 1)
	signal.Notify(start, syscall.SIGUSR1)
	fmt.Println(lookupsReady)
	<-start
	cpu0, err := processCPUSelf()
	if err == nil {
		l := lookupLoop(spec.Workers, spec.Window, spec.Every, spec.OverTCP)
		var cpu1 time.Duration
		if cpu1, err = processCPUSelf(); err == nil {
			err = writeReport(spec.Out, l, cpu1-cpu0)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "lookups: %v\n", err)
		return 1
	}
	return 0
}

func writeReport(file string, l podLookups, cpu time.Duration) error {
	b, err := json.Marshal(lookupsReport{
		Answered: l.answered, Failed: l.failed, Retried: l.retried, First: l.first,
		Latencies: l.latencies, OverTCP: l.overTCP, Elapsed: l.elapsed, CPU: cpu,
	})
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o600)
}

// processCPUSelf is the CPU time this process has used so far, user and system.
func processCPUSelf() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// lookupLoop runs workers well-behaved Pods for d, each starting a lookup every `every` (or as soon as its
// last one is answered, when that is later, or when every is 0), every overTCP-th over TCP (hotLookup), and
// returns their lookups together. It runs in the Pod's namespace: in the well-behaved Pod's process.
func lookupLoop(workers int, d, every time.Duration, overTCP int) podLookups {
	var mu sync.Mutex
	var all podLookups
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			var mine podLookups
			for i := 0; time.Since(start) < d; i++ {
				if every > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
				}
				problem, took, retried := lookupHot(w*1000+i, overTCP)
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
				if _, _, _, _, tr := hotLookup(w*1000+i, overTCP); tr.tcp {
					mine.overTCP = append(mine.overTCP, took)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			all.answered += mine.answered
			all.failed += mine.failed
			all.retried += mine.retried
			all.latencies = append(all.latencies, mine.latencies...)
			all.overTCP = append(all.overTCP, mine.overTCP...)
			if all.first == "" {
				all.first = mine.first
			}
		})
	}
	wg.Wait()
	all.elapsed = time.Since(start)
	return all
}
