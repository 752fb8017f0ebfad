// Command kube-proxy is the Kubernetes network proxy built from k8s.io/kubernetes at the version pinned in this
// directory's go.mod (the same as kube-apiserver's), for the tests that run a real kube-proxy on the simulated
// node (internal/kubeproxy). Like kube-apiserver it cannot be installed with `go install pkg@version`.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
