//go:build linux

package image

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// manifestFile is the manifest whose DaemonSet the containers run as: kube-proxy in iptables mode, the
// simulated node's.
const manifestFile = "nodelocaldns-iptables.yaml"

// hostIP is the node's address the kubelet gives the Pod as status.hostIP: the node's side of its link to
// the gateway.
const hostIP = simnode.NodeExtSideIP

// tools are the commands these tests run besides simnode's.
var tools = []string{"runc", "umoci", "apt-get", "dpkg-deb", "git", "go", "nft", "getent", "dig", "iptables-save", "conntrack"}

// pods numbers the Pods of this test binary, whose containers' names must differ.
var pods atomic.Int32

var (
	buildOnce sync.Once
	built     string // the directory build/image.sh wrote into
	buildErr  error
	buildTime time.Duration
	buildRoot string // the temporary directory of this test binary's builds
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildRoot != "" {
		os.RemoveAll(buildRoot)
	}
	os.Exit(code)
}

// repoRoot is the repository's top directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildImage runs build/image.sh into a new directory under buildRoot and returns that directory.
func buildImage(t *testing.T, name string) (string, time.Duration) {
	t.Helper()
	if buildRoot == "" {
		dir, err := os.MkdirTemp("", "image-test") //nolint:usetesting // shared by the binary's tests; TestMain removes it
		if err != nil {
			t.Fatal(err)
		}
		buildRoot = dir
	}
	out := filepath.Join(buildRoot, name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(t), "build", "image.sh"))
	cmd.Env = append(os.Environ(), "IMAGE_OUT="+out)
	started := time.Now()
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build/image.sh: %v\n%s", err, output)
	}
	return out, time.Since(started)
}

