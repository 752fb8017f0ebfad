package corefile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"

	"github.com/nodelocaldns/nodelocaldns/internal/atomicfile"
)

var log = clog.NewWithPlugin("node-cache")

// DefaultSyncPeriod is how often DropIn.Watch looks at its inputs where their directories cannot be watched,
// node-cache's ConfigMap sync period.
const DefaultSyncPeriod = 10 * time.Second

// DropIn keeps the Corefile CoreDNS runs in step with a base Corefile (the node-local-dns ConfigMap) and
// the kube-dns ConfigMap, both mounted as files, the way node-cache does. A change that cannot be turned
// into a Corefile is kept out: the last good Corefile stays, the reason is logged and handed to Rejected
// (node-cache counts it as a "configmap" setup error).
type DropIn struct {
	// Base is the base Corefile's path (-basecorefile).
	Base string
	// KubeDNSDir is where the kube-dns ConfigMap is mounted (-kubednscm); empty for none.
	KubeDNSDir string
	// Output is the path of the Corefile CoreDNS loads (-conf).
	Output string
	// Expansion is what the flags fill in.
	Expansion Expansion
	// Directives, when set, are the directives CoreDNS knows; a Corefile using any other is kept out
	// rather than written, since CoreDNS would refuse to start or reload on it.
	Directives []string
	// Check tunes the hazard check run on every new Corefile; hazards are logged, not kept out.
	Check CheckOptions
	// Reload makes CoreDNS load a Corefile written after the first; nil leaves it to the reload plugin.
	Reload func() error
	// Rejected, when set, is told of every input kept out, once per distinct input.
	Rejected func(error)
	// Restart, when set, is asked about every new Corefile after the first, before it is written: true means
	// this process cannot load it and is being replaced by one that can (node-cache's lean build, whose
	// container restarts on the full build), so the Corefile is neither written nor reloaded; the replacement
	// renders it again from the same inputs.
	Restart func(corefile []byte) bool

	// readFile reads an input file; nil is os.ReadFile. Tests use it to show a file half-written.
	readFile func(string) ([]byte, error)

	mu        sync.Mutex // serialises Sync and guards the fields below
	lastInput [sha256.Size]byte
	written   []byte
}

// Written returns the Corefile last written, or nil before the first.
func (d *DropIn) Written() []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.written
}

// inputs is one read of what the Corefile is made from.
type inputs struct {
	base    []byte
	baseErr error
	kd      KubeDNS
	kdErr   error
	hash    [sha256.Size]byte // of all of the above, so that the same inputs, good or bad, are acted on once
}

// read reads the base Corefile and the kube-dns ConfigMap.
func (d *DropIn) read() inputs {
	readFile := d.readFile
	if readFile == nil {
		readFile = os.ReadFile
	}
	var in inputs
	in.base, in.baseErr = readFile(d.Base)
	if in.baseErr == nil && len(bytes.TrimSpace(in.base)) == 0 {
		// Never a Corefile to run, and what a reader sees of a file rewritten in place at the wrong moment.
		in.baseErr = fmt.Errorf("%s is empty", d.Base)
	}
	if d.KubeDNSDir != "" {
		in.kd, in.kdErr = readKubeDNSDir(d.KubeDNSDir, readFile)
	}
	in.hash = sha256.Sum256(slices.Concat(in.base, fmt.Appendf(nil, "\x00%v\x00%v\x00%v", in.baseErr, in.kd, in.kdErr)))
	return in
}

// Sync renders the Corefile from the current inputs and writes it if it changed. The first Sync writes a
// Corefile even when the kube-dns ConfigMap is bad, without it, so that the node cache can start; after
// that a bad input leaves the Corefile as it was. Every failure is returned and counted.
func (d *DropIn) Sync() error { return d.apply(d.read()) }

// applied reports whether in is what the Corefile was last made from (or kept out as bad).
func (d *DropIn) applied(in inputs) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return in.hash == d.lastInput && d.written != nil
}

func (d *DropIn) apply(in inputs) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in.hash == d.lastInput && d.written != nil {
		return nil
	}
	d.lastInput = in.hash
	if in.baseErr != nil {
		return d.fail(fmt.Errorf("reading the base Corefile: %w", in.baseErr))
	}
	if in.kdErr != nil {
		if d.written != nil {
			return d.fail(fmt.Errorf("kube-dns ConfigMap change kept out, the Corefile stays as it was: %w", in.kdErr))
		}
		// Starting: go without the ConfigMap rather than not at all, as node-cache does.
		err := d.fail(fmt.Errorf("starting without the kube-dns ConfigMap: %w", in.kdErr))
		if werr := d.render(in.base, KubeDNS{}); werr != nil {
			return errors.Join(err, werr)
		}
		return err
	}
	return d.render(in.base, in.kd)
}

