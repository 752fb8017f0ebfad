package upstreamsvc

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Where an upstream address came from; the values appear in the upstream_info metric.
const (
	sourceAPI      = "api"
	sourceEnv      = "env"
	sourceFallback = "fallback"
)

const (
	defaultPort = 53
	// dnsTCPPortName is the name kube-dns and CoreDNS manifests give the Service's TCP port.
	dnsTCPPortName = "dns-tcp"
)

// upstreamSet is the list of addresses queries go to, and where the list came from.
type upstreamSet struct {
	addrs  []string // host:port, IPv6 hosts in brackets
	source string
}

// serviceView is what the Kubernetes API says about the Service, reduced to what forwarding needs.
type serviceView struct {
	exists bool
	ips    []netip.Addr // ClusterIPs, primary family first
	port   uint16       // the DNS-over-TCP port of the Service, 0 when it has none we recognise
	// problem is set when the Service exists but offers nothing to forward to (headless, ExternalName, ...).
	problem error
}

// viewOf reduces a Service to its forwarding targets.
func viewOf(svc *corev1.Service) serviceView {
	v := serviceView{exists: true, port: dnsTCPPort(svc.Spec.Ports)}
	name := svc.Namespace + "/" + svc.Name
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		v.problem = fmt.Errorf("service %s is of type ExternalName and has no ClusterIP", name)
		return v
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	if len(ips) == 0 {
		v.problem = fmt.Errorf("service %s has no ClusterIP", name)
		return v
	}
	for _, s := range ips {
		if s == corev1.ClusterIPNone {
			v.problem = fmt.Errorf("service %s is headless (ClusterIP None)", name)
			return v
		}
		ip, err := parseUpstreamIP(s)
		if err != nil {
			v.problem = fmt.Errorf("service %s: ClusterIP %w", name, err)
			return v
		}
		v.ips = append(v.ips, ip)
	}
	return v
}

// dnsTCPPort picks the Service port that carries DNS over TCP: the one named dns-tcp, else TCP port 53.
func dnsTCPPort(ports []corev1.ServicePort) uint16 {
	for _, p := range ports {
		if p.Name == dnsTCPPortName && validPort(int64(p.Port)) {
			return uint16(p.Port)
		}
	}
	for _, p := range ports {
		if p.Protocol == corev1.ProtocolTCP && p.Port == defaultPort {
			return defaultPort
		}
	}
	return 0
}

// apiSet turns what the API reports into addresses. A port from the Corefile wins over the Service's.
func (cfg *Config) apiSet(v serviceView) upstreamSet {
	port := uint16(defaultPort)
	switch {
	case cfg.Port != 0:
		port = cfg.Port
	case v.port != 0:
		port = v.port
	}
	set := upstreamSet{source: sourceAPI}
	for _, ip := range v.ips {
		set.addrs = append(set.addrs, netip.AddrPortFrom(ip, port).String())
	}
	return set
}

// envPrefix is how Kubernetes turns a Service name into the prefix of the variables it injects into pods.
func envPrefix(service string) string {
	return strings.ToUpper(strings.ReplaceAll(service, "-", "_"))
}

// HostEnvVar is the environment variable Kubernetes sets to the ClusterIP of service.
func HostEnvVar(service string) string { return envPrefix(service) + "_SERVICE_HOST" }

// portEnvVar is the environment variable Kubernetes sets to the Service's dns-tcp port.
func portEnvVar(service string) string {
	return envPrefix(service) + "_SERVICE_PORT_" + envPrefix(dnsTCPPortName)
}

// EnvAddress is the address (HOST:PORT) the plugin takes from the pod's environment for service, read with
// lookup (os.LookupEnv): what it forwards to when the API gives none. found is false when the host variable
// is unset or empty; a value that is not an IP address is an error.
func EnvAddress(service string, lookup func(string) (string, bool)) (addr string, found bool, err error) {
	set, found, err := (&Config{Service: service}).envSet(lookup)
	if !found || err != nil {
		return "", found, err
	}
	return set.addrs[0], true, nil
}

// envSet reads the Service's address from the variables Kubernetes injected when the pod started.
// found is false when the host variable is unset or empty; a value that is not an IP is an error,
// so a broken pod spec never turns into an upstream like "<nil>:53".
func (cfg *Config) envSet(lookup func(string) (string, bool)) (set upstreamSet, found bool, err error) {
	hostVar := HostEnvVar(cfg.Service)
	host, _ := lookup(hostVar)
	host = strings.TrimSpace(host)
	if host == "" {
		return upstreamSet{}, false, nil
	}
	ip, err := parseUpstreamIP(host)
	if err != nil {
		return upstreamSet{}, false, fmt.Errorf("environment variable %s: %w", hostVar, err)
	}
	port := uint16(defaultPort)
	if cfg.Port != 0 {
		port = cfg.Port
	} else if p, ok := lookup(portEnvVar(cfg.Service)); ok && strings.TrimSpace(p) != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(p), 10, 32)
		if err != nil || !validPort(n) {
			return upstreamSet{}, false, fmt.Errorf("environment variable %s=%q is not a port", portEnvVar(cfg.Service), p)
		}
		port = uint16(n)
	}
	return upstreamSet{addrs: []string{netip.AddrPortFrom(ip, port).String()}, source: sourceEnv}, true, nil
}

// fallbackSet is the static list from the Corefile.
func (cfg *Config) fallbackSet() upstreamSet {
	set := upstreamSet{source: sourceFallback}
	for _, ap := range cfg.Fallback {
		set.addrs = append(set.addrs, ap.String())
	}
	return set
}

// parseUpstreamIP accepts a literal IP that can be forwarded to.
func parseUpstreamIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	if ip.IsUnspecified() || ip.IsMulticast() {
		return netip.Addr{}, fmt.Errorf("%q cannot be forwarded to", s)
	}
	return ip.Unmap(), nil
}

// parseFallback accepts IP or IP:PORT ([IPv6]:PORT); a missing port becomes defaultPort.
func parseFallback(s string, port uint16) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if _, err := parseUpstreamIP(ap.Addr().String()); err != nil {
			return netip.AddrPort{}, err
		}
		if ap.Port() == 0 {
			return netip.AddrPort{}, fmt.Errorf("fallback %q: port 0", s)
		}
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
	}
	ip, err := parseUpstreamIP(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("fallback %q: want IP or IP:PORT: %w", s, err)
	}
	return netip.AddrPortFrom(ip, port), nil
}

func validPort(n int64) bool { return n > 0 && n <= 65535 }

// unresolvableError says what was tried, so an operator can fix whichever source should have answered.
func (cfg *Config) unresolvableError(apiReason string) error {
	return fmt.Errorf("no upstream for Service %q in namespace %q: %s; environment variable %s is not set; no fallback configured",
		cfg.Service, cfg.Namespace, apiReason, HostEnvVar(cfg.Service))
}