// image builds the image once for the test binary and returns the directory it is in.
func image(t *testing.T) string {
	t.Helper()
	privtest.RequirePrivileged(t, tools...)
	buildOnce.Do(func() {
		// A failed build fails the first test; the others report it too.
		defer func() {
			if built == "" && buildErr == nil {
				buildErr = fmt.Errorf("build/image.sh failed in an earlier test")
			}
		}()
		built, buildTime = buildImage(t, "first")
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// layout is what an OCI image layout's index names and its one image holds.
type layout struct {
	Name, Tag, Digest string
	Entrypoint        []string
	Env               []string
	Size              int64 // the layers' compressed bytes
}

func readLayout(t *testing.T, dir string) layout {
	t.Helper()
	var idx struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	readJSON(t, filepath.Join(dir, "index.json"), &idx)
	if len(idx.Manifests) != 1 {
		t.Fatalf("index.json names %d images, want 1", len(idx.Manifests))
	}
	m := idx.Manifests[0]
	name, tag, _ := strings.Cut(m.Annotations["io.containerd.image.name"], ":")
	l := layout{Name: name, Tag: tag, Digest: m.Digest}
	if got := m.Annotations["org.opencontainers.image.ref.name"]; got != tag {
		t.Errorf("index.json: ref.name %q, image name %q", got, m.Annotations["io.containerd.image.name"])
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Size int64 }
	}
	readJSON(t, blob(dir, m.Digest), &manifest)
	for _, layer := range manifest.Layers {
		l.Size += layer.Size
	}
	var cfg struct {
		Config struct {
			Entrypoint []string
			Env        []string
		}
	}
	readJSON(t, blob(dir, manifest.Config.Digest), &cfg)
	l.Entrypoint, l.Env = cfg.Config.Entrypoint, cfg.Config.Env
	return l
}

func blob(dir, digest string) string {
	return filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestImageIsTheManifestsAndReproducible: the image is named as the manifests' containers name theirs and
// starts /node-cache, and a second build from the same tree gives the same digest, to the byte.
func TestImageIsTheManifestsAndReproducible(t *testing.T) {
	first := image(t)
	l := readLayout(t, filepath.Join(first, "image"))
	objs, err := kubernetes.Load(manifestFile)
	if err != nil {
		t.Fatal(err)
	}
	pod := objs.DaemonSets[0].Spec.Template.Spec
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		if c.Image != l.Name+":"+l.Tag {
			t.Errorf("%s's container %s runs %s; make image makes %s:%s", manifestFile, c.Name, c.Image, l.Name, l.Tag)
		}
		if len(c.Command) != 0 {
			t.Errorf("container %s sets a command %v; the image's entry point is %v", c.Name, c.Command, l.Entrypoint)
		}
	}
	if !slices.Equal(l.Entrypoint, []string{"/node-cache"}) {
		t.Errorf("entry point %v, want [/node-cache]", l.Entrypoint)
	}

	second, again := buildImage(t, "second")
	if l2 := readLayout(t, filepath.Join(second, "image")); l2.Digest != l.Digest {
		t.Errorf("two builds of the same tree: %s and %s", l.Digest, l2.Digest)
	}
	a, err := os.ReadFile(filepath.Join(first, "node-cache-image.tar"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(second, "node-cache-image.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Errorf("the two oci-archive tarballs differ")
	}
	t.Logf("%s:%s %s, %.1f MB compressed; built in %v, again in %v", l.Name, l.Tag, l.Digest, float64(l.Size)/1e6,
		buildTime.Round(time.Second), again.Round(time.Second))
}

// runtimeDefaultCaps are the capabilities containerd and CRI-O give a container that asks for nothing more
// (containerd's oci.WithDefaultUnixCaps); a manifest's securityContext adds to them or drops from them.
var runtimeDefaultCaps = []string{"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
	"SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"}

// capabilities returns the capabilities a container of the manifest gets, as the kubelet computes them.
func capabilities(c corev1.Container) []string {
	caps := slices.Clone(runtimeDefaultCaps)
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		return caps
	}
	for _, d := range sc.Capabilities.Drop {
		if d == "ALL" {
			caps = nil
		}
		caps = slices.DeleteFunc(caps, func(c string) bool { return c == string(d) })
	}
	for _, a := range sc.Capabilities.Add {
		if !slices.Contains(caps, string(a)) {
			caps = append(caps, string(a))
		}
	}
	slices.Sort(caps)
	return caps
}

// pod is the DaemonSet's Pod on the simulated node: the files its volumes are and the runtime's state.
type pod struct {
	t       *testing.T
	n       *simnode.Node
	rootfs  string
	dir     string
	state   string // runc's --root
	spec    corev1.PodSpec
	volumes map[string]string // volume name -> the host path it is
	image   layout
	prefix  string
}

// newPod unpacks the image with umoci and lays out the Pod's volumes as the kubelet would on the node.
func newPod(t *testing.T, n *simnode.Node, dir string, objs *kubernetes.Objects) *pod {
	t.Helper()
	p := &pod{t: t, n: n, dir: t.TempDir(), spec: objs.DaemonSets[0].Spec.Template.Spec, volumes: map[string]string{},
		image: readLayout(t, filepath.Join(dir, "image")), prefix: fmt.Sprintf("nlt%d-%d", os.Getpid()%100000, pods.Add(1))}
	p.state = filepath.Join(p.dir, "runc")
	bundle := filepath.Join(p.dir, "unpacked")
	if out, err := exec.Command("umoci", "unpack", "--image", filepath.Join(dir, "image")+":"+p.image.Tag, bundle).CombinedOutput(); err != nil {
		t.Fatalf("umoci unpack: %v\n%s", err, out)
	}
	p.rootfs = filepath.Join(bundle, "rootfs")

	configMaps := map[string]map[string]string{}
	for _, cm := range objs.ConfigMaps {
		configMaps[cm.Name] = cm.Data
	}
	for _, v := range p.spec.Volumes {
		path := filepath.Join(p.dir, "volumes", v.Name)
		switch {
		case v.HostPath != nil:
			// FileOrCreate: an empty file, the test's own rather than the node's /run/xtables.lock.
			if *v.HostPath.Type != corev1.HostPathFileOrCreate {
				t.Fatalf("volume %s: hostPath type %s", v.Name, *v.HostPath.Type)
			}
			writeFile(t, path, "")
		case v.ConfigMap != nil:
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
			data, ok := configMaps[v.ConfigMap.Name]
			if !ok && (v.ConfigMap.Optional == nil || !*v.ConfigMap.Optional) {
				t.Fatalf("volume %s: ConfigMap %s is not in the manifest", v.Name, v.ConfigMap.Name)
			}
			for _, item := range v.ConfigMap.Items {
				writeFile(t, filepath.Join(path, item.Path), data[item.Key])
			}
			if len(v.ConfigMap.Items) == 0 {
				for k, d := range data {
					writeFile(t, filepath.Join(path, k), d)
				}
			}
		case v.EmptyDir != nil:
			if err := os.MkdirAll(path, 0o777); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("volume %s: a kind this test does not lay out", v.Name)
		}
		p.volumes[v.Name] = path
	}
	// dnsPolicy Default: the node's resolv.conf, which names the node's resolver.
	writeFile(t, filepath.Join(p.dir, "resolv.conf"), "nameserver "+simnode.ExtResolverIP+"\n")
	writeFile(t, filepath.Join(p.dir, "hosts"), "127.0.0.1 localhost\n")
	writeFile(t, filepath.Join(p.dir, "hostname"), "node\n")
	return p
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// container returns the manifest's container name.
func (p *pod) container(name string) corev1.Container {
	p.t.Helper()
	for _, c := range slices.Concat(p.spec.InitContainers, p.spec.Containers) {
		if c.Name == name {
			return c
		}
	}
	p.t.Fatalf("the manifest has no container %s", name)
	return corev1.Container{}
}

// env is the container's environment as the kubelet sets it: the image's, the manifest's (status.hostIP for
// HOST_IP), and the variables of the namespace's Services the cache uses (no KUBERNETES_SERVICE_HOST: the
// simulated node has no API server, as in the e2e tier).
func (p *pod) env(c corev1.Container) []string {
	p.t.Helper()
	env := slices.Clone(p.image.Env)
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP":
			env = append(env, e.Name+"="+hostIP)
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		default:
			p.t.Fatalf("container %s: env %s from a source this test does not give", c.Name, e.Name)
		}
	}
	return append(env, "KUBE_DNS_UPSTREAM_SERVICE_HOST="+simnode.UpstreamClusterIP, "KUBE_DNS_UPSTREAM_SERVICE_PORT=53",
		"KUBE_DNS_SERVICE_HOST="+simnode.KubeDNSClusterIP, "KUBE_DNS_SERVICE_PORT=53")
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// args expands the kubelet's $(VAR) references in the container's arguments.
func (p *pod) args(c corev1.Container, env []string) []string {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	out := make([]string, len(c.Args))
	for i, a := range c.Args {
		out[i] = varRef.ReplaceAllStringFunc(a, func(ref string) string {
			if v, ok := vars[varRef.FindStringSubmatch(ref)[1]]; ok {
				return v
			}
			return ref
		})
	}
	return out
}

// mount is an OCI runtime spec mount.
type mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type,omitempty"`
	Source      string   `json:"source,omitempty"`
	Options     []string `json:"options,omitempty"`
}

// runtimeSpec is the OCI runtime configuration of the container: what containerd's CRI plugin writes for a
// container of the manifest in a hostNetwork Pod (the node's network namespace, its own mount, PID and IPC
// namespaces, the runtime's mounts, the kubelet's /etc files, then the manifest's volume mounts).
func (p *pod) runtimeSpec(c corev1.Container, roRoot bool, caps []string) map[string]any {
	p.t.Helper()
	env := p.env(c)
	bind := func(dst, src string, ro bool) mount {
		opts := []string{"rbind", "rprivate"}
		if ro {
			opts = append(opts, "ro")
		}
		return mount{Destination: dst, Type: "bind", Source: src, Options: opts}
	}
	mounts := []mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		bind("/etc/hosts", filepath.Join(p.dir, "hosts"), false),
		bind("/etc/hostname", filepath.Join(p.dir, "hostname"), false),
		bind("/etc/resolv.conf", filepath.Join(p.dir, "resolv.conf"), false),
	}
	for _, vm := range c.VolumeMounts {
		src, ok := p.volumes[vm.Name]
		if !ok {
			p.t.Fatalf("container %s mounts volume %s, which the Pod does not have", c.Name, vm.Name)
		}
		_, configMap := p.configMapVolume(vm.Name)
		// The kubelet mounts ConfigMap volumes read-only whatever the mount says.
		mounts = append(mounts, bind(vm.MountPath, src, vm.ReadOnly || configMap))
	}
	capNames := make([]string, len(caps))
	for i, c := range caps {
		capNames[i] = "CAP_" + c
	}
	return map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]any{"uid": 0, "gid": 0},
			"args": slices.Concat(p.image.Entrypoint, p.args(c, env)),
			"env":  env,
			"cwd":  "/",
			"capabilities": map[string]any{
				"bounding": capNames, "effective": capNames, "permitted": capNames,
			},
		},
		"root": map[string]any{"path": p.rootfs, "readonly": roRoot},
		// A cgroup of the test's own, which runc removes with the container; no limits.
		"cgroupsPath": "/nodelocaldns-image-test/" + p.prefix + "-" + c.Name,
		"hostname":    "",
		"mounts":      mounts,
		"linux": map[string]any{
			"namespaces": []map[string]any{
				{"type": "pid"}, {"type": "ipc"}, {"type": "mount"},
				{"type": "network", "path": filepath.Join("/run/netns", p.n.NodeNS)},
			},
			"maskedPaths": []string{"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
				"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"},
			"readonlyPaths": []string{"/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

func (p *pod) configMapVolume(name string) (corev1.Volume, bool) {
	for _, v := range p.spec.Volumes {
		if v.Name == name {
			return v, v.ConfigMap != nil
		}
	}
	return corev1.Volume{}, false
}

// runc runs runc with the Pod's state directory.
func (p *pod) runc(args ...string) (string, error) {
	out, err := exec.Command("runc", append([]string{"--root", p.state}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("runc %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// start runs the manifest's container name under runc, in the foreground, and deletes it at the end of the
// test. runc runs in the machine's namespaces (under `ip netns exec`, /sys would be the node namespace's
// sysfs, without the cgroup tree runc reads); the spec puts the container in the node's network namespace.
// (crun 1.8, Debian 12's, refuses a machine with cgroups in hybrid mode, as this one is; runc takes both.)
func (p *pod) start(name string) *container {
	p.t.Helper()
	c := p.container(name)
	bundle := filepath.Join(p.dir, "bundle-"+name)
	b, err := json.MarshalIndent(p.runtimeSpec(c, readOnlyRoot(c), capabilities(c)), "", "  ")
	if err != nil {
		p.t.Fatal(err)
	}
	writeFile(p.t, filepath.Join(bundle, "config.json"), string(b))
	id := p.prefix + "-" + name
	ctr := &container{done: make(chan struct{})}
	ctr.cmd = exec.Command("runc", "--root", p.state, "run", "--bundle", bundle, id)
	ctr.cmd.Stdout, ctr.cmd.Stderr = &ctr.out, &ctr.out
	if err := ctr.cmd.Start(); err != nil {
		p.t.Fatalf("runc run %s: %v", id, err)
	}
	go func() {
		ctr.err = ctr.cmd.Wait()
		close(ctr.done)
	}()
	p.t.Cleanup(func() {
		_, _ = p.runc("delete", "--force", id)
		select {
		case <-ctr.done:
		case <-time.After(time.Minute):
			p.t.Errorf("runc run %s still running a minute after runc delete --force", id)
		}
		if p.t.Failed() {
			p.t.Logf("output of container %s:\n%s", name, ctr.Output())
		}
	})
	return ctr
}

// container is a running `runc run` and what its container wrote.
type container struct {
	cmd  *exec.Cmd
	out  syncBuffer
	done chan struct{}
	err  error
}

// Output is what the container wrote so far, stdout and stderr.
func (c *container) Output() string { return c.out.String() }

// Exited reports whether the container has exited.
func (c *container) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Wait waits up to timeout for the container to exit and returns how it exited.
func (c *container) Wait(timeout time.Duration) error {
	select {
	case <-c.done:
		return c.err
	case <-time.After(timeout):
		return fmt.Errorf("still running after %v", timeout)
	}
}

// syncBuffer is a bytes.Buffer safe for the writer and readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// exec runs a command in the running container name.
func (p *pod) exec(name string, args ...string) (string, error) {
	return p.runc(append([]string{"exec", p.prefix + "-" + name}, args...)...)
}

func waitLog(t *testing.T, p *container, what string, timeout time.Duration, cond func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond(p.Output()) {
		if p.Exited() {
			t.Fatalf("%s: the container exited (%v):\n%s", what, p.Wait(0), p.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v:\n%s", what, timeout, p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rulesInPlace reports whether notrack logged its rules in place for both of the manifest's addresses.
func rulesInPlace(out string) bool {
	for line := range strings.SplitSeq(out, "\n") {
		if strings.Contains(line, "plugin/notrack: rules in place for") &&
			strings.Contains(line, simnode.LinkLocalIP+":53") && strings.Contains(line, simnode.KubeDNSClusterIP+":53") {
			return true
		}
	}
	return false
}

// TestImageOnSimulatedNode runs the image's two containers as the iptables manifest's DaemonSet runs them,
// under runc on the simulated node, and checks what the e2e tier checks of the binary: the cache puts the
// addresses on its link and its rules in place, Pods resolve cluster and outside names through both
// addresses over UDP and TCP with no conntrack entry, `node-cache -verify` passes from the cache's own
// container, and both iptables flavours run there; then, the cache container killed, the guard container
// fails the node open and Pods resolve through kube-proxy again.
//
// "manifest" runs the containers with exactly the manifest's settings: the runtime's default capabilities
// plus NET_ADMIN, a writable root. "restricted" runs them with the least that works: only NET_ADMIN,
// NET_BIND_SERVICE (port 53) and NET_RAW (iptables-legacy opens a raw socket), a read-only root, and so an
// emptyDir at /tmp for the Corefile the cache writes (-conf /tmp/Corefile) and its pidfile.
func TestImageOnSimulatedNode(t *testing.T) {
	for _, tc := range []struct {
		name     string
		restrict bool
	}{{"manifest", false}, {"restricted", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := image(t)
			objs, err := kubernetes.Load(manifestFile)
			if err != nil {
				t.Fatal(err)
			}
			if tc.restrict {
				restrict(t, &objs.DaemonSets[0].Spec.Template.Spec)
			}
			testPod(t, dir, objs)
		})
	}
}

// restricted are the capabilities the restricted Pod's containers get, and nothing else.
var restricted = []corev1.Capability{"NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"}

// restrict gives the Pod's containers only the restricted capabilities and a read-only root, and the cache
// an emptyDir at /tmp that its Corefile goes to.
func restrict(t *testing.T, spec *corev1.PodSpec) {
	t.Helper()
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	yes := true
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			c := &cs[i]
			c.SecurityContext = &corev1.SecurityContext{
				Capabilities:           &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: restricted},
				ReadOnlyRootFilesystem: &yes,
			}
			if c.Name != "node-cache" {
				continue
			}
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"})
			i := slices.Index(c.Args, "-conf")
			if i < 0 || i+1 >= len(c.Args) {
				t.Fatalf("the cache's arguments have no -conf: %v", c.Args)
			}
			c.Args[i+1] = "/tmp/Corefile"
		}
	}
}

// readOnlyRoot reports whether the container's root filesystem is read-only.
func readOnlyRoot(c corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem
}

// verifyFailures returns the rows of `node-cache -verify`'s table that did not pass.
func verifyFailures(out string) []string {
	var rows []string
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) > 3 && slices.Contains(f, "FAIL") {
			rows = append(rows, strings.TrimSpace(line))
		}
	}
	return rows
}

func testPod(t *testing.T, dir string, objs *kubernetes.Objects) {
	n := simnode.New(t)
	p := newPod(t, n, dir, objs)
	// The cluster DNS and the node's resolver: the image's own static binary, run on the node.
	clusterDNS := n.StartClusterDNS(filepath.Join(p.rootfs, "node-cache"))
	n.StartExternalResolver(filepath.Join(p.rootfs, "node-cache"))
	for _, name := range []string{"guard", "node-cache"} {
		c := p.container(name)
		t.Logf("%s: capabilities %v, read-only root %v, args %v", name, capabilities(c), readOnlyRoot(c), c.Args)
	}

	// The guard is a native sidecar: it starts first and runs beside the cache.
	guard := p.start("guard")
	waitLog(t, guard, "the guard watching", time.Minute, func(s string) bool { return strings.Contains(s, "nodelocal guard: watching") })
	cache := p.start("node-cache")
	waitLog(t, cache, "rules in place", time.Minute, rulesInPlace)

	node := func(name string, args ...string) string {
		t.Helper()
		out, err := n.In(context.Background(), n.NodeNS, name, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	inPod := func(name string, args ...string) string {
		t.Helper()
		out, err := n.In(context.Background(), n.PodNS, name, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := node("ip", "-o", "addr", "show", "dev", "nodelocaldns"); !strings.Contains(out, simnode.LinkLocalIP+"/32") ||
		!strings.Contains(out, simnode.KubeDNSClusterIP+"/32") {
		t.Errorf("link nodelocaldns:\n%s", out)
	}
	if rules := node("iptables-save", "-t", "raw"); !strings.Contains(rules, "NOTRACK") {
		t.Errorf("no NOTRACK rule in the node's raw table:\n%s", rules)
	}

	// Pods resolve through both addresses, over UDP and TCP, cluster names and outside names.
	if out := inPod("getent", "hosts", "kubernetes.default"); !strings.HasPrefix(out, "10.96.0.1 ") {
		t.Errorf("getent hosts kubernetes.default = %q", out)
	}
	dig := func(server, name string, extra ...string) string {
		t.Helper()
		return strings.TrimSpace(inPod("dig", append([]string{"+short", "+time=2", "+tries=1", "@" + server, name}, extra...)...))
	}
	for _, server := range []string{simnode.KubeDNSClusterIP, simnode.LinkLocalIP} {
		for _, transport := range []string{"+notcp", "+tcp"} {
			if out := dig(server, "kubernetes.default.svc.cluster.local", transport); out != "10.96.0.1" {
				t.Errorf("dig %s @%s kubernetes.default.svc.cluster.local = %q", transport, server, out)
			}
		}
		if out := dig(server, "www.example.com"); out != simnode.ExternalAnswer {
			t.Errorf("dig @%s www.example.com = %q, want the node's resolver's %s", server, out, simnode.ExternalAnswer)
		}
	}
	// Untracked: no conntrack entry for lookups to either address.
	for _, dst := range []string{simnode.KubeDNSClusterIP, simnode.LinkLocalIP} {
		if err := n.DeleteConntrack(dst); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		inPod("getent", "hosts", "kubernetes.default")
		dig(simnode.LinkLocalIP, "kubernetes.default.svc.cluster.local")
		dig(simnode.KubeDNSClusterIP, "kubernetes.default.svc.cluster.local", "+tcp")
	}
	for _, dst := range []string{simnode.KubeDNSClusterIP, simnode.LinkLocalIP} {
		for _, proto := range []string{"udp", "tcp"} {
			entries, err := n.ConntrackEntries(proto, dst)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 0 {
				t.Errorf("%d %s conntrack entries to %s:53:\n%s", len(entries), proto, dst, strings.Join(entries, "\n"))
			}
		}
	}

	// The operator's check, from the cache's own container as README.md's step 5 runs it.
	// The simulated cluster DNS serves cluster.local only and refuses the reverse zones (the e2e tier checks
	// that it does), so the reverse rows fail, and only they may.
	// With the cache's -conf, where -verify reads the metrics address that names kube-dns-upstream's.
	args := p.container("node-cache").Args
	conf := args[slices.Index(args, "-conf")+1]
	out, err := p.exec("node-cache", "/node-cache", "-verify", "-localip", simnode.LinkLocalIP+","+simnode.KubeDNSClusterIP, "-conf", conf)
	if !strings.Contains(out, "address from the cache's metrics") {
		t.Errorf("node-cache -verify -conf %s did not find kube-dns-upstream through the cache's metrics:\n%s", conf, out)
	}
	failed := verifyFailures(out)
	for _, row := range failed {
		if !strings.Contains(row, " PTR ") || !strings.Contains(row, "reverse: REFUSED") {
			t.Errorf("node-cache -verify in the cache's container failed %q", row)
		}
	}
	if (err != nil) != (len(failed) > 0) || !strings.Contains(out, "health ") {
		t.Errorf("node-cache -verify in the cache's container: %v, %d rows failed:\n%s", err, len(failed), out)
	}
	t.Logf("node-cache -verify in the cache's container:\n%s", out)
	// Both iptables flavours run in the container with its capabilities.
	for _, save := range []string{"iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save", "ip6tables-nft-save"} {
		if out, err := p.exec("node-cache", save, "-t", "raw"); err != nil {
			t.Errorf("%s in the cache's container: %v", save, err)
		} else if save == "iptables-nft-save" && !strings.Contains(out, "NOTRACK") {
			t.Errorf("%s in the cache's container shows no NOTRACK rule:\n%s", save, out)
		}
	}

	// The cache container is killed: the guard fails the node open, and Pods resolve through kube-proxy's
	// DNAT (the ClusterIP) and the diversion of the link-local address to kube-dns-upstream.
	if _, err := p.runc("kill", p.prefix+"-node-cache", "KILL"); err != nil {
		t.Fatal(err)
	}
	if err := cache.Wait(time.Minute); err == nil {
		t.Errorf("the killed cache container exited 0")
	}
	waitLog(t, guard, "the guard failing open", time.Minute, func(s string) bool { return strings.Contains(s, "failed open in") })
	before := simnode.CountQueries(clusterDNS.Output(), "kubernetes.default.svc.cluster.local", "udp")
	for _, server := range []string{simnode.KubeDNSClusterIP, simnode.LinkLocalIP} {
		if out := dig(server, "kubernetes.default.svc.cluster.local"); out != "10.96.0.1" {
			t.Errorf("failed open: dig @%s kubernetes.default.svc.cluster.local = %q", server, out)
		}
	}
	if got := simnode.WaitForQueries(clusterDNS, "kubernetes.default.svc.cluster.local", "udp", before+2, 30*time.Second) - before; got < 2 {
		t.Errorf("failed open: the cluster DNS got %d of the 2 lookups", got)
	}
	if _, err := p.runc("kill", p.prefix+"-guard", "TERM"); err != nil {
		t.Fatal(err)
	}
	if err := guard.Wait(time.Minute); err != nil {
		t.Errorf("the guard container after SIGTERM: %v\n%s", err, guard.Output())
	}
}
