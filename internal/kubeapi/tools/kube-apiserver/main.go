// Command kube-apiserver is the Kubernetes API server built from k8s.io/kubernetes at the version pinned in this
// directory's go.mod, for the tests of internal/kubeapi. It exists because k8s.io/kubernetes cannot be installed
// with `go install pkg@version` (its go.mod replaces the k8s.io staging modules with local paths).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
