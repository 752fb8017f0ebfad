// Package kubeapi holds the tests that need a real Kubernetes API server (etcd and kube-apiserver, run by
// internal/kubeapi on loopback): the shipped manifests and the Helm chart (rendered with its defaults and each
// ci values file, one of which sets every knob, without its prometheus-operator kinds) created with strict
// field validation, its uninstall run by helm with the order its pre-delete hook promises, and the
// upstreamsvc plugin, in a node-cache process, following kube-dns-upstream with the token and Role those
// manifests give it.
//
// The binaries come from scripts/build-kube-apiserver.sh and helm from scripts/install-test-deps.sh (both part
// of `make test-deps`); without them the tests skip, and under `make test` they fail.
//
//	make test-deps && NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -v -count=1 ./test/kubeapi/
package kubeapi
