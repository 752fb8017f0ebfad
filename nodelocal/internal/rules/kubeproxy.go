//go:build linux

package rules

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// kube-proxy's iptables mode, as far as a divert needs it: the nat chain that holds one rule per Service
// ClusterIP and port, each jumping to the Service port's own chain, and the chain that marks a packet for
// masquerading on its way out.
const (
	KubeServicesChain = "KUBE-SERVICES"
	KubeMarkMasqChain = "KUBE-MARK-MASQ"
)

// ServiceChain is kube-proxy's chain for one port of a Service, in iptables mode: it picks an endpoint and
// DNATs to it. Its name is a hash of the Service port's name and protocol, stable across kube-proxy's
// syncs for as long as the Service port exists.
type ServiceChain struct {
	Protocol Protocol
	Chain    string
	// Comment is kube-proxy's comment on the ClusterIP rule, "kube-system/kube-dns-upstream:dns cluster IP".
	Comment string
}

// KubeProxyServiceChains finds the chains of the Service whose ClusterIP is clusterIP, for port over UDP
// and TCP, in kube-proxy's KUBE-SERVICES chain of the nat table: the rules
//
//	-A KUBE-SERVICES -d 10.96.0.11/32 -p udp -m comment --comment "kube-system/kube-dns-upstream:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-...
//
// It returns none when kube-proxy does not run in iptables mode here, or does not serve the address; and
// whether the nat table has kube-proxy's KUBE-MARK-MASQ chain.
func (m *Manager) KubeProxyServiceChains(ctx context.Context, clusterIP netip.Addr, port uint16) ([]ServiceChain, bool, error) {
	clusterIP = clusterIP.Unmap()
	v, err := m.view(ctx, FamilyOf(clusterIP))
	if err != nil {
		return nil, false, err
	}
	rules, exists, err := v.chain(ctx, NAT, KubeServicesChain)
	if err != nil || !exists {
		return nil, false, err
	}
	_, masq, err := v.chain(ctx, NAT, KubeMarkMasqChain)
	if err != nil {
		return nil, false, err
	}
	var out []ServiceChain
	dest := netip.PrefixFrom(clusterIP, clusterIP.BitLen()).String()
	for _, r := range rules {
		sc, ok := serviceChainOf(r, dest, port)
		if ok && !slices.ContainsFunc(out, func(o ServiceChain) bool { return o.Protocol == sc.Protocol }) {
			out = append(out, sc)
		}
	}
	return out, masq, nil
}

// serviceChainOf returns the service chain r jumps to when r is kube-proxy's ClusterIP rule for dest and
// port.
func serviceChainOf(r Rule, dest string, port uint16) (ServiceChain, bool) {
	var sc ServiceChain
	var d, dport string
	negated := false
	for i := range r {
		if r[i] == "!" {
			negated = true
			continue
		}
		if i+1 >= len(r) {
			break
		}
		switch r[i] {
		case "-d", "--destination":
			if !negated {
				d = r[i+1]
			}
		case "-p", "--protocol":
			sc.Protocol = Protocol(r[i+1])
		case "--dport", "--destination-port":
			if !negated {
				dport = r[i+1]
			}
		case "--comment":
			sc.Comment = r[i+1]
		}
		negated = false
	}
	sc.Chain = target(r)
	if d != dest || dport != strconv.Itoa(int(port)) || (sc.Protocol != UDP && sc.Protocol != TCP) {
		return ServiceChain{}, false
	}
	// KUBE-SVC- for a Service port, KUBE-SVL- when its internalTrafficPolicy is Local; a rule that marks
	// for masquerading has the same match and another target.
	if !strings.HasPrefix(sc.Chain, "KUBE-SVC-") && !strings.HasPrefix(sc.Chain, "KUBE-SVL-") {
		return ServiceChain{}, false
	}
	return sc, true
}

func (sc ServiceChain) String() string {
	if sc.Comment == "" {
		return fmt.Sprintf("%s %s", sc.Protocol, sc.Chain)
	}
	return fmt.Sprintf("%s %s (%s)", sc.Protocol, sc.Chain, sc.Comment)
}

// KubeProxyEndpoints returns the endpoints kube-proxy's iptables mode DNATs clusterIP to on proto and port:
// the DNAT targets of the KUBE-SEP-* chains its Service port's chain jumps to, read now, sorted; and
// whether the nat table has kube-proxy's KUBE-MARK-MASQ chain. None when kube-proxy does not serve the
// address here (not in iptables mode, no such Service port, or no endpoint).
func (m *Manager) KubeProxyEndpoints(ctx context.Context, clusterIP netip.Addr, proto Protocol, port uint16) ([]netip.AddrPort, bool, error) {
	chains, masq, err := m.KubeProxyServiceChains(ctx, clusterIP, port)
	if err != nil {
		return nil, false, err
	}
	i := slices.IndexFunc(chains, func(sc ServiceChain) bool { return sc.Protocol == proto })
	if i < 0 {
		return nil, masq, nil
	}
	v, err := m.view(ctx, FamilyOf(clusterIP.Unmap()))
	if err != nil {
		return nil, false, err
	}
	svc, _, err := v.chain(ctx, NAT, chains[i].Chain)
	if err != nil {
		return nil, false, err
	}
	var out []netip.AddrPort
	for _, r := range svc {
		sep := target(r)
		if !strings.HasPrefix(sep, "KUBE-SEP-") {
			continue
		}
		rules, _, err := v.chain(ctx, NAT, sep)
		if err != nil {
			return nil, false, err
		}
		for _, sr := range rules {
			if ep, ok := dnatTarget(sr); ok && !slices.Contains(out, ep) {
				out = append(out, ep)
			}
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out, masq, nil
}

// dnatTarget returns the destination of a "-j DNAT --to-destination ADDR:PORT" rule.
func dnatTarget(r Rule) (netip.AddrPort, bool) {
	if target(r) != "DNAT" {
		return netip.AddrPort{}, false
	}
	i := slices.Index(r, "--to-destination")
	if i < 0 || i+1 >= len(r) {
		return netip.AddrPort{}, false
	}
	ap, err := netip.ParseAddrPort(r[i+1])
	if err != nil {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}
