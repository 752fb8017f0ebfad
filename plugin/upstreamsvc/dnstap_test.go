package upstreamsvc

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/coredns/coredns/plugin/dnstap"

	tap "github.com/dnstap/golang-dnstap"
	"github.com/miekg/dns"
	"google.golang.org/protobuf/proto"
)

// TestDnstapSeesEveryCopy runs upstreamsvc behind dnstap, where the proxies carry every query: an answered
// query is tapped as one forwarder query and its response, from this server to the upstream over TCP, and a
// query the upstream drops as max_attempts forwarder queries and no response.
func TestDnstapSeesEveryCopy(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)
	sock := filepath.Join(t.TempDir(), "tap.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	in := tap.NewFrameStreamSockInput(ln)
	frames := make(chan []byte, 64)
	go in.ReadInto(frames)
	t.Cleanup(func() { ln.Close() })

	s := newFrameServer(t)
	inst, addr := startCoreDNS(t, fmt.Sprintf(".:0 {\n bind 127.0.0.1\n dnstap unix://%s full\n upstreamsvc {\n fallback %s\n }\n}\n", sock, s.addr()))
	defer stopCoreDNS(t, inst)

	// taps asks for name and counts the forwarder messages tapped for it until the client has its answer and
	// they are as many as wanted (then for a moment more), answering the upstream's health checks meanwhile;
	// answer says whether to answer name's queries.
	taps := func(name string, answer bool, wantQueries, wantResponses int) {
		t.Helper()
		done := make(chan struct{})
		go func() {
			defer close(done)
			c := &dns.Client{Net: "udp", Timeout: 20 * time.Second}
			_, _, _ = c.Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), addr)
		}()
		queries, responses := 0, 0
		deadline := time.After(waitLimit)
		var settle <-chan time.Time // runs once the client has its answer
		for finished := false; !finished; {
			select {
			case <-done:
				done = nil
				settle = time.After(200 * time.Millisecond)
			case <-settle:
				// dnstap sends its messages on its own time: wait for the ones still to come.
				finished = queries >= wantQueries && responses >= wantResponses
				settle = time.After(200 * time.Millisecond)
			case f := <-s.frames:
				if f.msg.Question[0].Name == "." || answer {
					reply(t, f)
				}
			case b := <-frames:
				d := new(tap.Dnstap)
				if err := proto.Unmarshal(b, d); err != nil {
					t.Fatal(err)
				}
				m := d.GetMessage()
				raw := m.GetQueryMessage()
				switch m.GetType() {
				case tap.Message_FORWARDER_QUERY:
				case tap.Message_FORWARDER_RESPONSE:
					raw = m.GetResponseMessage()
				default:
					continue // the client's query and response
				}
				msg := new(dns.Msg)
				if err := msg.Unpack(raw); err != nil || len(msg.Question) != 1 || msg.Question[0].Name != name {
					t.Errorf("%s: tapped %v, %v", name, msg, err)
					continue
				}
				if got, want := net.JoinHostPort(net.IP(m.GetResponseAddress()).String(), fmt.Sprint(m.GetResponsePort())), s.addr(); got != want ||
					m.GetSocketProtocol() != tap.SocketProtocol_TCP {
					t.Errorf("%s: tapped as sent to %s over %v, want %s over TCP", name, got, m.GetSocketProtocol(), want)
				}
				switch m.GetType() {
				case tap.Message_FORWARDER_QUERY:
					queries++
				case tap.Message_FORWARDER_RESPONSE:
					responses++
				}
			case <-deadline:
				t.Fatalf("%s: %d forwarder queries and %d responses tapped, want %d and %d", name, queries, responses, wantQueries, wantResponses)
			}
		}
		if queries != wantQueries || responses != wantResponses {
			t.Errorf("%s: %d forwarder queries and %d responses tapped, want %d and %d", name, queries, responses, wantQueries, wantResponses)
		}
	}
	taps("answered.example.org.", true, 1, 1)
	taps("dropped.example.org.", false, defaultMaxAttempts, 0)
}
