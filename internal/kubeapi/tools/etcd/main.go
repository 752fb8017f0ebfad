// Command etcd is the etcd server built from go.etcd.io/etcd/server/v3 at the version pinned in this directory's
// go.mod, for the tests of internal/kubeapi. etcd's own modules replace each other with local paths, so
// `go install pkg@version` cannot build it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
