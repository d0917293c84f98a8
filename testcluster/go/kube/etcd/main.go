// Command etcd is etcd's own server entry point, built at the etcd release
// that this Kubernetes release's API server is tested with (k8s.io/kubernetes
// requires go.etcd.io/etcd/server/v3 at that version). Debian's etcd-server
// is 3.4, older than the 3.5 floor that current API servers document.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
