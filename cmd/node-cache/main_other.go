//go:build !linux

// Command node-cache is a Kubernetes NodeLocal DNSCache. It needs Linux: the link that holds its
// addresses, its rules and the hand-over between two of its processes are netlink, iptables or nftables
// and reuseport groups. Elsewhere it builds only to say so; a CoreDNS of your own with this repository's
// plugins builds there too (examples/coredns), and its notrack setup refuses the Corefile.
package main

import (
	"fmt"
	"os"
	"runtime"
)

func main() {
	fmt.Fprintf(os.Stderr, "node-cache needs Linux, and this one is built for %s; build it with GOOS=linux\n", runtime.GOOS)
	os.Exit(1)
}
