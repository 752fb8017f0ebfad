//go:build linux

package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
)

// TestManifestsStartTheirConfig runs each manifest's container arguments through node-cache's flags on
// the manifest's own ConfigMap, as the DaemonSet would on a node, and checks that the Corefile written is
// corefile.Render of the configuration the manifest claims, and free of hazards on a usual node.
func TestManifestsStartTheirConfig(t *testing.T) {
	const hostIP = "10.0.0.7" // status.hostIP of the simulated node
	t.Setenv("KUBE_DNS_SERVICE_HOST", "")
	t.Setenv("KUBE_DNS_UPSTREAM_SERVICE_HOST", "")
	for _, m := range kubernetes.Manifests {
		t.Run(m.File, func(t *testing.T) {
			objs, err := kubernetes.Load(m.File)
			if err != nil {
				t.Fatal(err)
			}
			c := objs.DaemonSets[0].Spec.Template.Spec.Containers[0]
			args := expandEnv(t, c)

			// The manifest writes -conf /etc/Corefile and reads the default -basecorefile and -kubednscm;
			// here they are files of the test.
			dir := t.TempDir()
			base, out := filepath.Join(dir, "Corefile.base"), filepath.Join(dir, "Corefile")
			if i := slices.Index(args, "-conf"); i < 0 || args[i+1] != "/etc/Corefile" {
				t.Fatalf("args %v: want -conf /etc/Corefile", args)
			} else {
				args[i+1] = out
			}
			writeFile(t, base, []byte(objs.ConfigMap("node-local-dns").Data["Corefile"]))
			writeKubeDNSDir(t, filepath.Join(dir, "kube-dns"), corefile.KubeDNS{})
			args = append(args, "-basecorefile", base, "-kubednscm", filepath.Join(dir, "kube-dns"))

			d, _, err := parseDropIn(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Sync(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			cfg := m.Config
			cfg.MetricsAddress = hostIP + ":9253"
			want, err := corefile.Render(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("the DaemonSet writes\n%s\nthe manifest's configuration renders\n%s", got, want)
			}
			hazards, err := corefile.Check(got, corefile.CheckOptions{ResolvConf: []byte("nameserver " + hostIP + "\n")})
			if err != nil || len(hazards) > 0 {
				t.Errorf("Check: %v %v", hazards, err)
			}
		})
	}
}

// expandEnv does what the kubelet does to $(VAR) in container arguments, for the manifests' one variable.
func expandEnv(t *testing.T, c corev1.Container) []string {
	t.Helper()
	values := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.hostIP" {
			t.Fatalf("unexpected env %+v", e)
		}
		values[e.Name] = "10.0.0.7"
	}
	args := slices.Clone(c.Args)
	for i, a := range args {
		for name, v := range values {
			a = strings.ReplaceAll(a, "$("+name+")", v)
		}
		if strings.Contains(a, "$(") {
			t.Fatalf("argument %q refers to an undefined variable", a)
		}
		args[i] = a
	}
	return args
}
