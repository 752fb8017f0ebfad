package corefile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"

	"github.com/nodelocaldns/nodelocaldns/internal/atomicfile"
)

var log = clog.NewWithPlugin("node-cache")

// DefaultSyncPeriod is how often DropIn.Watch looks at its inputs, node-cache's ConfigMap sync period.
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

// Watch looks at the inputs every period until ctx ends, and applies them as Sync does once they have
// settled: a change is acted on only when a second read, a moment later (the period, at most a second), finds
// the same. Kubernetes swaps a ConfigMap volume's files in one rename, but a file rewritten in place (a
// hostPath, an editor, a test) can be read half-written, and acting on that would reload CoreDNS on, or count
// as an error, a Corefile nobody wrote. Failures are logged and counted by apply.
func (d *DropIn) Watch(ctx context.Context, period time.Duration) {
	settle := min(period, time.Second)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		in := d.read()
		if d.applied(in) {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(settle):
		}
		if again := d.read(); again.hash == in.hash {
			_ = d.apply(again)
		}
		// Otherwise still changing: look again at the next tick.
	}
}
