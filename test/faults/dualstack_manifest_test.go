//go:build linux

package faults

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	manifests "github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// dualStackManifest is the manifest of a dual-stack cluster in kube-proxy's iptables mode.
const dualStackManifest = "nodelocaldns-dualstack.yaml"

// manifestContainer returns the arguments of container name of the manifest's DaemonSet (an init container
// for the guard) as the kubelet expands them, with $(HOST_IP) the node namespace's loopback.
func manifestContainer(t *testing.T, objs *manifests.Objects, name string) []string {
	t.Helper()
	pod := objs.DaemonSets[0].Spec.Template.Spec
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		if c.Name == name {
			args := slices.Clone(c.Args)
			for i := range args {
				args[i] = strings.ReplaceAll(args[i], "$(HOST_IP)", "127.0.0.1")
			}
			return args
		}
	}
	t.Fatalf("no container %s in the manifest", name)
	return nil
}

// setArg replaces the value of flag in args, or appends flag and value.
func setArg(args []string, flag, value string) []string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		args[i+1] = value
		return args
	}
	return append(args, flag, value)
}

// TestDualStackManifest runs the cache and the guard with the arguments of the dual-stack manifest and the
// environment the kubelet gives them, which names one ClusterIP per Service, the primary family's, on a
// dual-stack node whose API server holds kube-dns-upstream with a ClusterIP of each family. Restarted with a
// gap under load to the four addresses, the cache loses no lookup: its hand-over diverts both link-local
// addresses, each to kube-dns-upstream in its family, which takes the IPv6 ClusterIP from the API; SIGKILLed,
// the guard fails the IPv6 link-local address open too. (Before the cache and the guard asked the API for
// the other family's ClusterIP, the IPv6 addresses went undiverted, and every lookup to them in the gap was
// lost.) Both kube-dns ClusterIPs go back to kube-proxy: the IPv6 one, which no variable names, from the
// API. (Before the cache asked, it diverted that one to kube-dns-upstream.)
func TestDualStackManifest(t *testing.T) {
	r := newEmulatedDualStackRig(t, simnode.IPTablesMode, true) // the API server of the test holds what the manifest reads
	objs, err := manifests.Load(dualStackManifest)
	if err != nil {
		t.Fatal(err)
	}
	// kube-dns-upstream as the manifest has it, allocated a ClusterIP of each family. The API server's IPv4
	// Service range is not the node's: the IPv4 ClusterIP the node uses is the kubelet's variable's, which
	// names that family.
	var upstream *corev1.Service
	for _, svc := range objs.Services {
		if svc.Name == "kube-dns-upstream" {
			upstream = svc.DeepCopy()
		}
	}
	if upstream == nil {
		t.Fatal("no kube-dns-upstream Service in the manifest")
	}
	upstream.Spec.ClusterIP, upstream.Spec.ClusterIPs = "127.96.0.11", []string{"127.96.0.11", simnode.UpstreamClusterIP6}
	// kube-dns, the cluster's, with a ClusterIP of each family too: the cache asks for the IPv6 one, which it
	// holds and no variable names, so that its hand-over gives it back to kube-proxy.
	kubeDNS := upstream.DeepCopy()
	kubeDNS.Name = "kube-dns"
	kubeDNS.Spec.ClusterIP, kubeDNS.Spec.ClusterIPs = "127.96.0.10", []string{"127.96.0.10", simnode.KubeDNSClusterIP6}
	api := newManifestAPI(t, r, dualStackManifest, upstream, kubeDNS)

	// The node's resolv.conf, as the cache sees it (dnsPolicy: Default).
	netnsDir := filepath.Join("/etc/netns", r.n.NodeNS)
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(netnsDir) })
	if err := os.WriteFile(filepath.Join(netnsDir, "resolv.conf"), []byte("nameserver "+simnode.ExtResolverIP+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(r.dir, "Corefile.base")
	if err := os.WriteFile(base, []byte(objs.ConfigMaps[0].Data["Corefile"]), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(),
		"KUBE_DNS_SERVICE_HOST="+simnode.KubeDNSClusterIP,
		"KUBE_DNS_UPSTREAM_SERVICE_HOST="+simnode.UpstreamClusterIP, "KUBE_DNS_UPSTREAM_SERVICE_PORT=53",
		"XTABLES_LOCKFILE="+filepath.Join(r.dir, "xtables.lock"))
	lock := filepath.Join(r.dir, "nodelocaldns.lock")
	cacheArgs := manifestContainer(t, objs, "node-cache")
	for _, a := range [][2]string{
		{"-conf", r.conf}, {"-basecorefile", base}, {"-pidfile", filepath.Join(r.dir, "node-cache.pid")},
		{"-lockfile", lock}, {"-kubeconfig", api.kubeconfig}, {"-syncinterval", "1s"},
	} {
		cacheArgs = setArg(cacheArgs, a[0], a[1])
	}
	startCache := func() {
		t.Helper()
		r.cache = r.n.StartEnv(r.n.NodeNS, env, r.bin, cacheArgs...)
		r.waitLog(r.cache, "rules in place for", 1, eventually)
	}
	startCache()
	guardArgs := manifestContainer(t, objs, "guard")
	for _, a := range [][2]string{
		{"-guard.lockpath", filepath.Join(r.dir, "guard.lock")}, {"-lockfile", lock}, {"-kubeconfig", api.kubeconfig},
		{"-guard.backend", r.backend},
	} {
		guardArgs = setArg(guardArgs, a[0], a[1])
	}
	r.guard = r.n.StartEnv(r.n.NodeNS, env, r.bin, guardArgs...)
	r.waitLog(r.guard, "nodelocal guard: watching", 1, eventually)
	for _, p := range []*simnode.Process{r.cache, r.guard} {
		if strings.Contains(p.Output(), "undiverted") {
			t.Errorf("an address would go undiverted:\n%s", p.Output())
		}
	}

	// A restart with a gap, under load to the four addresses.
	stopLoad := r.startLoad()
	r.stop(r.cache)
	if out := r.cache.Output(); !strings.Contains(out, "handed the node to the cluster DNS") || !strings.Contains(out, simnode.LinkLocalIP6+" to "+simnode.UpstreamClusterIP6) {
		t.Errorf("the cache did not hand the IPv6 link-local address to kube-dns-upstream's IPv6 ClusterIP:\n%s", out)
	}
	handed := handOverLine(r.cache.Output())
	_, removed, _ := strings.Cut(handed, "jumps out, ")
	removed, diverting, _ := strings.Cut(removed, " off ")
	if !strings.Contains(removed, simnode.KubeDNSClusterIP6) || strings.Contains(diverting, simnode.KubeDNSClusterIP6+" to ") {
		t.Errorf("the cache did not give the IPv6 kube-dns ClusterIP back to kube-proxy: %q", handed)
	}
	time.Sleep(3 * time.Second) // the gap of the rolling update
	startCache()
	r.checkNoLookupLost(stopLoad())

	// The cache SIGKILLed: the guard fails the IPv6 link-local address open to kube-dns-upstream.
	samples := r.killCacheWhileQuerying(linkLocal6)
	span, failed := failureSpan(samples)
	if !recoveredAfterFailure(samples) {
		t.Fatalf("lookups to %s did not recover within 15 s of the kill (%d of %d failed)\nguard:\n%s", linkLocal6, failed, len(samples), r.guard.Output())
	}
	t.Logf("%s: %d lookups failed over %v after SIGKILL", linkLocal6, failed, span.Round(time.Millisecond))
	r.checkDivertedInBothFamilies()
}

// handOverLine returns the line of a cache's log that says how it handed the node over, "" if none does.
func handOverLine(log string) string {
	for line := range strings.Lines(log) {
		if strings.Contains(line, "handed the node to the cluster DNS") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
