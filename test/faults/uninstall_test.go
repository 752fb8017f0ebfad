//go:build linux

package faults

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	manifests "github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// An uninstall deletes the DaemonSet, and no cache comes back to the node after the one that stops: with
// -daemonset the cache and the guard watch it through the API, and once it is deleted they leave nothing
// on the node. Here the API is a real kube-apiserver, reached from the simulated node through a relay, with
// the manifests' ServiceAccount, Role, RoleBinding and DaemonSet; it is deleted as `kubectl delete -f` of the
// manifest does, its RBAC objects first.
//
//	NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -v -run Uninstall ./test/faults/

// uninstallAPI is a kube-apiserver holding the manifests' DaemonSet and its RBAC objects, and a kubeconfig
// for the simulated node with a token of the manifests' ServiceAccount.
type uninstallAPI struct {
	t          *testing.T
	admin      kubernetes.Interface
	objs       *manifests.Objects
	kubeconfig string
}

// newUninstallAPI starts the API server, creates the objects of the first manifest, and waits until the
// ServiceAccount may watch the DaemonSet.
func newUninstallAPI(t *testing.T, r *rig) *uninstallAPI {
	t.Helper()
	return newManifestAPI(t, r, manifests.Manifests[0].File)
}

// newManifestAPI is newUninstallAPI with the objects of the manifest file, and services created too.
func newManifestAPI(t *testing.T, r *rig, file string, services ...*corev1.Service) *uninstallAPI {
	t.Helper()
	s := kubeapi.Start(t)
	ctx := context.Background()
	objs, err := manifests.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	a := &uninstallAPI{t: t, admin: kubernetes.NewForConfigOrDie(s.AdminConfig()), objs: objs}
	strict := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	sa, role, binding, ds := objs.ServiceAccounts[0], objs.Roles[0], objs.RoleBindings[0], objs.DaemonSets[0]
	for _, c := range []struct {
		what   string
		create func() error
	}{
		{"ServiceAccount", func() error {
			_, err := a.admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa.DeepCopy(), strict)
			return err
		}},
		{"Role", func() error {
			_, err := a.admin.RbacV1().Roles(role.Namespace).Create(ctx, role.DeepCopy(), strict)
			return err
		}},
		{"RoleBinding", func() error {
			_, err := a.admin.RbacV1().RoleBindings(binding.Namespace).Create(ctx, binding.DeepCopy(), strict)
			return err
		}},
		{"DaemonSet", func() error {
			_, err := a.admin.AppsV1().DaemonSets(ds.Namespace).Create(ctx, ds.DeepCopy(), strict)
			return err
		}},
	} {
		if err := c.create(); err != nil {
			t.Fatalf("creating the manifest's %s: %v", c.what, err)
		}
	}
	for _, svc := range services {
		if _, err := a.admin.CoreV1().Services(svc.Namespace).Create(ctx, svc, strict); err != nil {
			t.Fatalf("creating Service %s: %v", svc.Name, err)
		}
	}
	tr, err := a.admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The authorizer learns of the RoleBinding from its own watch, a moment after the create returns.
	client := kubernetes.NewForConfigOrDie(s.TokenConfig(tr.Status.Token))
	r.waitFor("the ServiceAccount allowed to list its DaemonSet", eventually, func() bool {
		_, err := client.AppsV1().DaemonSets(ds.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + ds.Name})
		return err == nil
	})
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What the cache and the guard asked the API, for the failure's story.
		events, err := s.AuditEvents()
		if err != nil {
			t.Log(err)
			return
		}
		for _, e := range events {
			if strings.Contains(e.UserAgent, "node-cache") {
				code := 0
				if e.ResponseStatus != nil {
					code = e.ResponseStatus.Code
				}
				t.Logf("audit: %s %s %s %d", e.Stage, e.Verb, e.RequestURI, code)
			}
		}
	})
	a.kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := s.WriteKubeconfig(a.kubeconfig, "https://"+r.n.Relay(r.n.NodeNS, strings.TrimPrefix(s.URL(), "https://")), tr.Status.Token); err != nil {
		t.Fatal(err)
	}
	return a
}

