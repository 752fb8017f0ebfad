package corefile

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/plugin/wirecache"
)

// clean is a node-cache Corefile with none of the hazards; each case below breaks it in one way.
const clean = `cluster.local:53 {
    errors
    cache {
        success 9984 30
        denial 9984 5
    }
    loop
    bind 169.254.20.10 10.96.0.10
    forward . 10.96.0.20 {
        force_tcp
    }
    prometheus 169.254.20.10:9253
    health 169.254.20.10:8080
    ready 169.254.20.10:8181
}
in-addr.arpa:53 {
    cache 30
    loop
    bind 169.254.20.10 10.96.0.10
    upstreamsvc kube-dns-upstream {
        force_tcp
    }
}
.:53 {
    cache 30
    loop
    bind 169.254.20.10 10.96.0.10
    forward . /etc/resolv.conf
    prometheus 169.254.20.10:9253
}
`

func TestCheck(t *testing.T) {
	nodeResolv := []byte("search example.internal\nnameserver 10.0.0.2\nnameserver 10.0.0.3\n")
	tests := []struct {
		name     string
		corefile string
		opts     CheckOptions
		want     []string // "LINE KIND", in order
	}{
		{name: "clean", corefile: clean, opts: CheckOptions{ResolvConf: nodeResolv, MemoryLimit: 256 << 20}},
		{
			name:     "resolv.conf names the node cache",
			corefile: clean,
			opts:     CheckOptions{ResolvConf: []byte("nameserver 169.254.20.10\n")},
			want:     []string{"28 resolv-loop"},
		},
		{
			name:     "resolv.conf names the ClusterIP the cache binds",
			corefile: clean,
			opts:     CheckOptions{ResolvConf: []byte("nameserver 10.96.0.10\noptions ndots:5\n")},
			want:     []string{"28 resolv-loop"},
		},
		{
			name:     "template variable stands for resolv.conf",
			corefile: strings.Replace(clean, "forward . /etc/resolv.conf", "forward . __PILLAR__UPSTREAM__SERVERS__", 1),
			opts:     CheckOptions{ResolvConf: []byte("nameserver 169.254.20.10\n")},
			want:     []string{"28 resolv-loop"},
		},
		{
			name:     "forward to itself",
			corefile: strings.Replace(clean, "forward . /etc/resolv.conf", "forward . 169.254.20.10:53", 1),
			want:     []string{"28 resolv-loop"},
		},
		{
			name:     "no loop plugin",
			corefile: strings.Replace(clean, "    cache 30\n    loop\n", "    cache 30\n", 1),
			want:     []string{"16 no-loop"},
		},
		{
			name:     "cluster forward over UDP",
			corefile: strings.Replace(clean, "    forward . 10.96.0.20 {\n        force_tcp\n    }\n", "    forward . 10.96.0.20\n", 1),
			want:     []string{"9 cluster-udp"},
		},
		{
			name:     "cluster forward preferring UDP",
			corefile: strings.Replace(clean, "        force_tcp\n    }\n    prometheus", "        prefer_udp\n    }\n    prometheus", 1),
			want:     []string{"9 cluster-udp"},
		},
		{
			name:     "upstreamsvc preferring UDP",
			corefile: strings.Replace(clean, "    upstreamsvc kube-dns-upstream {\n        force_tcp", "    upstreamsvc kube-dns-upstream {\n        prefer_udp", 1),
			want:     []string{"20 cluster-udp"},
		},
		{
			name:     "custom cluster domain",
			corefile: strings.Replace(strings.Replace(clean, "cluster.local:53", "k8s.internal:53", 1), "        force_tcp\n    }\n    prometheus", "    }\n    prometheus", 1),
			opts:     CheckOptions{ClusterDomain: "k8s.internal"},
			want:     []string{"9 cluster-udp"},
		},
		{
			name:     "no bind",
			corefile: strings.Replace(clean, "    cache 30\n    loop\n    bind 169.254.20.10 10.96.0.10\n    forward", "    cache 30\n    loop\n    forward", 1),
			want:     []string{"24 no-bind"},
		},
		{
			name:     "wildcard bind",
			corefile: strings.Replace(clean, "bind 169.254.20.10 10.96.0.10\n    upstreamsvc", "bind 0.0.0.0 ::\n    upstreamsvc", 1),
			want:     []string{"19 wildcard-bind", "19 wildcard-bind"},
		},
		{
			name:     "no bind makes a loopback resolver a loop",
			corefile: strings.Replace(clean, "    cache 30\n    loop\n    bind 169.254.20.10 10.96.0.10\n    forward", "    cache 30\n    loop\n    forward", 1),
			opts:     CheckOptions{ResolvConf: []byte("nameserver 127.0.0.53\n")},
			want:     []string{"24 no-bind", "27 resolv-loop"},
		},
		{
			name:     "health on every address",
			corefile: strings.Replace(clean, "health 169.254.20.10:8080", "health", 1),
			want:     []string{"13 open-listener"},
		},
		{
			name:     "health on 0.0.0.0",
			corefile: strings.Replace(clean, "health 169.254.20.10:8080", "health 0.0.0.0:8080", 1),
			want:     []string{"13 open-listener"},
		},
		{
			name:     "prometheus on :9253",
			corefile: strings.ReplaceAll(clean, "prometheus 169.254.20.10:9253", "prometheus :9253"),
			want:     []string{"12 open-listener", "29 open-listener"},
		},
		{
			name:     "prometheus on [::]",
			corefile: strings.Replace(clean, "prometheus 169.254.20.10:9253", "prometheus [::]:9253", 1),
			want:     []string{"12 open-listener"},
		},
		{
			name:     "ready on every address",
			corefile: strings.Replace(clean, "ready 169.254.20.10:8181", "ready", 1),
			want:     []string{"14 open-listener"},
		},
		{
			name:     "IPv6 listener without brackets",
			corefile: strings.Replace(clean, "health 169.254.20.10:8080", "health fd00::10:8080", 1),
			want:     []string{"13 ipv6-port"},
		},
		{
			name:     "IPv6 forward target reading as a port",
			corefile: strings.Replace(clean, "forward . /etc/resolv.conf", "forward . 2001:db8::1:53 [2001:db8::2]:53 2001:4860:4860::8888", 1),
			want:     []string{"28 ipv6-port"},
		},
		{
			name:     "IPv6 fallback reading as a port",
			corefile: strings.Replace(clean, "    upstreamsvc kube-dns-upstream {\n        force_tcp\n", "    upstreamsvc kube-dns-upstream {\n        force_tcp\n        fallback fd00:10:96::a:53\n", 1),
			want:     []string{"20 ipv6-port"},
		},
		{
			name:     "caches above the memory limit",
			corefile: clean,
			opts:     CheckOptions{MemoryLimit: 48 << 20},
			want:     []string{"3 cache-memory"},
		},
		{
			name:     "small caches fit",
			corefile: strings.Replace(strings.ReplaceAll(clean, "cache 30", "cache 30 {\n        success 1024\n        denial 1024\n    }"), "9984", "4096", 2),
			opts:     CheckOptions{MemoryLimit: 64 << 20},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hazards, err := Check([]byte(tt.corefile), tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, h := range hazards {
				got = append(got, fmt.Sprintf("%d %s", h.Line, h.Kind))
				if h.Problem == "" || h.Fix == "" {
					t.Errorf("hazard without problem or fix: %+v", h)
				}
			}
			if strings.Join(got, ", ") != strings.Join(tt.want, ", ") {
				t.Errorf("got [%s], want [%s]\n%v", strings.Join(got, ", "), strings.Join(tt.want, ", "), hazards)
			}
		})
	}
}