func (d *DropIn) render(base []byte, kd KubeDNS) error {
	out, err := Expand(base, d.Expansion, kd)
	if err == nil && d.Directives != nil {
		err = d.knownDirectives(out)
	}
	if err != nil {
		if d.written != nil {
			return d.fail(fmt.Errorf("change kept out, the Corefile stays as it was: %w", err))
		}
		return d.fail(err)
	}
	if bytes.Equal(out, d.written) {
		return nil
	}
	if d.written != nil && d.Restart != nil && d.Restart(out) {
		return nil
	}
	if hazards, err := Check(out, d.Check); err == nil {
		for _, h := range hazards {
			log.Warningf("Corefile %s", h)
		}
	}
	if err := atomicfile.Write(d.Output, out, 0o644); err != nil {
		return d.fail(err)
	}
	first := d.written == nil
	d.written = out
	log.Infof("Wrote %s from %s (stub domains %d, upstream nameservers %v)", d.Output, d.Base,
		len(kd.StubDomains), kd.UpstreamNameservers)
	if !first && d.Reload != nil {
		if err := d.Reload(); err != nil {
			return d.fail(fmt.Errorf("reloading CoreDNS: %w", err))
		}
	}
	return nil
}

func (d *DropIn) knownDirectives(corefile []byte) error {
	f, err := Parse(corefile)
	if err != nil {
		return err
	}
	var errs []error
	for _, b := range f.Blocks {
		for _, dir := range b.Directives {
			if !slices.Contains(d.Directives, dir.Name) {
				errs = append(errs, fmt.Errorf("line %d: directive %q is not compiled into this CoreDNS", dir.Line, dir.Name))
			}
		}
	}
	return errors.Join(errs...)
}

func (d *DropIn) fail(err error) error {
	log.Errorf("%v", err)
	if d.Rejected != nil {
		d.Rejected(err)
	}
	return err
}

// Watch applies the inputs as Sync does, until ctx ends, whenever they may have changed: when the directory
// of the base Corefile or the kube-dns ConfigMap's directory tells of a change (inotify), and every period
// where they cannot be watched (a directory that does not exist; the watch is tried again at each look), so
// that an idle node is not woken to read files nobody changed. A change is acted on only when a second read,
// a moment later (the period, at most a second), finds the same: Kubernetes swaps a ConfigMap volume's files
// in one rename, but a file rewritten in place (a hostPath, an editor, a test) can be read half-written, and
// acting on that would reload CoreDNS on, or count as an error, a Corefile nobody wrote. While the two reads
// differ it looks again a moment later. Failures are logged and counted by apply.
func (d *DropIn) Watch(ctx context.Context, period time.Duration) {
	settle := min(period, time.Second)
	changes, watchErr := d.watchInputs(ctx)
	if watchErr != nil {
		log.Infof("looking at %s every %v: %v", d.inputNames(), period, watchErr)
	}
	t := time.NewTimer(0) // a first look at once: a change may have come before the watch
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-changes:
			if !ok {
				if ctx.Err() != nil {
					return
				}
				changes = nil
			}
		case <-t.C:
		}
		if changes == nil {
			changes, _ = d.watchInputs(ctx) // until it can, it looks every period, as logged at the start
		}
		wait := time.Duration(0) // none: the next change tells
		if d.look(ctx, settle) {
			wait = settle // still changing, and no event may come once the writer is done
		} else if changes == nil {
			wait = period
		}
		if wait > 0 {
			t.Reset(wait)
		}
	}
}

// look reads the inputs and, when they differ from what was applied and a second read settle later finds
// the same, applies them. It reports whether they were still changing.
func (d *DropIn) look(ctx context.Context, settle time.Duration) (changing bool) {
	in := d.read()
	if d.applied(in) {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(settle):
	}
	again := d.read()
	if again.hash != in.hash {
		return true
	}
	_ = d.apply(again)
	return false
}

// watchInputs watches the directories the inputs are in.
func (d *DropIn) watchInputs(ctx context.Context) (<-chan struct{}, error) {
	dirs := []string{filepath.Dir(d.Base)}
	if d.KubeDNSDir != "" {
		dirs = append(dirs, d.KubeDNSDir)
	}
	return watchDirs(ctx, dirs)
}

// inputNames names the inputs, for the log.
func (d *DropIn) inputNames() string {
	if d.KubeDNSDir == "" {
		return d.Base
	}
	return d.Base + " and " + d.KubeDNSDir
}
