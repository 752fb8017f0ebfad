//go:build linux

package hostile

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// silentConns connect to each address and send nothing.
const silentConns = 100

// testSilent: the cache's TCP listeners defer accepting (NODECACHE_TCP_DEFER_ACCEPT, tcpwrite.go in
// cmd/node-cache), so a connection that sends nothing is not handed to CoreDNS's server, which would give it a
// goroutine, a file descriptor and a read deadline, until the deferral ends: the kernel of the node drops the
// last ACK of each one's handshake (TcpExtTCPDeferAcceptDrop) and keeps it as a request, while the Pod's
// lookups over TCP, which send at once, are answered.
func (r *rig) testSilent(t *testing.T) {
	before, err := r.deferAcceptDrops()
	if err != nil {
		t.Fatal(err)
	}
	conns, err := r.hostile.dialMany(silentConns)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(conns)
	want := before + int64(len(conns))
	var drops int64
	for deadline := time.Now().Add(closeBound); ; {
		if drops, err = r.deferAcceptDrops(); err != nil {
			t.Fatal(err)
		}
		if drops >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d connections that send nothing: the node's kernel held %d handshakes back from the cache", len(conns), drops-before)
	if drops < want {
		t.Errorf("%d connections that sent nothing, and the node's kernel held back %d handshakes: the cache accepted them at once (no TCP_DEFER_ACCEPT on its listeners)", len(conns), drops-before)
	}
	err = r.n.Do(r.n.PodNS, func() error {
		for i := range 2 * len(pairs) * len(hotLookups) {
			if problem, _, _ := lookupHot(tcpEvery-1+tcpEvery*i, tcpEvery); problem != "" { // the lookups that go over TCP
				t.Errorf("a lookup over TCP beside the silent connections: %s", problem)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// deferAcceptDrops reads the node namespace's TcpExtTCPDeferAcceptDrop: the bare ACKs of handshakes that a
// listener deferring its accepts held back.
func (r *rig) deferAcceptDrops() (int64, error) {
	var v int64
	err := r.n.Do(r.n.NodeNS, func() error {
		var err error
		v, err = netstat("/proc/thread-self/net/netstat", "TcpExt", "TCPDeferAcceptDrop")
		return err
	})
	return v, err
}

// netstat reads a counter of a /proc/net/netstat file: a line of names after the group's prefix, then a line
// of values.
func netstat(path, group, name string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		names := strings.Fields(sc.Text())
		if len(names) == 0 || names[0] != group+":" || !sc.Scan() {
			continue
		}
		values := strings.Fields(sc.Text())
		for i, n := range names {
			if n == name && i < len(values) {
				return strconv.ParseInt(values[i], 10, 64)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading %s: %w", path, err)
	}
	return 0, fmt.Errorf("%s has no %s %s", path, group, name)
}
