//go:build linux

package kubeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	manifests "github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/internal/helmtest"
	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
)

// TestManifestsStrict creates every object of every shipped manifest, as the YAML text an operator applies,
// with fieldValidation=Strict: an unknown or duplicate field, a value the API rejects, or any warning the API
// sends back fails the test. Each manifest's objects are deleted before the next is created.
func TestManifestsStrict(t *testing.T) {
	files, err := filepath.Glob("../../examples/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in examples/kubernetes (%v)", err)
	}
	s := kubeapi.Start(t)
	a := newApplier(t, s.AdminConfig())
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			a.createAll(t, data, nil)
		})
	}
}

// prometheusOperatorKinds are the chart's objects of prometheus-operator's API (serviceMonitor and
// prometheusRule in the values). The test API server does not serve monitoring.coreos.com: its
// CustomResourceDefinitions come from prometheus-operator, which is not available offline, and a schema
// written here would test the chart against our own guess. TestChartStrict skips objects of these kinds, and
// only of these; examples/kubernetes checks their content (the rules with promtool).
var prometheusOperatorKinds = []schema.GroupKind{
	{Group: "monitoring.coreos.com", Kind: "ServiceMonitor"},
	{Group: "monitoring.coreos.com", Kind: "PrometheusRule"},
}

// TestChartStrict does for the Helm chart what TestManifestsStrict does for the manifests: `helm template`
// with the defaults, with each of its ci/*-values.yaml (knobs-values.yaml sets every knob) and with
// trafficDistribution PreferSameZone, every object created with fieldValidation=Strict, failing on any
// warning, read back (kube-dns-upstream's trafficDistribution kept) and deleted before the next values file. Objects of
// prometheusOperatorKinds are skipped; any other kind the API does not serve fails the test, and so does an
// exclusion that no longer skips anything.
func TestChartStrict(t *testing.T) {
	type chartCase struct {
		name   string
		args   []string
		stream []byte
	}
	cases := []chartCase{{name: "defaults"}}
	for _, v := range helmtest.CIValues(t) {
		cases = append(cases, chartCase{name: filepath.Base(v), args: []string{"-f", v}})
	}
	// ci/knobs-values.yaml sets PreferSameNode.
	cases = append(cases, chartCase{name: "trafficDistribution PreferSameZone", args: []string{"--set", "upstreamTrafficDistribution=PreferSameZone"}})
	// Rendered first: without helm the test skips (or fails) before an API server starts.
	for i := range cases {
		out, err := helmtest.Template(t, cases[i].args...)
		if err != nil {
			t.Fatal(err)
		}
		cases[i].stream = out
	}
	s := kubeapi.Start(t)
	a := newApplier(t, s.AdminConfig())
	admin := kubernetes.NewForConfigOrDie(s.AdminConfig())
	skipped := map[schema.GroupKind]bool{}
	ran := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, gk := range a.createAll(t, c.stream, prometheusOperatorKinds) {
				skipped[gk] = true
			}
			checkTrafficDistribution(t, admin, c.stream)
			ran++
		})
	}
	if ran < len(cases) {
		return // a -run pattern left some out, or one stopped early: the exclusions cannot be judged
	}
	for _, gk := range prometheusOperatorKinds {
		if !skipped[gk] {
			t.Errorf("no values file renders a %s, which this test excludes; drop it from prometheusOperatorKinds (and the README)", gk)
		}
	}
}

// checkTrafficDistribution reads kube-dns-upstream back and checks that it kept the trafficDistribution the
// chart gave it: a field behind a feature gate that is off is dropped without an error or a warning.
func checkTrafficDistribution(t *testing.T, admin kubernetes.Interface, stream []byte) {
	t.Helper()
	objs, err := manifests.Decode(stream)
	if err != nil {
		t.Fatal(err)
	}
	want := objs.Service("kube-dns-upstream")
	if want == nil {
		t.Fatal("the chart renders no kube-dns-upstream")
	}
	got, err := admin.CoreV1().Services(want.Namespace).Get(context.Background(), want.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deref := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	if w, g := deref(want.Spec.TrafficDistribution), deref(got.Spec.TrafficDistribution); w != g {
		t.Errorf("kube-dns-upstream: trafficDistribution %q created, %q read back", w, g)
	}
}

// applier creates objects from YAML documents through the API's REST paths.
type applier struct {
	cfg    *rest.Config
	client *http.Client
	mapper meta.RESTMapper
}

func newApplier(t *testing.T, cfg *rest.Config) *applier {
	t.Helper()
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatalf("API discovery: %v", err)
	}
	return &applier{cfg: cfg, client: client, mapper: restmapper.NewDiscoveryRESTMapper(groups)}
}

