package kubeapi

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestVersionsArePinned checks that the versions this package looks for are the ones the tools modules pin,
// which are the ones scripts/build-kube-apiserver.sh builds.
func TestVersionsArePinned(t *testing.T) {
	for _, tc := range []struct{ gomod, module, version string }{
		{"tools/kube-apiserver/go.mod", "k8s.io/kubernetes", KubernetesVersion},
		// internal/kubeproxy looks for kube-proxy at the same version.
		{"tools/kube-proxy/go.mod", "k8s.io/kubernetes", KubernetesVersion},
		{"tools/etcd/go.mod", "go.etcd.io/etcd/server/v3", EtcdVersion},
	} {
		b, err := os.ReadFile(tc.gomod)
		if err != nil {
			t.Fatal(err)
		}
		var pinned string
		for line := range strings.SplitSeq(string(b), "\n") {
			f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
			if len(f) >= 2 && f[0] == tc.module {
				pinned = f[1]
				break
			}
		}
		if pinned != tc.version {
			t.Errorf("%s requires %s %q; this package looks for %q", tc.gomod, tc.module, pinned, tc.version)
		}
	}
}

// TestBinariesAreThePinnedVersions asks each binary for its version.
func TestBinariesAreThePinnedVersions(t *testing.T) {
	bin := RequireBinaries(t)
	for _, tc := range []struct{ binary, want string }{
		{bin.APIServer, "Kubernetes " + KubernetesVersion},
		{bin.Etcd, "etcd Version: " + strings.TrimPrefix(EtcdVersion, "v")},
	} {
		out, err := exec.Command(tc.binary, "--version").CombinedOutput()
		if err != nil {
			t.Fatalf("%s --version: %v: %s", tc.binary, err, out)
		}
		if !strings.Contains(string(out), tc.want+"\n") {
			t.Errorf("%s --version says %q, want %q", tc.binary, out, tc.want)
		}
	}
}

// TestServer covers what the other tests rely on: the admin may do anything, a ServiceAccount gets a token
// and nothing else until RBAC grants it, objects survive a restart of kube-apiserver on the same address,
// and the audit log records the ServiceAccount's requests.
func TestServer(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(s.AdminConfig())

	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "probe"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, "probe", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest: %v", err)
	}
	sa := kubernetes.NewForConfigOrDie(s.TokenConfig(tr.Status.Token))
	_, err = sa.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("listing Services as a ServiceAccount without a Role: got %v, want Forbidden", err)
	}

	svc, err := admin.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "probe"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 53}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(svc.Spec.ClusterIP, "127.96.") {
		t.Errorf("ClusterIP %s is not in %s", svc.Spec.ClusterIP, ServiceCIDR)
	}

	url := s.URL()
	if err := s.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompactEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if s.URL() != url {
		t.Errorf("after a restart the API server is at %s, was %s", s.URL(), url)
	}
	again, err := admin.CoreV1().Services("default").Get(ctx, "probe", metav1.GetOptions{})
	if err != nil || again.Spec.ClusterIP != svc.Spec.ClusterIP {
		t.Fatalf("after a restart: %v, ClusterIP %v, want %s", err, again, svc.Spec.ClusterIP)
	}

	events, err := s.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	var refused bool
	for _, e := range events {
		if e.User.Username == "system:serviceaccount:default:probe" && e.Verb == "list" &&
			e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
			refused = true
		}
	}
	if !refused {
		t.Errorf("the audit log has no refused list of the ServiceAccount; it has %d events", len(events))
	}
}
