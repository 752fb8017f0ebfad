// Package kubeapi runs a real Kubernetes API server for tests: etcd and kube-apiserver, built from the Go module
// proxy by scripts/build-kube-apiserver.sh (part of `make test-deps`), started on loopback with free ports and
// stopped after.
//
// The server authenticates an admin with a static token (group system:masters), issues ServiceAccount tokens
// (TokenRequest), authorizes with Node,RBAC, and writes an audit log of every request made by a
// ServiceAccount, which tests read as evidence of what a client asked for. Its Service ClusterIP ranges are
// ServiceCIDR, inside 127.0.0.0/8, so a test can put a DNS server on a Service's ClusterIP and still send
// traffic only to loopback, and ServiceCIDRv6; Options.ServiceCIDRs gives others, such as the simulated
// node's 10.96.0.0/16, whose ClusterIPs only a kube-proxy in the node's namespace serves.
//
// Without the binaries a test skips, and fails under `make test` and CI (see package privtest).
package kubeapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// The versions scripts/build-kube-apiserver.sh builds; they are those pinned in tools/*/go.mod (a test checks).
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.6.16"
)

// ServiceCIDR is the server's IPv4 Service ClusterIP range, on loopback; ServiceCIDRv6 is the IPv6 one, for
// dual-stack Services (no traffic goes to it).
const (
	ServiceCIDR   = "127.96.0.0/16"
	ServiceCIDRv6 = "fd00:10:96::/112"
)

// ServiceAccountIssuer is the issuer of the server's ServiceAccount tokens.
const ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

const (
	// startTimeout bounds each start of etcd or kube-apiserver; it is a failure bound for a busy machine,
	// not an expectation.
	startTimeout = 3 * time.Minute
	// stopTimeout is how long a process gets after SIGTERM before it is killed.
	stopTimeout = 30 * time.Second
	// portAttempts is how often a start is retried when another process took a probed port first.
	portAttempts = 5
)

// Binaries are the paths of the two programs.
type Binaries struct {
	APIServer string
	Etcd      string
}

// BinDir is where scripts/build-kube-apiserver.sh puts the binaries: ${XDG_CACHE_HOME:-$HOME/.cache}/nodelocaldns/kubeapi.
func BinDir() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("locating the kube-apiserver binaries: %w", err)
	}
	return filepath.Join(cache, "nodelocaldns", "kubeapi"), nil
}

// FindBinaries returns the pinned binaries, or an error that says how to build them.
func FindBinaries() (Binaries, error) {
	dir, err := BinDir()
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{
		APIServer: filepath.Join(dir, "kube-apiserver-"+KubernetesVersion),
		Etcd:      filepath.Join(dir, "etcd-"+EtcdVersion),
	}
	var missing []string
	for _, p := range []string{b.APIServer, b.Etcd} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return Binaries{}, fmt.Errorf("no %s (run scripts/build-kube-apiserver.sh, or `make test-deps`)", strings.Join(missing, " or "))
	}
	return b, nil
}

// RequireBinaries returns the binaries, or stops the test: it fails under `make test` and CI
// (privtest.Required) and skips otherwise.
func RequireBinaries(t testing.TB) Binaries {
	t.Helper()
	b, err := FindBinaries()
	if err == nil {
		return b
	}
	if privtest.Required() {
		t.Fatalf("the Kubernetes API tests need etcd and kube-apiserver: %v; %s is set, so this is a failure, not a skip", err, privtest.RequireEnv)
	}
	t.Skipf("the Kubernetes API tests need etcd and kube-apiserver: %v; set %s=1 to make this a failure", err, privtest.RequireEnv)
	return Binaries{}
}

// Options are the settings of a server that may differ between tests.
type Options struct {
	// ServiceCIDRs are the Service ClusterIP ranges (--service-cluster-ip-range), one per family, the
	// primary first; none means ServiceCIDR and ServiceCIDRv6.
	ServiceCIDRs []string
}

func (o Options) serviceCIDRs() string {
	if len(o.ServiceCIDRs) == 0 {
		return ServiceCIDR + "," + ServiceCIDRv6
	}
	return strings.Join(o.ServiceCIDRs, ",")
}

