//go:build linux

package main

import (
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
)

// TestSelectMode: a mode flag selects its mode wherever the flag package reads it, and only there.
func TestSelectMode(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // the side mode, "" for the cache
	}{
		{nil, ""},
		{[]string{"-localip", "169.254.20.10", "-conf", "/etc/Corefile"}, ""},
		{[]string{"-guard", "-localip", "169.254.20.10"}, "guard"},
		{[]string{"-localip", "169.254.20.10", "-guard"}, "guard"},
		{[]string{"--verify"}, "verify"},
		{[]string{"-cleanup=true"}, "cleanup"},
		{[]string{"-guard=false", "-preflight"}, "preflight"},
		{[]string{"-guard=false"}, ""},
		{[]string{"-skipteardown", "-cleanup"}, "cleanup"},                   // a bool flag takes no value
		{[]string{"-p", "5353", "-quiet", "-verify"}, "verify"},              // CoreDNS's flags
		{[]string{"-guard.interval", "1s", "-guard"}, "guard"},               // a side mode's flag, before its mode flag
		{[]string{"-syncinterval", "soon", "-guard"}, "guard"},               // the guard's parse reports the value
		{[]string{"-conf", "-guard"}, ""},                                    // -conf's value
		{[]string{"-setupinterface", "false", "-guard"}, ""},                 // "false" ends the flags
		{[]string{"-localip", "169.254.20.10", "extra", "-verify"}, ""},      // so does any argument
		{[]string{"--", "-verify"}, ""},                                      // and "--"
		{[]string{"-nosuchflag", "-guard"}, ""},                              // the cache's parse reports it
		{[]string{"-verify", "-verify.domain", "k8s.example.org"}, "verify"}, // its own flags
	} {
		m, err := selectMode(tc.args, flag.CommandLine)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		got := ""
		if m != nil {
			got = m.name
		}
		if got != tc.want {
			t.Errorf("%q: mode %q, want %q", tc.args, got, tc.want)
		}
	}
	for _, args := range [][]string{{"-guard", "-verify"}, {"-preflight", "-localip", "169.254.20.10", "--cleanup=true"}} {
		if _, err := selectMode(args, flag.CommandLine); !errors.Is(err, errModesExclusive) {
			t.Errorf("%q: %v, want %v", args, err, errModesExclusive)
		}
	}
}

// flagNames returns the names of fs's flags, without the test binary's own.
func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Name, "test.") {
			names = append(names, f.Name)
		}
	})
	return names
}

// TestModeFlagSets: the modes' flag sets together take every flag node-cache had when one flag set served
// every mode; each side mode takes the cache's flags and its own, and no other mode's.
func TestModeFlagSets(t *testing.T) {
	cache := newModeFlagSet("", flag.CommandLine) // CoreDNS's flags and the mode flags, as on the command line
	registerNodeCacheFlags(cache)
	cacheFlags := flagNames(cache)
	all := slices.Clone(cacheFlags)
	own := map[string][]string{}
	for _, m := range sideModes {
		fs := newModeFlagSet(m.name, flag.CommandLine)
		m.define(fs)
		for _, name := range flagNames(fs) {
			if !slices.Contains(cacheFlags, name) {
				own[m.name] = append(own[m.name], name)
			}
		}
		all = append(all, own[m.name]...)
	}
	slices.Sort(all)
	all = slices.Compact(all)
	// Every flag there was before the modes had flag sets of their own, and since then -daemonset and
	// -kubeconfig (the uninstall watch of the cache and the guard), -servestalepolicy (prefer_positive) and
	// -servestale (serve stale off).
	before := []string{"basecorefile", "cleanup", "cleanup.timeout", "conf", "corefile", "daemonset", "dns.port", "guard",
		"guard.backend", "guard.failafter", "guard.idleinterval", "guard.interval", "guard.lockpath", "guard.probename", "guard.recoverafter",
		"guard.serviceips", "guard.timeout", "guard.upstreamips", "guard.wait", "handover", "health-port", "interfacename",
		"kubeconfig", "kubednscm", "localip", "lockfile", "log-format", "metrics-listen-address", "p", "pidfile", "plugins",
		"preflight", "preflight.kubeletconfig", "preflight.resolvconf", "preflight.xtableslock",
		"prometheus-listen-address", "quiet", "reloadwithsignal", "servestale", "servestalepolicy", "setupinterface", "setupiptables", "skipteardown",
		"syncinterval", "upstreamsvc", "verify", "verify.domain", "verify.external", "verify.name", "verify.readyport",
		"verify.timeout", "version"}
	if !slices.Equal(all, before) {
		t.Errorf("flags of all modes:\n got %s\nwant %s", strings.Join(all, " "), strings.Join(before, " "))
	}
	for mode, want := range map[string][]string{
		"guard": {"guard.backend", "guard.failafter", "guard.idleinterval", "guard.interval", "guard.lockpath", "guard.probename",
			"guard.recoverafter", "guard.serviceips", "guard.timeout", "guard.upstreamips", "guard.wait"},
		"preflight": {"guard.backend", "preflight.kubeletconfig", "preflight.resolvconf", "preflight.xtableslock"},
		"verify":    {"guard.backend", "verify.domain", "verify.external", "verify.name", "verify.readyport", "verify.timeout"},
		"cleanup":   {"cleanup.timeout", "guard.backend"},
	} {
		if got := own[mode]; !slices.Equal(got, want) {
			t.Errorf("-%s's own flags: got %v, want %v", mode, got, want)
		}
	}
}

// TestSideModesTakeTheCacheArguments: each side mode accepts the arguments of the manifests' cache container,
// so that `node-cache -verify` (or any side mode) can run with the cache's own arguments.
func TestSideModesTakeTheCacheArguments(t *testing.T) {
	for _, m := range kubernetes.Manifests {
		objs, err := kubernetes.Load(m.File)
		if err != nil {
			t.Fatal(err)
		}
		args := expandEnv(t, objs.DaemonSets[0].Spec.Template.Spec.Containers[0])
		for _, mode := range sideModes {
			fs := newSideModeFlagSet(mode.name)
			mode.define(fs)
			if err := fs.Parse(append([]string{"-" + mode.name}, args...)); err != nil {
				t.Errorf("%s: -%s with the cache's arguments %q: %v", m.File, mode.name, args, err)
			}
		}
	}
}
