//go:build linux

package main

import (
	"errors"
	"flag"
	"io"
)

// node-cache has five modes. The cache (cache.go) is the one without a mode flag; the side modes each have a
// flag that selects them and a flag set of their own, which holds CoreDNS's flags and the cache's too, so that
// a side mode runs with the cache's own arguments, plus the side mode's. main selects the mode and the mode's
// flag set parses the arguments, once.

// runner is a side mode with its flags defined; run runs it once its flag set is parsed and returns the
// process's exit status.
type runner interface{ run() int }

// sideMode is a mode other than the cache.
type sideMode struct {
	// name is the flag that selects the mode: "guard" for -guard.
	name string
	// usage is that flag's help text.
	usage string
	// define defines the mode's flags on fs, a flag set from newModeFlagSet.
	define func(fs *flag.FlagSet) runner
}

// sideModes are the modes other than the cache; at most one of their flags is given.
var sideModes = []sideMode{
	{name: "guard", usage: "run the fail-open guard beside the cache instead of the cache (see nodelocal.Guard)",
		define: func(fs *flag.FlagSet) runner { return newGuardMode(fs) }},
	{name: "preflight", usage: "check the node for the rollout (kube-proxy mode, addresses, backend, other caches, resolver loop, capabilities, xtables lock), print a report and exit non-zero on errors",
		define: func(fs *flag.FlagSet) runner { return newPreflightMode(fs) }},
	{name: "verify", usage: "check a node after the rollout (link and addresses, rules and their position, answers on every -localip address, lookups untracked by conntrack, readiness), print a table and exit non-zero on any failure",
		define: func(fs *flag.FlagSet) runner { return newVerifyMode(fs) }},
	{name: "cleanup", usage: "remove everything a node cache and its guard left on the node (rules, divert, interface) and exit: for an uninstall " +
		"that did not (no -daemonset, or a cache killed before it was done), after the DaemonSet is gone; fails while a cache runs on the node",
		define: func(fs *flag.FlagSet) runner { return newCleanupMode(fs) }},
}

// errModesExclusive is the usage error of more than one mode flag.
var errModesExclusive = errors.New("-guard, -preflight, -verify and -cleanup exclude each other")

// registerModeFlags defines the mode flags on fs and returns their values, in the order of sideModes. Every
// mode's flag set has them all, so that "-guard=false" is accepted in any mode, as it always was.
func registerModeFlags(fs *flag.FlagSet) []*bool {
	on := make([]*bool, len(sideModes))
	for i, m := range sideModes {
		on[i] = fs.Bool(m.name, false, m.usage)
	}
	return on
}

// newModeFlagSet returns the flag set of the side mode name: the mode flags and the flags of coreDNS (the
// command line, where coremain defines CoreDNS's -conf, -dns.port, -pidfile, ...), sharing their values.
// Parse errors exit with status 2, as the command line's do.
func newModeFlagSet(name string, coreDNS *flag.FlagSet) *flag.FlagSet {
	fs := flag.NewFlagSet("node-cache -"+name, flag.ExitOnError)
	registerModeFlags(fs)
	coreDNS.VisitAll(func(f *flag.Flag) {
		if fs.Lookup(f.Name) == nil {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
	return fs
}

// main runs the side mode: it defines the mode's flags on a flag set of its own next to coreDNS's, parses args
// once and returns the mode's exit status.
func (m *sideMode) main(args []string, coreDNS *flag.FlagSet) int {
	fs := newModeFlagSet(m.name, coreDNS)
	r := m.define(fs)
	_ = fs.Parse(args) // flag.ExitOnError: it returns no error
	return r.run()
}

// selectMode returns the side mode args select, or nil for the cache. It reads args with the flag package,
// knowing every mode's flags and whether each takes a value, so that a mode flag means what it always did
// wherever it stands ("-localip IP -guard", "--guard", "-guard=false"); it keeps no value but the mode
// flags', and an error in args stops it where the selected mode's parse stops and reports it. coreDNS holds
// CoreDNS's flags (the command line).
func selectMode(args []string, coreDNS *flag.FlagSet) (*sideMode, error) {
	scan := flag.NewFlagSet("node-cache", flag.ContinueOnError)
	scan.SetOutput(io.Discard)
	on := registerModeFlags(scan)
	skip := func(fs *flag.FlagSet) {
		fs.VisitAll(func(f *flag.Flag) {
			if scan.Lookup(f.Name) == nil {
				scan.Var(skippedValue{isBool: isBoolFlag(f.Value)}, f.Name, "")
			}
		})
	}
	cache := newModeFlagSet("", coreDNS)
	registerNodeCacheFlags(cache)
	skip(cache)
	for i := range sideModes {
		fs := newModeFlagSet(sideModes[i].name, coreDNS)
		sideModes[i].define(fs)
		skip(fs)
	}
	_ = scan.Parse(args)

	var selected *sideMode
	for i := range sideModes {
		if !*on[i] {
			continue
		}
		if selected != nil {
			return nil, errModesExclusive
		}
		selected = &sideModes[i]
	}
	return selected, nil
}

// skippedValue is a flag selectMode steps over: it takes any value and keeps none.
type skippedValue struct{ isBool bool }

// String is the empty value: selectMode keeps none.
func (skippedValue) String() string { return "" }

// Set takes any value; the selected mode's parse checks it.
func (skippedValue) Set(string) error { return nil }

// IsBoolFlag reports whether the flag it stands for takes no value of its own.
func (v skippedValue) IsBoolFlag() bool { return v.isBool }

// isBoolFlag reports whether the flag package reads a flag of value v without a value of its own ("-skipteardown").
func isBoolFlag(v flag.Value) bool {
	b, ok := v.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
