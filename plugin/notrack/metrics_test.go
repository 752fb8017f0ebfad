//go:build linux

package notrack

import (
	"context"
	"errors"
	"fmt"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

func TestCountSetupError(t *testing.T) {
	count := func(kind nodelocal.Kind) float64 {
		m := &dto.Metric{}
		if err := SetupErrors.WithLabelValues(string(kind)).Write(m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	kinds := []nodelocal.Kind{nodelocal.KindIPTables, nodelocal.KindIPTablesLock, nodelocal.KindInterfaceAdd, nodelocal.KindInterfaceCheck, nodelocal.KindNodeLock}
	before := map[nodelocal.Kind]float64{}
	for _, k := range kinds {
		before[k] = count(k)
	}
	// A sync that failed in two ways, wrapped the way notrack wraps it.
	countSetupError(fmt.Errorf("put 169.254.20.10:53 in place: %w", errors.Join(
		&nodelocal.Error{Kind: nodelocal.KindInterfaceAdd, Op: "ensure link", Err: errors.New("operation not permitted")},
		&nodelocal.Error{Kind: nodelocal.KindIPTablesLock, Op: "sync IPv4 rules", Err: errors.New("xtables lock")},
	)))
	// Not failures of the node: nothing, a shutdown in progress, an error of no kind.
	countSetupError(nil)
	countSetupError(&nodelocal.Error{Kind: nodelocal.KindIPTables, Op: "sync IPv4 rules", Err: context.Canceled})
	countSetupError(errors.New("no kind"))
	want := map[nodelocal.Kind]float64{nodelocal.KindInterfaceAdd: 1, nodelocal.KindIPTablesLock: 1}
	for _, k := range kinds {
		if got := count(k) - before[k]; got != want[k] {
			t.Errorf("%s: counted %v, want %v", k, got, want[k])
		}
	}
}
