//go:build linux

package conformance

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	manifests "github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/internal/configmapvolume"
	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// nodeCache is the node cache's binary (cmd/node-cache, as its image holds it), built once per test binary.
var nodeCache = simnode.SharedBuild{Prefix: "nodelocaldns-conformance-"}

// clusterDNSBuild is examples/coredns, the CoreDNS the cluster-DNS Pod runs, built once per test binary.
var clusterDNSBuild goBuild

func TestMain(m *testing.M) {
	code := m.Run()
	nodeCache.Remove()
	clusterDNSBuild.remove()
	os.Exit(code)
}

// goBuild is one `go build` of a package of this module, made on first use and removed by TestMain.
type goBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// binary builds pkg (a path from the module root) on first use and returns the binary.
func (b *goBuild) binary(t *testing.T, pkg string) string {
	t.Helper()
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "nodelocaldns-conformance-coredns-") //nolint:usetesting // one build for every test of the package, removed by TestMain
		if b.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
		if err != nil {
			b.err = fmt.Errorf("finding the module root: %w", err)
			return
		}
		b.path = filepath.Join(b.dir, filepath.Base(pkg))
		build := exec.CommandContext(ctx, "go", "build", "-o", b.path, pkg)
		build.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
		if out, err := build.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building %s: %w: %s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func (b *goBuild) remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// eventually bounds waits for what a process does on its own within a few rounds (a start, a sync, a
// reload): a failure bound for a busy machine, not an expectation.
const eventually = 2 * time.Minute

// Addresses of the simulated node's other servers: the node's resolver answers every A query with
// simnode.ExternalAnswer; the e2e tests' own DNS server (for stub domains and upstream nameservers) is a
// second address in the same namespace.
const (
	stubServerIP = "192.0.2.54"
	// testNamespace is the e2e framework's namespace for the test's objects and the querier Pod.
	testNamespace = "e2e-dns"
)

// rig is the simulated node with its API server, its cluster DNS reading it, and the node cache.
type rig struct {
	t     *testing.T
	n     *simnode.Node
	api   *kubeapi.Server
	admin kubernetes.Interface
	dir   string
	// kubeDNS is the node cache's projection of the kube-dns ConfigMap (its volume, optional: true).
	kubeDNS *configmapvolume.Volume
	// musl is the static musl getaddrinfo client.
	musl string

	clusterDNS, resolvers, cache *simnode.Process
	// clusterDNSDir holds the cluster DNS's Corefile, clusterDNSCorefile what it first served.
	clusterDNSDir, clusterDNSCorefile string
	// extraSearch follows the cluster's search list in the Pod's resolv.conf (a Pod's dnsConfig.searches).
	extraSearch []string
	// barriers numbers the names barrier asks.
	barriers *atomic.Int64
}

