package corefile

import (
	"strconv"
)

// reverseZones are served like the cluster domain, since the cluster DNS answers PTR queries for Pod and
// Service IPs.
var reverseZones = []string{"in-addr.arpa", "ip6.arpa"}

// Render returns the Corefile for c. It is Expand applied to Template(c) with c's Expansion and kube-dns
// settings: the same path a node-cache started with flags takes, so both produce the same Corefile.
func Render(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	base, err := Template(c)
	if err != nil {
		return nil, err
	}
	return Expand(base, c.Expansion(), c.kubeDNS())
}

// Template returns c as a node-local-dns ConfigMap Corefile: everything fixed is written out, and what
// node-cache fills in at start is a template variable (LocalDNSVar, DNSServerVar, ClusterDNSVar,
// UpstreamServersVar, PrometheusEndpointVar). The notrack and upstreamsvc directives are not in it: the
// node-cache flags add them.
func Template(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	port := ":" + strconv.Itoa(int(c.Port))

	bind := &Directive{Name: "bind", Args: []string{LocalDNSVar}}
	if c.Mode == ModeIPTables {
		bind.Args = append(bind.Args, DNSServerVar)
	}
	clusterForward := func() *Directive {
		d := &Directive{Name: "forward", Args: []string{".", ClusterDNSVar}}
		if !c.PreferUDP {
			d.Block = []*Directive{{Name: "force_tcp"}}
		}
		return d
	}
	prometheus := &Directive{Name: "prometheus", Args: []string{PrometheusEndpointVar}}
	head := func(log bool) []*Directive {
		dirs := []*Directive{{Name: "errors"}}
		if log {
			dirs = append(dirs, &Directive{Name: "log"})
		} else if !c.WireCache.Disabled {
			wc := &Directive{Name: "wirecache"}
			if c.WireCache.Capacity > 0 {
				wc.Block = []*Directive{{Name: "capacity", Args: []string{strconv.Itoa(c.WireCache.Capacity)}}}
			}
			dirs = append(dirs, wc)
		}
		return dirs
	}
	otherCache := &Directive{Name: "cache", Args: []string{strconv.Itoa(c.Cache.OtherTTL)}}
	tail := []*Directive{{Name: "reload"}, {Name: "loop"}, bind}

	f := &File{}
	cluster := &Block{Keys: []string{c.ClusterDomain + port}}
	cluster.Directives = append(head(c.Log),
		&Directive{Name: "clamp", Block: []*Directive{
			{Name: "success", Args: ints(c.Clamp.SuccessMin, c.Clamp.SuccessMax)},
			{Name: "denial", Args: ints(c.Clamp.DenialMin, c.Clamp.DenialMax)},
		}},
		&Directive{Name: "cache", Block: []*Directive{
			{Name: "success", Args: ints(c.Cache.SuccessCapacity, c.Cache.SuccessTTL)},
			{Name: "denial", Args: ints(c.Cache.DenialCapacity, c.Cache.DenialTTL)},
		}},
	)
	cluster.Directives = append(cluster.Directives, tail...)
	cluster.Directives = append(cluster.Directives, clusterForward(), prometheus,
		&Directive{Name: "health", Args: []string{LocalDNSVar + ":" + strconv.Itoa(int(c.HealthPort))}},
		&Directive{Name: "ready", Args: []string{LocalDNSVar + ":" + strconv.Itoa(int(c.ReadyPort))}},
	)
	f.Blocks = append(f.Blocks, cluster)

	for _, zone := range reverseZones {
		b := &Block{Keys: []string{zone + port}}
		b.Directives = append(head(false), otherCache)
		b.Directives = append(b.Directives, tail...)
		b.Directives = append(b.Directives, clusterForward(), prometheus)
		f.Blocks = append(f.Blocks, b)
	}

	root := &Block{Keys: []string{"." + port}}
	root.Directives = append(head(false), otherCache)
	root.Directives = append(root.Directives, tail...)
	root.Directives = append(root.Directives, &Directive{Name: "forward", Args: []string{".", UpstreamServersVar}}, prometheus)
	f.Blocks = append(f.Blocks, root)

	// Blocks share some directive values above; that is fine for a tree that is only printed.
	return f.Format(), nil
}

// Expansion returns what node-cache's flags would fill into Template(c): the values of the template
// variables and the notrack and upstreamsvc directives.
func (c Config) Expansion() Expansion {
	c = c.withDefaults()
	e := Expansion{
		LocalIPs:           c.listenIPs(),
		DNSDomain:          c.ClusterDomain,
		PrometheusEndpoint: c.MetricsAddress,
		Port:               c.Port,
	}
	u := c.Upstream
	e.Upstream = &u
	if !c.Notrack.Disabled {
		n := c.Notrack
		e.Notrack = &n
		e.NotrackPorts = []uint16{c.HealthPort}
	}
	return e
}

func ints(vs ...int) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = strconv.Itoa(v)
	}
	return out
}
