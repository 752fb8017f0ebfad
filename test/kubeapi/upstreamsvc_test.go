//go:build linux

package kubeapi

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
)

// TestUpstreamSvcFollowsService runs upstreamsvc in node-cache with a token of the manifests'
// ServiceAccount, allowed nothing but the manifests' Role, against a real API server: it resolves
// kube-dns-upstream, keeps the address while the Service is deleted, follows a re-created Service to its new
// ClusterIP, and keeps following across a restart of kube-apiserver and across a watch that expired
// (etcd compacted past the resourceVersion it resumes from).
func TestUpstreamSvcFollowsService(t *testing.T) {
	s := kubeapi.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(s.AdminConfig())
	objs := manifest(t)
	token := serviceAccountToken(t, admin, objs)
	createRole(t, admin, objs)
	createRoleBinding(t, admin, objs)
	const ns, name = "kube-system", "kube-dns-upstream"
	t.Cleanup(func() {
		if t.Failed() {
			logRequests(t, serviceAccountEvents(t, s, objs))
		}
	})

	// The Role is as narrow as the README says: list and watch of the one Service, through the field
	// selector upstreamsvc sends, and nothing else.
	// The API server's authorizer learns of a new RoleBinding from its own watch, a moment after the create
	// returns: Forbidden until then is the API's normal lag, any other error is not.
	sa := kubernetes.NewForConfigOrDie(s.TokenConfig(token))
	var listErr error
	waitFor(t, "permission for the ServiceAccount to list "+ns+"/"+name, func() bool {
		_, listErr = sa.CoreV1().Services(ns).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		return !apierrors.IsForbidden(listErr)
	})
	if listErr != nil {
		t.Fatalf("the ServiceAccount cannot list %s/%s with a field selector: %v", ns, name, listErr)
	}
	if _, err := sa.CoreV1().Services(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the ServiceAccount lists every Service of %s: %v, want Forbidden", ns, err)
	}
	if _, err := sa.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the ServiceAccount gets %s/%s: %v, want Forbidden (the Role grants no get)", ns, name, err)
	}

	// upstreamsvc reaches the API through a relay the test can cut.
	proxy := startAPIProxy(t, strings.TrimPrefix(s.URL(), "https://"))
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := s.WriteKubeconfig(kubeconfig, proxy.url(), token); err != nil {
		t.Fatal(err)
	}
	first := startResponder(t)
	createService(t, admin, upstreamService(t, objs, first))
	nc := startNodeCache(t, "kubeconfig "+kubeconfig)

	// Resolved from the API.
	nc.waitUpstream(t, "api "+first.addr())
	nc.waitLog(t, "Forwarding to "+first.addr(), "from api")
	nc.wantAnsweredBy(t, first)

	// Deleted: the address stays.
	deleteService(t, admin, ns, name)
	nc.waitLog(t, "was deleted; keeping "+first.addr())
	nc.wantAnsweredBy(t, first)
	if got := nc.upstreams(); len(got) != 1 || got[0] != "api "+first.addr() {
		t.Errorf("after the deletion upstreams are %v, want the last address from the API", got)
	}

	// Re-created with another ClusterIP: followed.
	second := startResponder(t)
	createService(t, admin, upstreamService(t, objs, second))
	nc.waitUpstream(t, "api "+second.addr())
	nc.wantAnsweredBy(t, second)

	// kube-apiserver restarts (SIGTERM, then started again on the same address): queries keep going to
	// the last address while it is away, and the watch comes back.
	proxy.down()
	if err := s.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	watchesBefore := countWatches(serviceAccountEvents(t, s, objs))
	nc.wantAnsweredBy(t, second)
	if err := s.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.up()
	waitFor(t, "a new watch of upstreamsvc after the restart", func() bool {
		return countWatches(serviceAccountEvents(t, s, objs)) > watchesBefore
	})
	deleteService(t, admin, ns, name)
	third := startResponder(t)
	createService(t, admin, upstreamService(t, objs, third))
	nc.waitUpstream(t, "api "+third.addr())
	nc.wantAnsweredBy(t, third)

	// The watch expires: while upstreamsvc cannot reach the API, kube-apiserver restarts and etcd's
	// history is compacted past every resourceVersion upstreamsvc has seen. A watch resumed from one of
	// them is answered with 410 Gone ("too old resource version"); client-go may also start over without
	// trying. Either way upstreamsvc must get the whole state again, and follow the next change.
	proxy.down()
	if err := s.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	compacted, err := s.CompactEtcd(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eventsBefore := len(serviceAccountEvents(t, s, objs))
	if err := s.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.up()
	waitFor(t, "upstreamsvc starting over after its resourceVersion was compacted away", func() bool {
		for _, e := range serviceAccountEvents(t, s, objs)[eventsBefore:] {
			if requestStart(e) && startsOver(e, compacted) {
				return true
			}
		}
		return false
	})
	for _, e := range serviceAccountEvents(t, s, objs)[eventsBefore:] {
		rv, _ := strconv.ParseInt(e.Query().Get("resourceVersion"), 10, 64)
		if requestStart(e) && e.Verb == "watch" && e.Query().Get("sendInitialEvents") != "true" && rv < compacted {
			t.Logf("upstreamsvc resumed its watch from compacted resourceVersion %d (compacted at %d)", rv, compacted)
		}
	}
	deleteService(t, admin, ns, name)
	fourth := startResponder(t)
	createService(t, admin, upstreamService(t, objs, fourth))
	nc.waitUpstream(t, "api "+fourth.addr())
	nc.wantAnsweredBy(t, fourth)

	// Everything upstreamsvc asked for was a list or watch of the one Service, and nothing was refused
	// (a 410 for the expired watch is expected).
	for _, e := range serviceAccountEvents(t, s, objs) {
		if e.ObjectRef == nil || e.ObjectRef.Resource != "services" || e.ObjectRef.Namespace != ns ||
			(e.Verb != "list" && e.Verb != "watch") || e.Query().Get("fieldSelector") != "metadata.name="+name {
			t.Errorf("upstreamsvc asked for %s %s", e.Verb, e.RequestURI)
		}
		if e.ResponseStatus != nil && (e.ResponseStatus.Code == 401 || e.ResponseStatus.Code == 403) {
			t.Errorf("%s %s was answered %d: %s", e.Verb, e.RequestURI, e.ResponseStatus.Code, e.ResponseStatus.Message)
		}
	}
}