// newRig builds the node, the API server with the cluster's system objects, and starts everything.
func newRig(t *testing.T) *rig {
	t.Helper()
	privtest.RequirePrivileged(t, append(slices.Clone(simnode.Tools), "go", "dig", "getent", "musl-gcc")...)
	bin := nodeCache.Binary(t)
	coredns := clusterDNSBuild.binary(t, "./examples/coredns")
	r := &rig{t: t, dir: t.TempDir(), barriers: new(atomic.Int64)}
	r.musl = buildMusl(t)
	r.api = kubeapi.StartWith(t, kubeapi.Options{ServiceCIDRs: []string{"10.96.0.0/16"}})
	r.admin = kubernetes.NewForConfigOrDie(r.api.AdminConfig())
	r.n = simnode.New(t)
	r.createSystemObjects()

	// The node's resolver and the e2e tests' DNS server, in the ext namespace.
	if _, err := r.n.In(context.Background(), r.n.ExtNS, "ip", "addr", "add", stubServerIP+"/24", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	r.resolvers = r.n.StartCoreDNS(bin, r.n.ExtNS, t.TempDir(), resolversCorefile, nil, simnode.ExtResolverIP)
	// dnsPolicy Default: the cluster-DNS Pod and the node cache resolve with the node's resolv.conf.
	for _, ns := range []string{r.n.DNSNS, r.n.NodeNS} {
		r.n.WriteNetnsFile(ns, "resolv.conf", "nameserver "+simnode.ExtResolverIP+"\n")
	}

	r.startClusterDNS(coredns)
	r.startNodeCache(bin)
	r.n.SetPodResolvConf(simnode.KubeDNSClusterIP, testNamespace)
	return r
}

// resolversCorefile serves the node's resolver (every A query answered with simnode.ExternalAnswer, other
// types empty) and the e2e tests' DNS server (dns_configmap.go's names; the DNS server Pod of its
// createDNSServer).
var resolversCorefile = fmt.Sprintf(`.:53 {
    bind %s
    log
    template IN A {
        answer "{{ .Name }} 60 IN A %s"
    }
    template IN ANY {
        rcode NOERROR
        authority ". 60 IN SOA ns.invalid. hostmaster.invalid. 1 7200 1800 86400 60"
    }
}
.:53 {
    bind %s
    log
    hosts {
        1.1.1.1 abc.acme.local
        2.2.2.2 def.acme.local
        3.3.3.3 widget.local
        192.0.2.124 foo.example.com
        192.0.2.123 my.test
    }
}
`, simnode.ExtResolverIP, simnode.ExternalAnswer, stubServerIP)

// clusterCorefile is kubeadm's CoreDNS Corefile, bound to the cluster-DNS Pod's IP, with a query log and
// the kubeconfig the Pod's ServiceAccount would give in-cluster.
const clusterCorefile = `.:53 {
    bind {{.IP}}
    log
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       kubeconfig {{.Kubeconfig}} kubeapi
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
`

// startClusterDNS starts CoreDNS in the cluster-DNS Pod's namespace, reading the API through a relay with
// the coredns ServiceAccount's token, and waits until it serves the kubernetes Service from the API.
func (r *rig) startClusterDNS(coredns string) {
	r.t.Helper()
	kubeconfig := filepath.Join(r.dir, "coredns.kubeconfig")
	relay := r.n.Relay(r.n.DNSNS, strings.TrimPrefix(r.api.URL(), "https://"))
	if err := r.api.WriteKubeconfig(kubeconfig, "https://"+relay, r.token("kube-system", "coredns")); err != nil {
		r.t.Fatal(err)
	}
	r.clusterDNSDir = r.t.TempDir()
	r.clusterDNSCorefile = r.clusterDNSConfig(clusterCorefile)
	r.clusterDNS = r.n.StartCoreDNS(coredns, r.n.DNSNS, r.clusterDNSDir, r.clusterDNSCorefile, nil, simnode.ClusterDNSPodIP)
	r.waitFor("the cluster DNS serving the kubernetes Service from the API", func() bool {
		got, err := r.dig(simnode.ClusterDNSPodIP, "udp", "kubernetes.default.svc.cluster.local", "A", false)
		return err == nil && slices.Equal(got, []string{"kubernetes.default.svc.cluster.local. A 10.96.0.1"})
	})
}

// clusterDNSConfig fills in a cluster-DNS Corefile's {{.IP}} and {{.Kubeconfig}}.
func (r *rig) clusterDNSConfig(corefile string) string {
	return strings.NewReplacer("{{.IP}}", simnode.ClusterDNSPodIP, "{{.Kubeconfig}}", filepath.Join(r.dir, "coredns.kubeconfig")).Replace(corefile)
}

// startNodeCache runs node-cache in the node's namespace with the arguments of the manifest's DaemonSet,
// its container paths mapped to the test's directory: the node-local-dns ConfigMap's Corefile and the
// kube-dns ConfigMap are projected volumes, and the node lock a file of the test's own. The kubelet's
// variables for kube-dns-upstream tell upstreamsvc where the cluster DNS is.
func (r *rig) startNodeCache(bin string) {
	r.t.Helper()
	objs, err := manifests.Load(manifests.Manifests[0].File)
	if err != nil {
		r.t.Fatal(err)
	}
	var container *corev1.Container
	for i, c := range objs.DaemonSets[0].Spec.Template.Spec.Containers {
		if c.Name == "node-cache" {
			container = &objs.DaemonSets[0].Spec.Template.Spec.Containers[i]
		}
	}
	if container == nil {
		r.t.Fatalf("no node-cache container in %s", manifests.Manifests[0].File)
	}
	var base *corev1.ConfigMap
	for _, cm := range objs.ConfigMaps {
		if cm.Name == "node-local-dns" {
			base = cm
		}
	}
	if base == nil {
		r.t.Fatalf("no node-local-dns ConfigMap in %s", manifests.Manifests[0].File)
	}
	baseVolume, err := configmapvolume.New(filepath.Join(r.dir, "etc-coredns"))
	if err != nil {
		r.t.Fatal(err)
	}
	if err := baseVolume.Project(map[string]string{"Corefile.base": base.Data["Corefile"]}); err != nil {
		r.t.Fatal(err)
	}
	if r.kubeDNS, err = configmapvolume.New(filepath.Join(r.dir, "etc-kube-dns")); err != nil {
		r.t.Fatal(err)
	}

	paths := strings.NewReplacer("/etc/Corefile", filepath.Join(r.dir, "Corefile"), "/tmp/", r.dir+"/", "$(HOST_IP)", "127.0.0.1")
	var args []string
	for i := 0; i < len(container.Args); i++ {
		arg := container.Args[i]
		if arg == "-daemonset" {
			// The uninstall watch needs the Pod's ServiceAccount in-cluster; test/faults runs it.
			i++
			continue
		}
		args = append(args, paths.Replace(arg))
	}
	// The container's mounts: /etc/coredns, /etc/kube-dns (the defaults of -basecorefile and -kubednscm)
	// and /run/nodelocaldns.lock.
	args = append(args, "-basecorefile", filepath.Join(baseVolume.Dir(), "Corefile.base"), "-kubednscm", r.kubeDNS.Dir(),
		"-lockfile", filepath.Join(r.dir, "nodelocaldns.lock"))
	for _, a := range args {
		if strings.HasPrefix(a, "/") && !strings.HasPrefix(a, r.dir) {
			r.t.Fatalf("the manifest's argument %s is a path in the container this test does not map", a)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBERNETES_") && !strings.HasPrefix(kv, "KUBE_DNS_UPSTREAM_") && !strings.HasPrefix(kv, "XTABLES_LOCKFILE=") {
			env = append(env, kv)
		}
	}
	env = append(env, "KUBE_DNS_UPSTREAM_SERVICE_HOST="+simnode.UpstreamClusterIP, "KUBE_DNS_UPSTREAM_SERVICE_PORT=53",
		"XTABLES_LOCKFILE="+filepath.Join(r.dir, "xtables.lock"))
	r.cache = r.n.StartEnv(r.n.NodeNS, env, bin, args...)
	r.waitFor("the node cache's rules in place for both addresses", func() bool {
		if r.cache.Exited() {
			r.t.Fatalf("node-cache exited: %v\n%s", r.cache.Wait(0), r.cache.Output())
		}
		for line := range strings.SplitSeq(r.cache.Output(), "\n") {
			if strings.Contains(line, "plugin/notrack: rules in place for") &&
				strings.Contains(line, simnode.LinkLocalIP+":53") && strings.Contains(line, simnode.KubeDNSClusterIP+":53") {
				return true
			}
		}
		return false
	})
}

// waitFor polls cond until it holds, failing the test after eventually.
func (r *rig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	r.waitWithin(what, eventually, time.Second/4, cond)
}

// waitWithin polls cond every interval until it holds, failing the test after bound.
func (r *rig) waitWithin(what string, bound, interval time.Duration, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(interval)
	}
}

// buildMusl compiles testdata/getaddrinfo.c with musl-gcc -static into the test's directory.
func buildMusl(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "getaddrinfo-musl")
	if b, err := exec.Command("musl-gcc", "-static", "-O2", "-o", out, filepath.Join("testdata", "getaddrinfo.c")).CombinedOutput(); err != nil {
		t.Fatalf("musl-gcc: %v: %s", err, b)
	}
	return out
}
