//go:build linux

package notrack

import (
	"fmt"

	"github.com/coredns/coredns/plugin/pkg/reuseport"
)

// checkListen opens and closes every DNS listen address the way CoreDNS will (SO_REUSEPORT, UDP and TCP),
// and every extra TCP port on the claimed addresses (health, ready), so that a start whose listeners
// cannot open fails while notrack can still undo what it did: caddy ends a first start that fails later
// without any shutdown callback.
func checkListen(dns, tcp []string) error {
	for _, a := range tcp {
		// With SO_REUSEPORT, as health, ready and prometheus listen: a successor listens beside its owner.
		l, err := reuseport.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("cannot listen on %s/tcp: %w", a, err)
		}
		l.Close()
	}
	for _, a := range dns {
		pc, err := reuseport.ListenPacket("udp", a)
		if err != nil {
			return fmt.Errorf("cannot listen on %s/udp: %w", a, err)
		}
		pc.Close()
		l, err := reuseport.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("cannot listen on %s/tcp: %w", a, err)
		}
		l.Close()
	}
	return nil
}