// Start runs a server for the test, in the test's temporary directory, and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with opts.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	bin := RequireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*startTimeout)
	defer cancel()
	s, err := NewWithOptions(ctx, bin, t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// Server is etcd and kube-apiserver on loopback. Its methods are safe for one goroutine at a time.
type Server struct {
	bin        Binaries
	opts       Options
	dir        string
	adminToken string
	caFile     string

	etcdURL   string
	etcd      *process
	port      int // kube-apiserver's secure port, kept across restarts
	apiserver *process
	starts    int
}

// New starts etcd and kube-apiserver with their data, certificates and logs in dir and returns once the API
// server is ready. The caller must Stop it.
func New(ctx context.Context, bin Binaries, dir string) (*Server, error) {
	return NewWithOptions(ctx, bin, dir, Options{})
}

// NewWithOptions is New with opts.
func NewWithOptions(ctx context.Context, bin Binaries, dir string, opts Options) (*Server, error) {
	s := &Server{bin: bin, opts: opts, dir: dir}
	if err := s.writeFiles(); err != nil {
		return nil, err
	}
	if err := s.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := s.StartAPIServer(ctx); err != nil {
		return nil, errors.Join(err, s.etcd.stop())
	}
	return s, nil
}

// URL is the API server's address, https://127.0.0.1:PORT; it stays the same across restarts.
func (s *Server) URL() string {
	return "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// CAFile is the PEM file that verifies the API server's certificate.
func (s *Server) CAFile() string { return s.caFile }

// Dir is the directory holding the server's data and logs.
func (s *Server) Dir() string { return s.dir }

// AdminConfig is a client configuration of the admin (group system:masters).
func (s *Server) AdminConfig() *rest.Config { return s.TokenConfig(s.adminToken) }

// TokenConfig is a client configuration that authenticates with token, such as a ServiceAccount's.
func (s *Server) TokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            s.URL(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: s.caFile},
	}
}

// WriteKubeconfig writes to path a kubeconfig for the server at serverURL (its URL, or that of a relay in
// front of it) that authenticates with token.
func (s *Server) WriteKubeconfig(path, serverURL, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubeapi"] = &clientcmdapi.Cluster{Server: serverURL, CertificateAuthority: s.caFile}
	cfg.AuthInfos["kubeapi"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubeapi"] = &clientcmdapi.Context{Cluster: "kubeapi", AuthInfo: "kubeapi"}
	cfg.CurrentContext = "kubeapi"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

// Stop stops kube-apiserver and etcd.
func (s *Server) Stop() error {
	return errors.Join(s.StopAPIServer(), s.etcd.stop())
}

// StopAPIServer stops kube-apiserver and leaves etcd running; StartAPIServer starts it again.
func (s *Server) StopAPIServer() error {
	if s.apiserver == nil {
		return nil
	}
	err := s.apiserver.stop()
	s.apiserver = nil
	return err
}

// StartAPIServer starts kube-apiserver (again) on its port and waits until /readyz answers.
func (s *Server) StartAPIServer(ctx context.Context) error {
	if s.apiserver != nil {
		return errors.New("kube-apiserver is already running")
	}
	keepPort := s.port != 0
	for attempt := 1; ; attempt++ {
		if !keepPort {
			port, err := freePort()
			if err != nil {
				return err
			}
			s.port = port
		}
		s.starts++
		p, err := s.runAPIServer(ctx)
		if err == nil {
			s.apiserver = p
			return nil
		}
		if keepPort || !errors.Is(err, errPortTaken) || attempt == portAttempts {
			return err
		}
	}
}

func (s *Server) runAPIServer(ctx context.Context) (*process, error) {
	args := []string{
		"--etcd-servers=" + s.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.port),
		"--tls-cert-file=" + s.caFile,
		"--tls-private-key-file=" + filepath.Join(s.dir, "serving.key"),
		"--token-auth-file=" + filepath.Join(s.dir, "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + filepath.Join(s.dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(s.dir, "sa.key"),
		"--service-cluster-ip-range=" + s.opts.serviceCIDRs(),
		// The default reconciler refuses a loopback advertise address.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--audit-policy-file=" + filepath.Join(s.dir, "audit-policy.yaml"),
		"--audit-log-path=" + s.AuditLog(),
		"--audit-log-mode=blocking",
		"--profiling=false",
		// On SIGTERM, close open watches 2s after the other requests drained, instead of waiting out
		// --request-timeout (60s) for them.
		"--shutdown-send-retry-after=true",
	}
	logPath := filepath.Join(s.dir, fmt.Sprintf("kube-apiserver.%d.log", s.starts))
	p, err := startProcess("kube-apiserver", s.bin.APIServer, logPath, args...)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := rest.TLSConfigFor(s.AdminConfig())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("kube-apiserver client TLS: %w", err), p.stop())
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	get := func(path string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+path, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+s.adminToken)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := readAll(resp)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s: %s", path, resp.Status, body)
		}
		return nil
	}
	ready := func() error {
		if err := get("/readyz"); err != nil {
			return err
		}
		// kube-apiserver creates kube-system after it is ready; the manifests' objects live there.
		return get("/api/v1/namespaces/kube-system")
	}
	if err := p.waitReady(ctx, ready); err != nil {
		return nil, errors.Join(err, p.stop())
	}
	return p, nil
}

