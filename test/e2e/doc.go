// Package e2e holds end-to-end tests of the node cache: the node-cache binary with a node-local Corefile,
// run on a simulated node (package simnode) whose rules a real kube-proxy writes (simnode.NewWithKubeProxy),
// and queried by glibc and dig from a Pod's network namespace. They need root, ip, iptables, conntrack,
// getent, dig and the pinned kube-apiserver and kube-proxy; under `make test` a missing one is a failure.
//
//	NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -v -count=1 ./test/e2e/
package e2e
