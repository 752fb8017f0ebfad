// Package hostile holds the hostile-client tier: the node cache with the shipped configuration
// (corefile.Render, as the manifests' DaemonSet runs it) on a simulated node (package simnode), asked from the
// Pod's namespace and, for the attacks, from a hostile Pod's namespace of its own, on the link-local address
// and the kube-dns ClusterIP, over UDP and TCP, with what a misbehaving or hostile Pod sends: odd headers,
// classes, types and EDNS, oversized datagrams, TCP length prefixes split across segments, slow and idle
// connections by the thousand, one ID from many ports, mixed case, while the cluster DNS gives broken replies
// for some names.
//
// Every answer is compared with the one a second node cache gives, the same Corefile without wirecache (so
// CoreDNS's server and plugins alone), running beside it on port 5353; the cache must not crash, its
// goroutines and resident memory must come back once the attack ends, and a well-behaved Pod's lookups must
// all be answered meanwhile. The rate and latency a well-behaved Pod keeps under attack are measured by
// BenchmarkHotLookupsUnderAttack (bench/hostile.sh), not asserted here: on a shared machine a ratio of rates
// is a measurement, not a pass/fail condition.
//
// The tests need root, ip, iptables, nft, conntrack and sysctl; under `make test` a missing one is a failure.
//
//	NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -v -count=1 ./test/hostile/
package hostile