func (s *Server) startEtcd(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		client, err := freePort()
		if err != nil {
			return err
		}
		peer, err := freePort()
		if err != nil {
			return err
		}
		clientURL := fmt.Sprintf("http://127.0.0.1:%d", client)
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
		p, err := startProcess("etcd", s.bin.Etcd, filepath.Join(s.dir, "etcd.log"),
			"--name=kubeapi",
			"--data-dir="+filepath.Join(s.dir, "etcd"),
			"--listen-client-urls="+clientURL,
			"--advertise-client-urls="+clientURL,
			"--listen-peer-urls="+peerURL,
			"--initial-advertise-peer-urls="+peerURL,
			"--initial-cluster=kubeapi="+peerURL,
			"--log-level=warn",
			// A test's data does not need to survive a crash of the machine.
			"--unsafe-no-fsync",
		)
		if err != nil {
			return err
		}
		s.etcdURL = clientURL
		err = p.waitReady(ctx, func() error {
			var health struct{ Health string }
			if err := s.etcdCall(ctx, http.MethodGet, "/health", nil, &health); err != nil {
				return err
			}
			if health.Health != "true" {
				return fmt.Errorf("etcd /health: %q", health.Health)
			}
			return nil
		})
		if err == nil {
			s.etcd = p
			return nil
		}
		err = errors.Join(err, p.stop())
		if !errors.Is(err, errPortTaken) || attempt == portAttempts {
			return err
		}
		if err := os.RemoveAll(filepath.Join(s.dir, "etcd")); err != nil {
			return err
		}
	}
}

// CompactEtcd writes a key of its own to etcd, so that the store's revision is newer than anything a
// client has seen, and compacts etcd's history up to that revision, which it returns. A watch that resumes
// from an older resourceVersion then gets 410 Gone ("too old resource version") and must list again.
func (s *Server) CompactEtcd(ctx context.Context) (int64, error) {
	b64 := base64.StdEncoding.EncodeToString
	var put struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	err := s.etcdCall(ctx, http.MethodPost, "/v3/kv/put", map[string]string{
		"key":   b64([]byte("/nodelocaldns-kubeapi-test/compact")),
		"value": b64([]byte(time.Now().UTC().Format(time.RFC3339Nano))),
	}, &put)
	if err != nil {
		return 0, fmt.Errorf("writing to etcd before compacting: %w", err)
	}
	rev, err := strconv.ParseInt(put.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd put answered revision %q", put.Header.Revision)
	}
	err = s.etcdCall(ctx, http.MethodPost, "/v3/kv/compaction", map[string]any{
		"revision": strconv.FormatInt(rev, 10), "physical": true,
	}, nil)
	if err != nil {
		return 0, fmt.Errorf("compacting etcd at revision %d: %w", rev, err)
	}
	return rev, nil
}

