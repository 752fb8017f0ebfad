//go:build linux

package simnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
	"github.com/nodelocaldns/nodelocaldns/internal/kubeproxy"
)

// SharedAPI is the API servers of a test binary's nodes with a real kube-proxy (NewWithKubeProxy): one per
// distinct kubeapi.Options, started for the first node that needs it, kept for the binary's later nodes,
// and stopped by Stop, which the package's TestMain calls after m.Run. One node at a time uses a server
// (the tests that build such nodes are not parallel); each starts from the objects writeObjects writes,
// those an earlier node's test left being deleted first. A test that stops or restarts the API server
// gives its node a server of its own (a nil SharedAPI).
type SharedAPI struct {
	mu      sync.Mutex
	servers map[string]*sharedServer
}

// sharedServer is one server of a SharedAPI.
type sharedServer struct {
	api *kubeapi.Server
	dir string
	// user is the test whose node uses the server, "" when none does.
	user string
}

// acquire returns the server for opts, started on first use, for t's node until t ends, after the removal
// of the objects an earlier node's test left. It fails t when another node uses the server.
func (s *SharedAPI) acquire(t testing.TB, opts kubeapi.Options) *kubeapi.Server {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	key := strings.Join(opts.ServiceCIDRs, ",")
	srv := s.servers[key]
	if srv == nil {
		bin := kubeapi.RequireBinaries(t)
		dir, err := os.MkdirTemp("", "nodelocaldns-simnode-api-") //nolint:usetesting // kept for the binary's later nodes, removed by Stop
		if err != nil {
			t.Fatalf("simnode: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), kubeProxyWait)
		defer cancel()
		api, err := kubeapi.NewWithOptions(ctx, bin, dir, opts)
		if err != nil {
			os.RemoveAll(dir)
			t.Fatalf("simnode: starting the shared API server: %v", err)
		}
		srv = &sharedServer{api: api, dir: dir}
		if s.servers == nil {
			s.servers = map[string]*sharedServer{}
		}
		s.servers[key] = srv
	}
	if srv.user != "" {
		t.Fatalf("simnode: the shared API server (Service ranges %v) is in use by the node of %s: nodes that share one must not run at once", opts.ServiceCIDRs, srv.user)
	}
	ctx, cancel := context.WithTimeout(context.Background(), kubeProxyWait)
	defer cancel()
	if err := clearObjects(ctx, kubernetes.NewForConfigOrDie(srv.api.AdminConfig())); err != nil {
		t.Fatalf("simnode: clearing the shared API server for the next node: %v", err)
	}
	srv.user = t.Name()
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		srv.user = ""
	})
	return srv.api
}

// clearObjects deletes what a node's test may have created or changed: its Node, every Service but the API
// server's own (default/kubernetes), and the EndpointSlices kubeproxy.SetEndpoints wrote. kube-proxy's
// ServiceAccount and its binding stay: kubeproxy.Grant writes the same again.
func clearObjects(ctx context.Context, admin kubernetes.Interface) error {
	if err := admin.CoreV1().Nodes().Delete(ctx, NodeName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Node %s: %w", NodeName, err)
	}
	svcs, err := admin.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Services: %w", err)
	}
	var errs []error
	for _, svc := range svcs.Items {
		if svc.Namespace == metav1.NamespaceDefault && svc.Name == "kubernetes" {
			continue
		}
		if err := admin.CoreV1().Services(svc.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting Service %s/%s: %w", svc.Namespace, svc.Name, err))
		}
	}
	slices, err := admin.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=" + kubeproxy.ManagedBy})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("listing EndpointSlices: %w", err))...)
	}
	for _, es := range slices.Items {
		if err := admin.DiscoveryV1().EndpointSlices(es.Namespace).Delete(ctx, es.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting EndpointSlice %s/%s: %w", es.Namespace, es.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Stop stops every server and removes its data.
func (s *SharedAPI) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, 0, 2*len(s.servers))
	for _, srv := range s.servers {
		errs = append(errs, srv.api.Stop(), os.RemoveAll(srv.dir))
	}
	s.servers = nil
	return errors.Join(errs...)
}
