//go:build linux

package main

import (
	"bytes"
	"context"
	stdlog "log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	manifests "github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
)

func TestParseDaemonSet(t *testing.T) {
	if ns, name, err := parseDaemonSet("kube-system/node-local-dns"); err != nil || ns != "kube-system" || name != "node-local-dns" {
		t.Errorf("kube-system/node-local-dns: %q %q %v", ns, name, err)
	}
	for _, bad := range []string{"node-local-dns", "/node-local-dns", "kube-system/", "Kube-System/x", "a/b/c"} {
		if _, _, err := parseDaemonSet(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// Without -daemonset there is no watch, and a stop is a restart.
	w, err := startUninstallWatch(&uninstallFlags{}, nil)
	if w != nil || err != nil {
		t.Fatalf("no -daemonset: %v, %v", w, err)
	}
	if gone, _ := w.decision(); gone {
		t.Error("no -daemonset, and a stop is an uninstall")
	}
}

// TestUninstallWatchFromAPI runs the uninstall detection of the manifests' -daemonset against a real API
// server, with a token of their ServiceAccount and nothing but their Role: it says restart while the
// DaemonSet exists, also after an update, and while the API refuses (logged once); uninstall once the
// DaemonSet is deleted (after its RBAC objects, in the order `kubectl delete -f` deletes them), being deleted
// (a foreground deletion, whose finalizer nothing here removes: the test runs no controllers), or absent;
// and restart again when it comes back.
func TestUninstallWatchFromAPI(t *testing.T) {
	s := kubeapi.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(s.AdminConfig())
	strict := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	logs := captureLog(t)

	objs, err := manifests.Load(manifests.Manifests[0].File)
	if err != nil {
		t.Fatal(err)
	}
	ds, sa, role, binding := objs.DaemonSets[0], objs.ServiceAccounts[0], objs.Roles[0], objs.RoleBindings[0]
	// The flag as the manifest gives it, to both containers.
	flags := &uninstallFlags{}
	pod := ds.Spec.Template.Spec
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		fs, _ := newFlagSet()
		registerGuardFlags(fs)
		if err := fs.Parse(expandEnv(t, c)); err != nil {
			t.Fatalf("container %s: %v", c.Name, err)
		}
		flags.daemonSet = lookupFlag(fs, "daemonset", "")
		if flags.daemonSet != ds.Namespace+"/"+ds.Name {
			t.Fatalf("container %s: -daemonset %q, want %s/%s", c.Name, flags.daemonSet, ds.Namespace, ds.Name)
		}
	}

	createDaemonSet := func() {
		t.Helper()
		if _, err := admin.AppsV1().DaemonSets(ds.Namespace).Create(ctx, ds.DeepCopy(), strict); err != nil {
			t.Fatal(err)
		}
	}
	create := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("creating %s: %v", what, err)
		}
	}
	_, err = admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa.DeepCopy(), strict)
	create("the ServiceAccount", err)
	tr, err := admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	create("a token", err)
	_, err = admin.RbacV1().Roles(role.Namespace).Create(ctx, role.DeepCopy(), strict)
	create("the Role", err)
	createDaemonSet()
	flags.kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := s.WriteKubeconfig(flags.kubeconfig, s.URL(), tr.Status.Token); err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	watchRequests := func(code int) int {
		events, err := s.AuditEvents()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range events {
			if e.User.Username == user && strings.Contains(e.UserAgent, dsUserAgent) && e.Stage == "ResponseComplete" &&
				e.ResponseStatus != nil && e.ResponseStatus.Code == code {
				n++
			}
		}
		return n
	}
	changes := &changeLog{}
	start := func() *daemonSetWatch {
		t.Helper()
		w, err := startUninstallWatch(flags, changes.add)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.stop)
		return w
	}
	wantDecision := func(w *daemonSetWatch, uninstall bool, why string) {
		t.Helper()
		waitForAPI(t, "the decision "+why, func() bool {
			got, gotWhy := w.decision()
			return got == uninstall && strings.Contains(gotWhy, why)
		})
	}

	// No RoleBinding: the API refuses, again and again, and it is logged once. A stop is a restart.
	w := start()
	waitForAPI(t, "two refused requests of the watch", func() bool { return watchRequests(403) >= 2 })
	if _, err := w.seen(); !apierrors.IsForbidden(err) {
		t.Errorf("the watch's last failure: %v, want Forbidden", err)
	}
	if gone, why := w.decision(); gone || !strings.Contains(why, "no answer from the Kubernetes API") {
		t.Errorf("refused: uninstall %v (%s), want a restart", gone, why)
	}
	if n := strings.Count(logs.String(), "cannot watch DaemonSet kube-system/node-local-dns: the Kubernetes API refuses"); n != 1 {
		t.Errorf("the refusal was logged %d times, want once:\n%s", n, logs)
	}
	// The Role is bound: the same watch gets its answer.
	_, err = admin.RbacV1().RoleBindings(binding.Namespace).Create(ctx, binding.DeepCopy(), strict)
	create("the RoleBinding", err)
	wantDecision(w, false, "DaemonSet kube-system/node-local-dns exists")
	if !strings.Contains(logs.String(), "the Kubernetes API answers again: watching DaemonSet kube-system/node-local-dns") {
		t.Errorf("the watch's recovery was not logged:\n%s", logs)
	}
	w.stop()

	// The DaemonSet exists, and is updated: a restart.
	w = start()
	wantDecision(w, false, "DaemonSet kube-system/node-local-dns exists")
	updated, err := admin.AppsV1().DaemonSets(ds.Namespace).Patch(ctx, ds.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"test/updated":"yes"}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitForAPI(t, "the watch seeing the update", func() bool { rv, _ := w.seen(); return rv == updated.ResourceVersion })
	if gone, why := w.decision(); gone {
		t.Errorf("after an update: an uninstall (%s)", why)
	}

	// A foreground deletion: the DaemonSet stays with a deletionTimestamp (no garbage collector here). An
	// uninstall. Then its finalizer goes, and it with it: still one.
	fg := metav1.DeletePropagationForeground
	if err := admin.AppsV1().DaemonSets(ds.Namespace).Delete(ctx, ds.Name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		t.Fatal(err)
	}
	wantDecision(w, true, "is being deleted")
	if _, err := admin.AppsV1().DaemonSets(ds.Namespace).Patch(ctx, ds.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	wantDecision(w, true, "was deleted")
	w.stop()

	// Started while the DaemonSet is absent: an uninstall. It comes back: a restart.
	w = start()
	wantDecision(w, true, "does not exist")
	mark := changes.len()
	createDaemonSet()
	wantDecision(w, false, "DaemonSet kube-system/node-local-dns exists")
	if got := changes.since(mark); !slices.Equal(got, []bool{false}) {
		t.Errorf("onChange after the DaemonSet came back: %v, want [false]", got)
	}

	// `kubectl delete -f` of the manifest: the ServiceAccount, the Role and the RoleBinding go before the
	// DaemonSet (background deletion, as kubectl's default). The established watch still delivers.
	mark = changes.len()
	for _, del := range []func() error{
		func() error {
			return admin.CoreV1().ServiceAccounts(sa.Namespace).Delete(ctx, sa.Name, metav1.DeleteOptions{})
		},
		func() error {
			return admin.RbacV1().Roles(role.Namespace).Delete(ctx, role.Name, metav1.DeleteOptions{})
		},
		func() error {
			return admin.RbacV1().RoleBindings(binding.Namespace).Delete(ctx, binding.Name, metav1.DeleteOptions{})
		},
	} {
		if err := del(); err != nil {
			t.Fatal(err)
		}
	}
	saClient := kubernetes.NewForConfigOrDie(s.TokenConfig(tr.Status.Token))
	waitForAPI(t, "the API refusing the deleted ServiceAccount", func() bool {
		_, err := saClient.AppsV1().DaemonSets(ds.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + ds.Name})
		return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)
	})
	bg := metav1.DeletePropagationBackground
	if err := admin.AppsV1().DaemonSets(ds.Namespace).Delete(ctx, ds.Name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatal(err)
	}
	wantDecision(w, true, "was deleted")
	if got := changes.since(mark); !slices.Equal(got, []bool{true}) {
		t.Errorf("onChange at the uninstall: %v, want [true]", got)
	}
	// No request failed meanwhile: the deletion came through the watch established before.
	if n := strings.Count(logs.String(), "cannot watch DaemonSet"); n != 1 {
		t.Errorf("%d failures to watch logged, want the first refusal only:\n%s", n, logs)
	}
	if t.Failed() {
		t.Logf("log:\n%s", logs)
	}
}

// waitForAPI polls cond until it holds; it fails the test after two minutes: a bound for a busy machine,
// not an expectation.
func waitForAPI(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 2m", what)
		}
	}
}

// changeLog records what a watch told its onChange.
type changeLog struct {
	mu  sync.Mutex
	got []bool
}

func (c *changeLog) add(uninstalling bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, uninstalling)
}

func (c *changeLog) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

func (c *changeLog) since(mark int) []bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got[mark:])
}

// captureLog sends what node-cache logs (CoreDNS's logger writes through the standard one) to a buffer too.
func captureLog(t *testing.T) *syncLog {
	t.Helper()
	l := &syncLog{}
	stdlog.SetOutput(l)
	t.Cleanup(func() { stdlog.SetOutput(os.Stderr) })
	return l
}

type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