// etcdCall sends a JSON request to etcd's HTTP gateway and decodes the answer into out (when not nil).
func (s *Server) etcdCall(ctx context.Context, method, path string, in, out any) error {
	var body bytes.Buffer
	if in != nil {
		if err := json.NewEncoder(&body).Encode(in); err != nil {
			return err
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, s.etcdURL+path, &body)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	b, err := readAll(resp)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, b)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// AuditLog is the path of the audit log: one JSON event per line for each request of a ServiceAccount.
func (s *Server) AuditLog() string { return filepath.Join(s.dir, "audit.log") }

// AuditEvent is the part of an audit.k8s.io/v1 Event tests look at.
type AuditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource  string `json:"resource"`
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code    int    `json:"code"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"responseStatus"`
}

// Query is the request's query parameters.
func (e AuditEvent) Query() url.Values {
	u, err := url.ParseRequestURI(e.RequestURI)
	if err != nil {
		return url.Values{}
	}
	return u.Query()
}

// AuditEvents reads the audit log: every event, of every run of kube-apiserver, in order.
func (s *Server) AuditEvents() ([]AuditEvent, error) {
	f, err := os.Open(s.AuditLog())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the audit log: %w", err)
	}
	defer f.Close()
	var events []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var e AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// The last line may be half written while kube-apiserver runs.
			continue
		}
		events = append(events, e)
	}
	return events, sc.Err()
}

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
`

// writeFiles writes the admin token, the serving certificate, the ServiceAccount signing key and the
// audit policy.
func (s *Server) writeFiles() error {
	token := make([]byte, 24)
	if _, err := rand.Read(token); err != nil {
		return err
	}
	s.adminToken = hex.EncodeToString(token)
	s.caFile = filepath.Join(s.dir, "serving.crt")

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	// One self-signed certificate that is both the serving certificate and the CA clients trust.
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubeapi-test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &servingKey.PublicKey, servingKey)
	if err != nil {
		return fmt.Errorf("creating the serving certificate: %w", err)
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"serving.crt":       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"tokens.csv":        fmt.Appendf(nil, "%s,kubeapi-test-admin,kubeapi-test-admin,system:masters\n", s.adminToken),
		"audit-policy.yaml": []byte(auditPolicy),
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	files["sa.pub"] = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub})
	for name, key := range map[string]*ecdsa.PrivateKey{"serving.key": servingKey, "sa.key": saKey} {
		b, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		files[name] = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: b})
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(s.dir, name), data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}

// errPortTaken marks a start that failed because another process bound a probed port first.
var errPortTaken = errors.New("port taken by another process")

// process is a started etcd or kube-apiserver with its output in a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	once    sync.Once
}

func startProcess(name, binary, logPath string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Should the test binary die without cleaning up, the kernel ends the server with it (where it can).
	endWithTest(cmd)
	p := &process{name: name, logPath: logPath, cmd: cmd, exited: make(chan struct{})}
	// The kernel sends Pdeathsig when the thread that started the process ends, not the test binary (Go issue
	// 27505), and a goroutine that locks its thread and never unlocks it ends that thread with it (simnode's
	// Node.Do does, to enter a namespace): the server would die in the middle of the test. So the process is
	// started, and waited for, on a thread that nothing else uses until it has exited.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return p, nil
}

// waitReady polls ready until it succeeds, the process exits, or ctx ends (each bounded by startTimeout).
func (p *process) waitReady(ctx context.Context, ready func() error) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = ready(); last == nil {
			return nil
		}
		select {
		case <-p.exited:
			tail := p.logTail()
			err := fmt.Errorf("%s exited before it was ready (%v); %s ends with:\n%s", p.name, p.waitErr, p.logPath, tail)
			if strings.Contains(tail, "address already in use") {
				return errors.Join(errPortTaken, err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %v (last check: %v); %s ends with:\n%s", p.name, ctx.Err(), last, p.logPath, p.logTail())
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM, and SIGKILL if the process has not exited within stopTimeout.
func (p *process) stop() error {
	if p == nil {
		return nil
	}
	var err error
	p.once.Do(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(stopTimeout):
			_ = p.cmd.Process.Kill()
			<-p.exited
			err = fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", p.name, stopTimeout)
		}
	})
	return err
}

// logTail is the end of the process's log, for error messages.
func (p *process) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago. Another process may take it before
// the server binds it; starts retry on that.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("probing for a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func readAll(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err := b.ReadFrom(resp.Body)
	return b.Bytes(), err
}
