//go:build linux

package main

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	manifests "github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/internal/configmapvolume"
	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
)

// TestKubeDNSConfigMapFromAPI checks the drop-in's ConfigMap path against a real API server. The manifest's
// two ConfigMaps (node-local-dns, the base Corefile, and kube-dns, with stubDomains and upstreamNameservers)
// are created through the API, read back, and written to disk the way the kubelet projects a ConfigMap
// volume (timestamped directory, `..data` symlink swapped atomically, one symlink per key, the volume's
// items), at the paths the DaemonSet mounts them on. node-cache, started with the DaemonSet's arguments,
// must then write the Corefile of the manifest's configuration with the API's stub domains and upstream
// nameservers, follow an update of the ConfigMap, and keep a bad one out.
func TestKubeDNSConfigMapFromAPI(t *testing.T) {
	s := kubeapi.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(s.AdminConfig())
	strict := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}

	m := manifests.Manifests[0]
	objs, err := manifests.Load(m.File)
	if err != nil {
		t.Fatal(err)
	}
	pod := objs.DaemonSets[0].Spec.Template.Spec
	c := pod.Containers[slices.IndexFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == "node-cache" })]

	// The kubelet's view: each ConfigMap volume of the container, projected under root at its mount path.
	root := t.TempDir()
	local := func(path string) string { return filepath.Join(root, path) }
	volumeOf := func(configMap string) (corev1.Volume, corev1.VolumeMount) {
		t.Helper()
		for _, v := range pod.Volumes {
			if v.ConfigMap == nil || v.ConfigMap.Name != configMap {
				continue
			}
			for _, vm := range c.VolumeMounts {
				if vm.Name == v.Name {
					return v, vm
				}
			}
		}
		t.Fatalf("the node-cache container mounts no volume of ConfigMap %s", configMap)
		return corev1.Volume{}, corev1.VolumeMount{}
	}
	baseVolume, baseMount := volumeOf("node-local-dns")
	kubeDNSVolume, kubeDNSMount := volumeOf("kube-dns")
	// node-cache reads its defaults there; the DaemonSet relies on them.
	if filepath.Dir(defaultBaseCorefile) != baseMount.MountPath || defaultKubeDNSCM != kubeDNSMount.MountPath {
		t.Fatalf("node-cache reads %s and %s; the DaemonSet mounts the ConfigMaps on %s and %s",
			defaultBaseCorefile, defaultKubeDNSCM, baseMount.MountPath, kubeDNSMount.MountPath)
	}
	baseDir, kubeDNSDir := newProjectedVolume(t, local(baseMount.MountPath)), newProjectedVolume(t, local(kubeDNSMount.MountPath))

	base := objs.ConfigMap("node-local-dns").DeepCopy()
	if _, err := admin.CoreV1().ConfigMaps(base.Namespace).Create(ctx, base, strict); err != nil {
		t.Fatal(err)
	}
	baseDir.project(t, readConfigMap(t, admin, base.Namespace, base.Name), baseVolume.ConfigMap.Items)

	kubeDNS := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system"},
		Data: map[string]string{
			corefile.StubDomainsKey:         `{"corp.example": ["10.150.0.10", "10.150.0.11:5353"], "acme.test": ["fd00:150::10"]}`,
			corefile.UpstreamNameserversKey: `["192.0.2.53", "[2001:db8::53]:5353"]`,
			// kube-dns's own key, which a node cache ignores.
			"federations": `{"myfed": "example.com"}`,
		},
	}
	if _, err := admin.CoreV1().ConfigMaps(kubeDNS.Namespace).Create(ctx, kubeDNS, strict); err != nil {
		t.Fatal(err)
	}
	kubeDNSDir.project(t, readConfigMap(t, admin, kubeDNS.Namespace, kubeDNS.Name), kubeDNSVolume.ConfigMap.Items)

	// node-cache with the DaemonSet's arguments; only -conf, an emptyDir path in the Pod, moves.
	out := filepath.Join(root, "Corefile")
	args := expandEnv(t, c)
	if i := slices.Index(args, "-conf"); i < 0 || i+1 == len(args) {
		t.Fatalf("args %v have no -conf", args)
	} else {
		args[i+1] = out
	}
	for _, a := range args {
		if a == "-basecorefile" || a == "-kubednscm" {
			t.Fatalf("args %v set %s; this test projects the ConfigMaps at node-cache's defaults", args, a)
		}
	}
	args = append(args, "-basecorefile", local(defaultBaseCorefile), "-kubednscm", local(defaultKubeDNSCM))
	d, _, err := parseDropIn(t, args...)
	if err != nil {
		t.Fatal(err)
	}

	// want is the Corefile of the manifest's configuration with the kube-dns ConfigMap as the API has it.
	want := func(cm *corev1.ConfigMap) string {
		t.Helper()
		kd, err := corefile.ParseKubeDNS(cm.Data)
		if err != nil {
			t.Fatalf("the API's kube-dns ConfigMap: %v", err)
		}
		cfg := m.Config
		cfg.MetricsAddress = "10.0.0.7:9253" // status.hostIP, as expandEnv sets it
		cfg.StubDomains, cfg.NodeUpstreams = kd.StubDomains, kd.UpstreamNameservers
		b, err := corefile.Render(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	written := func() string {
		t.Helper()
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	fromAPI := readConfigMap(t, admin, kubeDNS.Namespace, kubeDNS.Name)
	if got, want := written(), want(fromAPI); got != want {
		t.Fatalf("node-cache wrote\n%s\nthe manifest's configuration with the API's kube-dns ConfigMap renders\n%s", got, want)
	}
	for _, s := range []string{"corp.example:53", "acme.test:53", "10.150.0.11:5353", "[2001:db8::53]:5353"} {
		if !strings.Contains(written(), s) {
			t.Errorf("the Corefile does not mention %s:\n%s", s, written())
		}
	}

	// An update through the API, projected with the kubelet's atomic swap, is followed.
	fromAPI.Data[corefile.StubDomainsKey] = `{"corp.example": ["10.150.0.12"]}`
	fromAPI.Data[corefile.UpstreamNameserversKey] = `["192.0.2.54"]`
	if _, err := admin.CoreV1().ConfigMaps(kubeDNS.Namespace).Update(ctx, fromAPI, metav1.UpdateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
		t.Fatal(err)
	}
	updated := readConfigMap(t, admin, kubeDNS.Namespace, kubeDNS.Name)
	kubeDNSDir.project(t, updated, kubeDNSVolume.ConfigMap.Items)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	if got, want := written(), want(updated); got != want {
		t.Fatalf("after the update node-cache wrote\n%s\nwant\n%s", got, want)
	}
	if strings.Contains(written(), "acme.test") {
		t.Errorf("the stub domain removed through the API is still in the Corefile")
	}

	// The API stores any text; a value node-cache cannot use is kept out and the Corefile stays.
	good := written()
	updated.Data[corefile.UpstreamNameserversKey] = `["not-an-address"]`
	if _, err := admin.CoreV1().ConfigMaps(kubeDNS.Namespace).Update(ctx, updated, metav1.UpdateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
		t.Fatal(err)
	}
	kubeDNSDir.project(t, readConfigMap(t, admin, kubeDNS.Namespace, kubeDNS.Name), kubeDNSVolume.ConfigMap.Items)
	if err := d.Sync(); err == nil || !strings.Contains(err.Error(), "not-an-address") {
		t.Errorf("Sync of a bad kube-dns ConfigMap: %v, want an error naming the bad value", err)
	}
	if written() != good {
		t.Errorf("a bad kube-dns ConfigMap changed the Corefile to\n%s", written())
	}
}

func readConfigMap(t *testing.T, client kubernetes.Interface, namespace, name string) *corev1.ConfigMap {
	t.Helper()
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading ConfigMap %s/%s back: %v", namespace, name, err)
	}
	return cm
}

// projectedVolume is a ConfigMap volume laid out as the kubelet's atomic writer does (package
// configmapvolume), with the volume's items.
type projectedVolume struct {
	v *configmapvolume.Volume
}

func newProjectedVolume(t *testing.T, dir string) *projectedVolume {
	t.Helper()
	v, err := configmapvolume.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &projectedVolume{v: v}
}

// project writes cm's data (every key, or only items when the volume lists them) as the volume's new
// content.
func (v *projectedVolume) project(t *testing.T, cm *corev1.ConfigMap, items []corev1.KeyToPath) {
	t.Helper()
	files := map[string]string{}
	if len(items) == 0 {
		maps.Copy(files, cm.Data)
	}
	for _, it := range items {
		val, ok := cm.Data[it.Key]
		if !ok {
			t.Fatalf("ConfigMap %s/%s has no key %s for the volume", cm.Namespace, cm.Name, it.Key)
		}
		files[it.Path] = val
	}
	if err := v.v.Project(files); err != nil {
		t.Fatal(err)
	}
}