func TestCheckUpstreamTemplate(t *testing.T) {
	// Upstream's template as-is: its only hazard is prometheus on every address of the node.
	hazards, err := Check(readTestdata(t, "upstream-template.Corefile"), CheckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range hazards {
		got = append(got, fmt.Sprintf("%d %s", h.Line, h.Kind))
	}
	want := "15 open-listener, 27 open-listener, 38 open-listener, 47 open-listener"
	if strings.Join(got, ", ") != want {
		t.Errorf("got %v, want %s", got, want)
	}
}

func TestCheckMemoryFigures(t *testing.T) {
	// The four-block Corefile of upstream holds 8 caches of 9984 entries: about 115 MiB when full.
	hazards, err := Check(readTestdata(t, "upstream-template.Corefile"), CheckOptions{MemoryLimit: 100 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var memory []Hazard
	for _, h := range hazards {
		if h.Kind == HazardCacheMemory {
			memory = append(memory, h)
		}
	}
	if len(memory) != 1 || !strings.Contains(memory[0].Problem, "79872 entries") || !strings.Contains(memory[0].Fix, "116 MiB") {
		t.Errorf("got %v", memory)
	}
	hazards, _ = Check(readTestdata(t, "upstream-template.Corefile"), CheckOptions{MemoryLimit: 135 << 20})
	for _, h := range hazards {
		if h.Kind == HazardCacheMemory {
			t.Errorf("135 MiB is enough: %v", h)
		}
	}
}

func TestCheckMemoryWithWireCache(t *testing.T) {
	// The rendered iptables Corefile: 4 wirecaches holding at most 12 MiB of answers in all (24 MiB
	// resident) and 1024 TCP connections (6 MiB) with 1024 refused ones held (1 MiB), no cache plugin: 55 MiB
	// with the base.
	out, err := Render(goldenConfigs["iptables"])
	if err != nil {
		t.Fatal(err)
	}
	hazards, _ := Check(out, CheckOptions{MemoryLimit: 40 << 20})
	if len(hazards) != 1 || hazards[0].Kind != HazardCacheMemory ||
		!strings.Contains(hazards[0].Problem, "wirecache holds up to 49152 entries, at most 12 MiB of answers, and up to 1024 TCP connections;") ||
		strings.Contains(hazards[0].Problem, "cache plugin") || !strings.Contains(hazards[0].Fix, "56 MiB") {
		t.Errorf("got %v", hazards)
	}
	if hazards, _ := Check(out, CheckOptions{MemoryLimit: 55 << 20}); len(hazards) != 0 {
		t.Errorf("55 MiB is enough: %v", hazards)
	}
	// tcp_connections bounds the connections; the largest of the blocks' counts.
	fewer := strings.ReplaceAll(string(out), "    wirecache {\n", "    wirecache {\n        tcp_connections 100\n")
	if hazards, _ := Check([]byte(fewer), CheckOptions{MemoryLimit: 50 << 20}); len(hazards) != 0 {
		t.Errorf("50 MiB is enough for 100 connections: %v", hazards)
	}
	more := strings.Replace(fewer, "tcp_connections 100\n", "tcp_connections 4096 64\n", 1)
	if hazards, _ := Check([]byte(more), CheckOptions{MemoryLimit: 64 << 20}); len(hazards) != 1 || !strings.Contains(hazards[0].Problem, "up to 4096 TCP connections") {
		t.Errorf("4096 connections in one block: %v", hazards)
	}
	// With log, wirecache steps aside and holds nothing.
	logged := strings.Replace(string(out), "    wirecache {\n", "    log\n    wirecache {\n", 1)
	hazards, _ = Check([]byte(logged), CheckOptions{MemoryLimit: 32 << 20})
	if len(hazards) != 1 || !strings.Contains(hazards[0].Problem, "wirecache holds up to 18432 entries, at most 4 MiB of answers, and up to 1024 TCP connections;") {
		t.Errorf("got %v", hazards)
	}
	// The cache plugin, where it caches instead, counts by its entries.
	tuned, err := Render(goldenConfigs["tuned"])
	if err != nil {
		t.Fatal(err)
	}
	hazards, _ = Check(tuned, CheckOptions{MemoryLimit: 64 << 20})
	if len(hazards) != 1 || !strings.Contains(hazards[0].Problem, "and the cache plugin holds up to 41984 entries, bounded in number only") {
		t.Errorf("got %v", hazards)
	}
	// max_memory, and a capacity too small to reach it, bound what wirecache holds.
	for _, tc := range []struct{ options, want string }{
		{"max_memory 1MiB", "at most 5 MiB of answers"},            // 4.5 MiB + 1 MiB
		{"max_memory 33554432", "at most 36 MiB of answers"},       // 4.5 MiB + 32 MiB
		{"capacity 100", "at most 5 MiB of answers"},               // 4.5 MiB + 100×11 KiB
		{"capacity 100\n        max_memory 64Ki", "at most 4 MiB"}, // 4.5 MiB + 64 KiB
	} {
		changed := strings.Replace(string(out), "    wirecache {\n        capacity 30720\n        max_memory 7680KiB\n",
			"    wirecache {\n        "+tc.options+"\n", 1)
		hazards, _ := Check([]byte(changed), CheckOptions{MemoryLimit: 32 << 20})
		if len(hazards) != 1 || !strings.Contains(hazards[0].Problem, tc.want) {
			t.Errorf("%s: got %v, want %q", tc.options, hazards, tc.want)
		}
	}
}

// TestCheckKnowsWireCache keeps Check's figures for wirecache equal to the plugin's.
func TestCheckKnowsWireCache(t *testing.T) {
	// The entry bound may be above wirecache's figure (it then overestimates a little), never below it.
	if defaultWireCacheCapacity != wirecache.DefaultCapacity || defaultWireCacheMaxMemory != wirecache.DefaultMaxMemory ||
		defaultTCPConnections != wirecache.DefaultTCPConnections || defaultTCPConnectionsPerClient != wirecache.DefaultTCPConnectionsPerClient ||
		maxHeldRefusals != wirecache.MaxHeldRefusals ||
		wireCacheMaxEntryBytes < wirecache.MinMaxMemory || wireCacheMaxEntryBytes > wirecache.MinMaxMemory+2048 {
		t.Errorf("Check assumes capacity %d, max_memory %d, entries of at most %d bytes, %d TCP connections; wirecache has %d, %d, %d, %d",
			defaultWireCacheCapacity, defaultWireCacheMaxMemory, wireCacheMaxEntryBytes, defaultTCPConnections,
			wirecache.DefaultCapacity, wirecache.DefaultMaxMemory, wirecache.MinMaxMemory, wirecache.DefaultTCPConnections)
	}
	// The sizes themselves are read by internal/bytesize, for Check and wirecache alike.
}

func TestCheckParseError(t *testing.T) {
	if _, err := Check([]byte(".:53 {\n  forward . 1.1.1.1 {\n}\n"), CheckOptions{}); err == nil {
		t.Error("no error for unbalanced braces")
	}
}

func TestHazardString(t *testing.T) {
	h := Hazard{Line: 7, Kind: HazardNoLoop, Problem: "p", Fix: "f"}
	if got := h.String(); got != "line 7: no-loop: p; fix: f" {
		t.Errorf("got %q", got)
	}
}
