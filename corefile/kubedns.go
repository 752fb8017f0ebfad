package corefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The kube-dns ConfigMap keys a node cache reads; each holds JSON.
const (
	StubDomainsKey         = "stubDomains"
	UpstreamNameserversKey = "upstreamNameservers"
)

// maxUpstreamNameservers is kube-dns's limit, the number of nameservers a resolv.conf may list.
const maxUpstreamNameservers = 3

// KubeDNS is the part of the kube-dns ConfigMap a node cache uses.
type KubeDNS struct {
	// StubDomains maps a domain to the nameservers that serve it.
	StubDomains map[string][]string `json:"stubDomains,omitempty"`
	// UpstreamNameservers replace the node's resolv.conf for names outside the cluster and stub domains.
	UpstreamNameservers []string `json:"upstreamNameservers,omitempty"`
}

// ParseKubeDNS reads the ConfigMap's data (key to value, as in the ConfigMap or its mounted directory)
// and validates it. Keys other than stubDomains and upstreamNameservers are kube-dns's alone and ignored.
func ParseKubeDNS(data map[string]string) (KubeDNS, error) {
	var k KubeDNS
	if v, ok := data[StubDomainsKey]; ok && strings.TrimSpace(v) != "" {
		if err := json.Unmarshal([]byte(v), &k.StubDomains); err != nil {
			return KubeDNS{}, fmt.Errorf("%s is not a JSON object of domain to nameserver list: %w", StubDomainsKey, err)
		}
	}
	if v, ok := data[UpstreamNameserversKey]; ok && strings.TrimSpace(v) != "" {
		if err := json.Unmarshal([]byte(v), &k.UpstreamNameservers); err != nil {
			return KubeDNS{}, fmt.Errorf("%s is not a JSON list of nameservers: %w", UpstreamNameserversKey, err)
		}
	}
	return k, k.Validate()
}

// ReadKubeDNSDir reads the kube-dns ConfigMap from the directory it is mounted on. A missing key is an
// empty setting; a missing directory is an error, so that a wrong path does not pass for an empty ConfigMap.
func ReadKubeDNSDir(dir string) (KubeDNS, error) { return readKubeDNSDir(dir, os.ReadFile) }

func readKubeDNSDir(dir string, readFile func(string) ([]byte, error)) (KubeDNS, error) {
	if st, err := os.Stat(dir); err != nil {
		return KubeDNS{}, fmt.Errorf("reading the kube-dns ConfigMap: %w", err)
	} else if !st.IsDir() {
		return KubeDNS{}, fmt.Errorf("reading the kube-dns ConfigMap: %s is not a directory", dir)
	}
	data := map[string]string{}
	for _, key := range []string{StubDomainsKey, UpstreamNameserversKey} {
		b, err := readFile(filepath.Join(dir, key))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return KubeDNS{}, fmt.Errorf("reading the kube-dns ConfigMap: %w", err)
		}
		data[key] = string(b)
	}
	k, err := ParseKubeDNS(data)
	if err != nil {
		return KubeDNS{}, fmt.Errorf("kube-dns ConfigMap in %s: %w", dir, err)
	}
	return k, nil
}

// Validate applies kube-dns's rules, narrowed to what CoreDNS's forward accepts: at most three upstream
// nameservers; stub domains that are valid domain names; every nameserver an IP or IP:PORT with the port in
// 1-65535 and an IPv6 address in brackets when it has a port.
func (k KubeDNS) Validate() error {
	var errs []error
	if len(k.UpstreamNameservers) > maxUpstreamNameservers {
		errs = append(errs, fmt.Errorf("%s has %d entries; at most %d are allowed",
			UpstreamNameserversKey, len(k.UpstreamNameservers), maxUpstreamNameservers))
	}
	for _, ns := range k.UpstreamNameservers {
		if _, err := parseNameserver(ns); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", UpstreamNameserversKey, err))
		}
	}
	for _, domain := range slices.Sorted(maps.Keys(k.StubDomains)) {
		if len(validation.IsDNS1123Subdomain(domain)) > 0 {
			errs = append(errs, fmt.Errorf("%s: %q is not a valid domain name", StubDomainsKey, domain))
		}
		servers := k.StubDomains[domain]
		if len(servers) == 0 {
			errs = append(errs, fmt.Errorf("%s: %q has no nameservers", StubDomainsKey, domain))
		}
		for _, ns := range servers {
			if _, err := parseNameserver(ns); err != nil {
				errs = append(errs, fmt.Errorf("%s: %q: %w", StubDomainsKey, domain, err))
			}
		}
	}
	return errors.Join(errs...)
}

// parseNameserver accepts IP or IP:PORT, the forms kube-dns and CoreDNS's forward agree on.
func parseNameserver(s string) (netip.AddrPort, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		if ip.Zone() != "" {
			return netip.AddrPort{}, fmt.Errorf("nameserver %q: zones are not supported", s)
		}
		return netip.AddrPortFrom(ip, 53), nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("nameserver %q is not IP or IP:PORT (IPv6 with a port in brackets)", s)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("nameserver %q: %q is not an IP address", s, host)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return netip.AddrPort{}, fmt.Errorf("nameserver %q: port %q is not in 1-65535", s, port)
	}
	return netip.AddrPortFrom(ip, uint16(p)), nil
}