// args are the arguments that make a cache or a guard watch the manifest's DaemonSet.
func (a *uninstallAPI) args() []string {
	ds := a.objs.DaemonSets[0]
	return []string{"-daemonset", ds.Namespace + "/" + ds.Name, "-kubeconfig", a.kubeconfig}
}

// deleteLikeKubectl deletes the manifest's objects as `kubectl delete -f` does, in the manifest's order
// (the ServiceAccount and the RBAC objects before the DaemonSet), each with background propagation.
func (a *uninstallAPI) deleteLikeKubectl() {
	a.t.Helper()
	ctx := context.Background()
	sa, role, binding, ds := a.objs.ServiceAccounts[0], a.objs.Roles[0], a.objs.RoleBindings[0], a.objs.DaemonSets[0]
	background := metav1.DeletePropagationBackground
	bg := metav1.DeleteOptions{PropagationPolicy: &background}
	for _, del := range []struct {
		what string
		del  func() error
	}{
		{"ServiceAccount", func() error { return a.admin.CoreV1().ServiceAccounts(sa.Namespace).Delete(ctx, sa.Name, bg) }},
		{"Role", func() error { return a.admin.RbacV1().Roles(role.Namespace).Delete(ctx, role.Name, bg) }},
		{"RoleBinding", func() error { return a.admin.RbacV1().RoleBindings(binding.Namespace).Delete(ctx, binding.Name, bg) }},
	} {
		if err := del.del(); err != nil {
			a.t.Fatalf("deleting the %s: %v", del.what, err)
		}
	}
	if err := a.admin.AppsV1().DaemonSets(ds.Namespace).Delete(ctx, ds.Name, bg); err != nil {
		a.t.Fatalf("deleting the DaemonSet: %v", err)
	}
}

// checkNothingLeft fails the test unless the node holds nothing of the cache's or the guard's, and Pods
// resolve through kube-proxy.
func (r *rig) checkNothingLeft() {
	r.t.Helper()
	if r.n.Mode == simnode.NFTablesMode {
		if tables := r.ourTables(); len(tables) > 0 {
			r.t.Errorf("tables left behind: %v", tables)
		}
	} else if r.anyJump() || r.chainRules("raw", nodelocal.RulesChain) != -1 || r.chainRules("filter", nodelocal.RulesChain) != -1 {
		r.t.Errorf("rules left behind:\n%s\n%s", r.mustIpt("-t", "raw", "-S"), r.mustIpt("-t", "filter", "-S"))
	}
	for _, table := range []string{"nat", "raw", "filter"} {
		if r.n.Mode == simnode.NFTablesMode {
			break
		}
		if out, err := r.ipt("-t", table, "-S", nodelocal.GuardChain); err == nil {
			r.t.Errorf("the divert or its mark is left in %s:\n%s", table, out)
		}
	}
	if addrs := r.linkAddrs(); addrs != nil {
		r.t.Errorf("link nodelocaldns left behind with %v", addrs)
	}
	if err := r.podQuery(kubeDNS); err != nil {
		r.t.Errorf("Pods do not resolve the kube-dns ClusterIP through kube-proxy: %v", err)
	}
}