var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// createAll creates every object of a multi-document YAML stream, reads each back, and deletes them all,
// in reverse, when the test ends. An object whose kind the API does not serve fails the test, unless the
// kind is one of unserved: such objects are left out, and their kinds returned.
func (a *applier) createAll(t *testing.T, stream []byte, unserved []schema.GroupKind) (skipped []schema.GroupKind) {
	t.Helper()
	var created []string
	t.Cleanup(func() {
		for _, c := range slices.Backward(created) {
			// Background: the test API server runs no garbage collector, which a Job's default (orphan)
			// propagation waits for, so the next values file could not create it again.
			if err := a.do(http.MethodDelete, c, backgroundDeletion, nil); err != nil {
				t.Errorf("deleting %s: %v", c, err)
			}
		}
	})
	n := 0
	for _, doc := range documentSeparator.Split(string(stream), -1) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("document %d: %v", n, err)
		}
		if head.Kind == "" {
			continue // only comments
		}
		n++
		what := fmt.Sprintf("%s %s/%s", head.Kind, head.Metadata.Namespace, head.Metadata.Name)
		gv, err := schema.ParseGroupVersion(head.APIVersion)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		gk := gv.WithKind(head.Kind).GroupKind()
		mapping, err := a.mapper.RESTMapping(gk, gv.Version)
		if meta.IsNoMatchError(err) && slices.Contains(unserved, gk) {
			t.Logf("%s: skipped, the API does not serve %s", what, head.APIVersion)
			if !slices.Contains(skipped, gk) {
				skipped = append(skipped, gk)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: the API does not serve it: %v", what, err)
		}
		collection := "/api/" + gv.Version
		if gv.Group != "" {
			collection = "/apis/" + gv.Group + "/" + gv.Version
		}
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if head.Metadata.Namespace == "" {
				t.Errorf("%s has no namespace; it would land in the namespace of whoever applies it", what)
				head.Metadata.Namespace = "default"
			}
			a.ensureNamespace(t, head.Metadata.Namespace)
			collection += "/namespaces/" + head.Metadata.Namespace
		}
		collection += "/" + mapping.Resource.Resource
		var warnings []string
		err = a.do(http.MethodPost, collection+"?fieldValidation="+metav1.FieldValidationStrict, doc, &warnings)
		if err != nil {
			t.Errorf("creating %s: %v", what, err)
			continue
		}
		created = append(created, collection+"/"+head.Metadata.Name)
		for _, w := range warnings {
			t.Errorf("creating %s: the API warns: %s", what, w)
		}
	}
	if n == 0 {
		t.Fatal("no objects in the stream")
	}
	// What was created reads back.
	for _, path := range created {
		if err := a.do(http.MethodGet, path, "", nil); err != nil {
			t.Errorf("reading back %s: %v", path, err)
		}
	}
	return skipped
}

// backgroundDeletion is the body of a DELETE that deletes the object at once, leaving its dependents to the
// garbage collector.
const backgroundDeletion = `{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}`

// ensureNamespace creates namespace unless it exists (the chart puts its ServiceMonitor and dashboard where
// the values say, e.g. monitoring). It stays: the test API server runs no namespace controller to finish
// deleting one.
func (a *applier) ensureNamespace(t *testing.T, namespace string) {
	t.Helper()
	if a.do(http.MethodGet, "/api/v1/namespaces/"+namespace, "", nil) == nil {
		return
	}
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"Namespace","metadata":{"name":%q}}`, namespace)
	if err := a.do(http.MethodPost, "/api/v1/namespaces", body, nil); err != nil {
		t.Fatalf("creating namespace %s: %v", namespace, err)
	}
}

// do sends one request; a YAML body goes as application/yaml, as written. It returns the API's Status
// message for an error, and the Warning headers in warnings when that is not nil.
func (a *applier) do(method, path, body string, warnings *[]string) error {
	req, err := http.NewRequestWithContext(context.Background(), method, a.cfg.Host+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/yaml")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if warnings != nil {
		*warnings = resp.Header.Values("Warning")
	}
	if resp.StatusCode/100 == 2 {
		return nil
	}
	var status metav1.Status
	if json.Unmarshal(b, &status) == nil && status.Message != "" {
		return fmt.Errorf("%s: %s", resp.Status, status.Message)
	}
	return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
}
