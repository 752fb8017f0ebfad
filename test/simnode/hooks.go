//go:build linux

package simnode

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Relay listens on loopback in namespace ns and relays every connection to target, an address on the
// machine's loopback such as a kube-apiserver's, and returns the address it listens on in ns. The listener
// closes when the test ends. A client in ns (a cache, a guard, a cluster DNS reading the API) reaches the
// server through it without any route out of the namespace.
func (n *Node) Relay(ns, target string) string {
	n.t.Helper()
	var l net.Listener
	if err := n.Do(ns, func() (err error) {
		l, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		n.t.Fatalf("simnode: relay in %s: %v", ns, err)
	}
	n.t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go relayConn(c, target)
		}
	}()
	return l.Addr().String()
}

// relayConn copies between c and a new connection to target until either side closes.
func relayConn(c net.Conn, target string) {
	defer c.Close()
	s, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	defer s.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(s, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, s); done <- struct{}{} }()
	<-done
}

// WriteNetnsFile writes /etc/netns/<ns>/<name>, which `ip netns exec` mounts over /etc/<name> for every
// command it starts in ns afterwards (resolv.conf, hosts), and removes the directory when the test ends.
func (n *Node) WriteNetnsFile(ns, name, content string) {
	n.t.Helper()
	dir := filepath.Join("/etc/netns", ns)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
	n.t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
}

// SetPodResolvConf rewrites the Pod's resolv.conf as the kubelet writes it for a ClusterFirst Pod in the
// Kubernetes namespace podNamespace: nameserver ip, the search list of that namespace followed by
// extraSearch (the Pod's dnsConfig.searches), ndots:5.
func (n *Node) SetPodResolvConf(ip, podNamespace string, extraSearch ...string) {
	n.t.Helper()
	search := strings.Join(append([]string{podNamespace + ".svc." + ClusterDomain, "svc." + ClusterDomain, ClusterDomain}, extraSearch...), " ")
	conf := fmt.Sprintf("nameserver %s\nsearch %s\noptions ndots:5\n", ip, search)
	if err := os.WriteFile(filepath.Join("/etc/netns", n.PodNS, "resolv.conf"), []byte(conf), 0o644); err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
}

// StartCoreDNS runs binary (a CoreDNS build) in namespace ns with corefile written to dir/Corefile, and
// files (path -> content) written first, and waits until it answers on listen:53. A test that rewrites
// dir/Corefile and sends SIGUSR1 reloads it.
func (n *Node) StartCoreDNS(binary, ns, dir, corefile string, files map[string]string, listen string) *Process {
	n.t.Helper()
	return n.startCoreDNS(binary, ns, dir, corefile, files, listen)
}