// logRequests logs audit events, one line each, for a test that failed.
func logRequests(t *testing.T, events []kubeapi.AuditEvent) {
	var b strings.Builder
	for _, e := range events {
		code := 0
		if e.ResponseStatus != nil {
			code = e.ResponseStatus.Code
		}
		fmt.Fprintf(&b, "%s %s %s %d\n", e.Stage, e.Verb, e.RequestURI, code)
	}
	t.Logf("upstreamsvc's requests in the audit log:\n%s", b.String())
}

// countWatches counts the watches among events that started.
func countWatches(events []kubeapi.AuditEvent) int {
	n := 0
	for _, e := range events {
		if e.Verb == "watch" && e.Stage == "ResponseStarted" {
			n++
		}
	}
	return n
}

// requestStart reports whether e marks a request's answer beginning: a watch has an event when its stream
// starts and another when it ends (as at a restart, long after the request); other requests, and a watch
// refused outright, have one.
func requestStart(e kubeapi.AuditEvent) bool {
	if e.Verb != "watch" || e.Stage == "ResponseStarted" {
		return true
	}
	return e.ResponseStatus != nil && e.ResponseStatus.Code >= 400
}

// startsOver reports whether e gets the Service's current state instead of resuming from a resourceVersion
// older than compacted: a list, or a watch that sends the initial state first (client-go's watch-list), or one
// from a resourceVersion at or after compacted.
func startsOver(e kubeapi.AuditEvent, compacted int64) bool {
	q := e.Query()
	rv, _ := strconv.ParseInt(q.Get("resourceVersion"), 10, 64)
	switch e.Verb {
	case "list":
		return true
	case "watch":
		return q.Get("sendInitialEvents") == "true" || rv >= compacted
	}
	return false
}

// TestUpstreamSvcRefusedByRBAC runs upstreamsvc with the manifests' ServiceAccount and Role but without the
// RoleBinding: the API refuses it, the plugin says so and uses its fallback (or, without one, refuses to
// start), and once the RoleBinding exists it switches to the Service's ClusterIP, as the README says.
func TestUpstreamSvcRefusedByRBAC(t *testing.T) {
	s := kubeapi.Start(t)
	admin := kubernetes.NewForConfigOrDie(s.AdminConfig())
	objs := manifest(t)
	token := serviceAccountToken(t, admin, objs)
	createRole(t, admin, objs)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := s.WriteKubeconfig(kubeconfig, s.URL(), token); err != nil {
		t.Fatal(err)
	}
	upstream := startResponder(t)
	createService(t, admin, upstreamService(t, objs, upstream))
	// The plugin's words, then the API's.
	refused := "the Kubernetes API refused to list Service kube-system/kube-dns-upstream"
	refusal := `services "kube-dns-upstream" is forbidden: User "system:serviceaccount:kube-system:node-local-dns" cannot list resource "services"`

	t.Run("without fallback setup fails", func(t *testing.T) {
		out, err := runNodeCacheToExit(t, "kubeconfig "+kubeconfig)
		if err == nil {
			t.Fatalf("node-cache started without any address for the upstream; output:\n%s", out)
		}
		for _, want := range []string{`no upstream for Service "kube-dns-upstream" in namespace "kube-system"`, refused, refusal} {
			if !strings.Contains(out, want) {
				t.Errorf("node-cache's output does not say %q:\n%s", want, out)
			}
		}
	})

	t.Run("with fallback", func(t *testing.T) {
		fallback := startResponder(t)
		nc := startNodeCache(t, "kubeconfig "+kubeconfig, "fallback "+fallback.addr())
		nc.waitUpstream(t, "fallback "+fallback.addr())
		nc.waitLog(t, refused, refusal, "using "+fallback.addr()+" from fallback until the API has it")
		nc.wantAnsweredBy(t, fallback)
		// The watch keeps trying, and says why it fails.
		nc.waitLog(t, "Failed to watch", "is forbidden")

		createRoleBinding(t, admin, objs)
		nc.waitUpstream(t, "api "+upstream.addr())
		nc.wantAnsweredBy(t, upstream)
	})
}
