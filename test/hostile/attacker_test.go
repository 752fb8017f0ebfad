//go:build linux

package hostile

import (
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// attackerEnv, set to a comma-separated list of attacks, makes the test binary the benchmark's attacker
// process instead of running tests (see TestMain).
const attackerEnv = "NODELOCALDNS_HOSTILE_ATTACKER"

// floodEnv, a regular expression, narrows the flood to the odd cases whose names it matches (oddCases), in
// the benchmark's attacker process, which inherits it from the benchmark.
const floodEnv = "HOSTILE_FLOOD"

// attackerUp is what the attacker process prints once every attack has started.
const attackerUp = "attacker: under way"

// attacker is the hostile Pod of the benchmark: the test binary run again as a process of its own in the
// hostile Pod's namespace, so that its goroutines, its heap, its garbage collector and its sockets are not
// the well-behaved Pod's, as they are not on a node.
type attacker struct {
	p *simnode.Process
}

// startAttacker starts the attacker process with the attacks named (idle, loris, held, flood) and returns
// once it has started them.
func (r *rig) startAttacker(tb testing.TB, attacks []string) *attacker {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatalf("finding the test binary to run the attacker: %v", err)
	}
	// One P, whatever GOMAXPROCS the benchmark passes to the cache: with a P per CPU the attacker's runtime
	// handed its goroutines between threads (futex and epoll wake-ups, about 50 ms of CPU in each 3 s
	// window), which took the shared cores from the well-behaved Pod without reaching the cache. The attack
	// the cache sees is the same: the same connections, bytes and rates.
	env := append(os.Environ(), attackerEnv+"="+strings.Join(attacks, ","), "GOMAXPROCS=1")
	p := r.n.StartEnv(r.hostileNS, env, self)
	r.waitOutput(p, attackerUp, 30*time.Second)
	return &attacker{p: p}
}

// stop ends the attack: the attacker closes everything it opened and exits, which it must do cleanly.
func (a *attacker) stop(tb testing.TB) {
	tb.Helper()
	if err := a.p.Signal(syscall.SIGTERM); err != nil {
		tb.Fatalf("stopping the attacker: %v", err)
	}
	// Idle connections end when the cache closes them, so within closeBound.
	if err := a.p.Wait(2 * closeBound); err != nil {
		tb.Fatalf("the attacker: %v\n%s", err, a.p.Output())
	}
}

// runAttacker is the attacker process: it runs attacks until SIGTERM, and returns its exit code, 1 if an
// attack failed.
func runAttacker(attacks []string) int {
	h := hostilePod{inPod: func(fn func() error) error { return fn() }} // started inside the hostile Pod's namespace
	if v := os.Getenv(floodEnv); v != "" {
		h.floodCases = regexp.MustCompile(v) // the benchmark checked it before starting this process
	}
	stop := make(chan struct{})
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-terms
		close(stop)
	}()
	done, failed := h.attackUntil(stop, attacks)
	fmt.Println(attackerUp)
	<-done
	if failed() {
		return 1
	}
	return 0
}

// attackUntil runs testAttack's mix, the attacks named (idle, loris, held, flood), until stop is closed: the
// idle and slow-loris connections are opened again each time the cache has closed them, the held
// connections and the flood repeat. decoy is the flood aimed at nothing (decoyAddr): what the attacker's
// own work costs the machine, without the cache's part. done is closed once everything it opened is closed;
// failed then says whether an attack stopped on an error (printed to standard error) or was not known.
func (h hostilePod) attackUntil(stop <-chan struct{}, attacks []string) (done <-chan struct{}, failed func() bool) {
	finished := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := false
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "attack: "+format+"\n", args...)
		mu.Lock()
		bad = true
		mu.Unlock()
	}
	repeat := func(fn func() error) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := fn(); err != nil {
					fail("%v", err)
					return
				}
			}
		})
	}
	for _, a := range attacks {
		switch a {
		case "idle":
			repeat(func() error { _, err := h.idle(idleConns); return err })
		case "loris":
			repeat(func() error { _, err := h.loris(lorisConns); return err })
		case "held":
			repeat(func() error { _, _, err := h.held(heldConns); return err })
		case "flood":
			repeat(func() error { _, err := h.flood(floodRate); return err }) // a second's worth at a time
		case "decoy":
			d := h
			d.floodAt = decoyAddr
			repeat(func() error { _, err := d.flood(floodRate); return err })
		default:
			fail("no attack %q (idle, loris, held, flood, decoy)", a)
		}
	}
	go func() {
		wg.Wait()
		close(finished)
	}()
	return finished, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return bad
	}
}
