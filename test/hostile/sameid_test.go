//go:build linux

package hostile

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// testSameID sends one query with one ID from many sockets at once, over UDP and TCP, to both addresses:
// a name the cache has not seen (every copy a miss at once) and a hot name (hits, on the fast path over
// UDP). Every socket gets one reply, to its own query, the reference's answer.
func (r *rig) testSameID(t *testing.T) {
	const (
		id         = 0x2a2a
		udpSockets = 200
		tcpConns   = 50
	)
	for _, p := range pairs {
		for _, tr := range []transport{udp, tcp} {
			for _, name := range []string{w("sameid-" + tr.name + "-" + p.name), "kubernetes.default.svc.cluster.local."} {
				query := msg(name, dns.TypeA, dns.ClassINET, edns(1232))(id)
				want := r.askFromPod(tr, p.ref, query, id, askTimeout)
				count := udpSockets
				if tr.tcp {
					count = tcpConns
				}
				answers, err := r.askAtOnce(tr, p.cache, query, count)
				if err != nil {
					t.Fatalf("%s %s over %s: %v", name, p.name, tr.name, err)
				}
				bad := 0
				for i, got := range answers {
					if d := differs(got, want); d != "" {
						if bad++; bad <= 3 {
							t.Errorf("%s, %s over %s, socket %d of %d with ID %d: %s", name, p.name, tr.name, i+1, count, id, d)
						}
					}
				}
				if bad > 3 {
					t.Errorf("%s, %s over %s: %d of %d sockets got another answer", name, p.name, tr.name, bad, count)
				}
			}
		}
	}
}

// askAtOnce opens count sockets to server in the Pod, sends query on each as fast as it can, and returns
// what each got. A UDP socket whose query got no reply sends it once more, as a stub resolver does: the
// cache's receive buffer, which a burst from many ports can overflow, is not what this is about.
func (r *rig) askAtOnce(tr transport, server string, query []byte, count int) ([]answer, error) {
	network := "udp"
	if tr.tcp {
		network = "tcp"
	}
	conns := make([]net.Conn, 0, count)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	err := r.n.Do(r.n.PodNS, func() error {
		for range count {
			c, err := net.DialTimeout(network, server, askTimeout)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	wire := query
	if tr.tcp {
		wire = append([]byte{byte(len(query) >> 8), byte(len(query))}, query...)
	}
	deadline := time.Now().Add(askTimeout)
	for _, c := range conns {
		_ = c.SetDeadline(deadline)
		if _, err := c.Write(wire); err != nil {
			return nil, err
		}
	}
	answers := make([]answer, count)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			var reply []byte
			var err error
			if tr.tcp {
				reply, err = readFramed(c)
			} else {
				buf := make([]byte, 65535)
				var n int
				n, err = c.Read(buf)
				if errors.Is(err, os.ErrDeadlineExceeded) {
					_ = c.SetDeadline(time.Now().Add(askTimeout))
					if _, err = c.Write(wire); err == nil {
						n, err = c.Read(buf)
					}
				}
				reply = buf[:n]
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				answers[i] = answer{text: noReply}
				return
			}
			if err != nil {
				answers[i] = answer{text: fmt.Sprintf("error: %v", err)}
				return
			}
			answers[i] = describe(reply, false, nil, uint16(query[0])<<8|uint16(query[1]))
		})
	}
	wg.Wait()
	return answers, nil
}