// TestUninstall runs the cache and the guard as the manifests do, watching their DaemonSet. While it exists,
// a SIGTERM is a restart: the cache hands the node to the cluster DNS and the next cache takes it back. Once
// the manifest is deleted, SIGTERM to both at once (as to the containers of a deleted Pod) leaves nothing on
// the node.
func TestUninstall(t *testing.T) {
	r := newHandoverRig(t)
	api := newUninstallAPI(t, r)
	lock := []string{"-lockfile", filepath.Join(r.dir, "nodelocaldns.lock")}
	cache := r.startCache(api.args()...)
	guard := r.startGuard(append(api.args(), lock...)...)
	for _, p := range []*simnode.Process{cache, guard} {
		r.waitLog(p, "watching DaemonSet kube-system/node-local-dns", 1, eventually)
	}

	// A restart: handed over, and taken back.
	r.stop(cache)
	if !strings.Contains(cache.Output(), "handed the node to the cluster DNS") || strings.Contains(cache.Output(), "uninstalling") {
		t.Fatalf("with its DaemonSet in place the cache did not hand the node over:\n%s", cache.Output())
	}
	if !has(r.linkAddrs(), simnode.LinkLocalIP) {
		t.Errorf("after the hand-over the link holds %v, want the link-local address kept for the next cache", r.linkAddrs())
	}
	cache = r.startCache(api.args()...)
	r.waitLog(cache, "watching DaemonSet kube-system/node-local-dns", 1, eventually)
	r.waitFor("the new cache's jumps", eventually, r.jumps)

	// The uninstall, while a Pod asks the kube-dns ClusterIP (iptables mode: Pods know no other address):
	// through the hand-over and drain, then kube-proxy's DNAT, every lookup is answered.
	api.deleteLikeKubectl()
	for _, p := range []*simnode.Process{cache, guard} {
		r.waitLog(p, "DaemonSet kube-system/node-local-dns was deleted: this is an uninstall", 1, eventually)
	}
	stopLoad := make(chan struct{})
	loaded := make(chan simnode.LoadResult, 1)
	go func() {
		res, err := r.n.RunLoad(context.Background(), r.n.PodNS, simnode.Load{
			Server: kubeDNS, Name: "kubernetes.default.svc.cluster.local",
			Rate: restartLoadRate, Duration: 2 * time.Second, Until: stopLoad, Timeout: time.Second,
			Sockets: 32, SocketReuse: 20,
		})
		if err != nil {
			t.Errorf("load: %v", err)
		}
		loaded <- res
	}()
	r.waitFor("the load answered by the cache", eventually, func() bool {
		n, err := r.scrape(cacheMetrics, "coredns_dns_requests_total", "")
		return err == nil && n >= 200
	})
	for _, p := range []*simnode.Process{cache, guard} {
		kill(t, p, syscall.SIGTERM)
	}
	for _, p := range []*simnode.Process{cache, guard} {
		if err := p.Wait(terminationGrace); err != nil && !strings.Contains(err.Error(), "exit status") {
			t.Fatalf("not stopped within the grace period after SIGTERM: %v\n%s", err, p.Output())
		}
	}
	close(stopLoad)
	if res := <-loaded; res.Failed() != 0 {
		t.Errorf("lookups to the kube-dns ClusterIP through the uninstall: %v", res)
	} else {
		t.Logf("lookups to the kube-dns ClusterIP through the uninstall: %v", res)
	}
	if !strings.Contains(cache.Output(), "uninstalling: removed the rules, the divert and nodelocaldns") {
		t.Errorf("the cache did not remove everything:\n%s", cache.Output())
	}
	if !strings.Contains(guard.Output(), "an uninstall; removed what was left of the cache's on the node") {
		t.Errorf("the guard did not clean up after the cache:\n%s", guard.Output())
	}
	r.checkNothingLeft()
}

// TestUninstallAfterTheCacheDied: the cache is SIGKILLed and the guard fails the node open; then the manifest
// is deleted. No cache runs to take the node back or to clean it, so the guard, at its SIGTERM, removes what
// is left. With kube-proxy in iptables mode and in nftables mode.
func TestUninstallAfterTheCacheDied(t *testing.T) {
	for _, mode := range []simnode.KubeProxyMode{simnode.IPTablesMode, simnode.NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) {
			var r *rig
			if mode == simnode.NFTablesMode {
				r = newNFTablesRig(t)
			} else {
				r = newRig(t, "nft")
			}
			api := newUninstallAPI(t, r)
			cache := r.startCache(api.args()...)
			guard := r.startGuard(append(api.args(), "-lockfile", filepath.Join(r.dir, "nodelocaldns.lock"))...)
			r.waitLog(guard, "watching DaemonSet kube-system/node-local-dns", 1, eventually)
			kill(t, cache, syscall.SIGKILL)
			r.waitLog(guard, "nodelocal guard: the cache failed", 1, eventually)
			api.deleteLikeKubectl()
			r.waitLog(guard, "DaemonSet kube-system/node-local-dns was deleted: this is an uninstall", 1, eventually)
			kill(t, guard, syscall.SIGTERM)
			if err := guard.Wait(terminationGrace); err != nil {
				t.Fatalf("the guard after SIGTERM: %v\n%s", err, guard.Output())
			}
			if !strings.Contains(guard.Output(), "an uninstall; removed what was left of the cache's on the node") {
				t.Errorf("the guard did not clean up:\n%s", guard.Output())
			}
			r.checkNothingLeft()
		})
	}
}
