//go:build linux

package nodelocal_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// stdLogger adapts the standard library's logger; CoreDNS users pass clog.NewWithPlugin("notrack").
type stdLogger struct{}

func (stdLogger) Infof(f string, v ...any)    { log.Printf("[INFO] "+f, v...) }
func (stdLogger) Warningf(f string, v ...any) { log.Printf("[WARNING] "+f, v...) }
func (stdLogger) Errorf(f string, v ...any)   { log.Printf("[ERROR] "+f, v...) }

// The whole life of a node-local cache. It needs root (CAP_NET_ADMIN), so go test compiles it but does
// not run it; the package's tests do the same steps in network namespaces of their own.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	r, err := nodelocal.New(nodelocal.Config{Logger: stdLogger{}})
	if err != nil {
		log.Fatal(err) // e.g. another instance holds the node lock: the error names it
	}
	defer r.Close()

	// The addresses first, so that the server can bind them; the rules once it answers.
	lease, err := r.Acquire(ctx, nodelocal.Claim{
		Addresses:     []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("fd00::a")},
		ExtraTCPPorts: []uint16{8080},
		DeferRules:    true,
	})
	if err != nil {
		log.Fatalf("%s: %v", nodelocal.KindOf(err), err)
	}
	// ... start the DNS server on 169.254.20.10:53 and [fd00::a]:53, wait until it answers ...
	if err := lease.EnableRules(ctx); err != nil {
		log.Printf("rules not in place yet (%s), Run retries: %v", nodelocal.KindOf(err), err)
	}
	go r.Run(ctx, time.Minute)

	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The last lease released tears down jumps, chains, addresses and the link we created.
	if err := lease.Release(shutdown); err != nil {
		log.Print(err)
	}
}

// Errors carry the kinds Kubernetes' node-cache counts in its setup error metric.
func ExampleKinds() {
	err := errors.Join(
		&nodelocal.Error{Kind: nodelocal.KindInterfaceAdd, Op: "ensure link nodelocaldns", Err: errors.New("operation not permitted")},
		&nodelocal.Error{Kind: nodelocal.KindIPTablesLock, Op: "sync IPv4 rules", Err: errors.New("xtables lock held")},
	)
	for _, k := range nodelocal.Kinds(err) {
		fmt.Println(k)
	}
	fmt.Println(nodelocal.KindOf(fmt.Errorf("setup: %w", err)))
	// Output:
	// interface_add
	// iptables_lock
	// interface_add
}
