package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
)

// defaultPGO is the CPU profile `go build` optimises this package with (-pgo=auto), recorded by bench/pgo.sh.
const defaultPGO = "default.pgo"

// modulePath is this module's path, the prefix of its functions' names in a profile.
const modulePath = "github.com/nodelocaldns/nodelocaldns"

// hotShare is the share of a profile's CPU time (on the stack) from which one of this module's functions
// counts as hot.
const hotShare = 0.01

// TestProfileNamesThisTreesHotFunctions: every function of this module that default.pgo's samples spent at
// least 1 % of their time in (on the stack) is still declared in this tree. The compiler matches a profile to
// the code by function name: a hot function renamed or removed since the profile was recorded is optimised as
// if the profile did not exist, and nothing else says so. bench/pgo.sh records a new one.
func TestProfileNamesThisTreesHotFunctions(t *testing.T) {
	f, err := os.Open(defaultPGO)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", defaultPGO, err)
	}
	cpu := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			cpu = i
		}
	}
	if cpu < 0 {
		t.Fatalf("%s is not a CPU profile: sample types %v", defaultPGO, p.SampleType)
	}
	var total int64
	onStack := map[string]int64{}
	for _, s := range p.Sample {
		v := s.Value[cpu]
		total += v
		seen := map[string]bool{}
		for _, loc := range s.Location {
			for _, line := range loc.Line {
				name := line.Function.Name
				if (strings.HasPrefix(name, modulePath+"/") || strings.HasPrefix(name, modulePath+".")) && !seen[name] {
					seen[name] = true
					onStack[name] += v
				}
			}
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]map[string]bool{}
	hot := 0
	for name, v := range onStack {
		share := float64(v) / float64(total)
		if share < hotShare {
			continue
		}
		hot++
		pkg, fn, err := splitFuncName(name)
		if err != nil {
			t.Error(err)
			continue
		}
		if declared[pkg] == nil {
			dir := filepath.Join(root, strings.TrimPrefix(strings.TrimPrefix(pkg, modulePath), "/"))
			if declared[pkg], err = declaredFuncs(dir); err != nil {
				t.Fatal(err)
			}
		}
		if !declared[pkg][fn] {
			t.Errorf("%s, %.1f %% of the profile's time, is not declared in this tree: record a new %s with bench/pgo.sh",
				name, 100*share, defaultPGO)
		}
	}
	if hot == 0 {
		t.Fatalf("no function of this module has %.0f %% of %s's time: not a profile of node-cache's work", 100*hotShare, defaultPGO)
	}
}

// closureSuffix matches what the compiler appends to the name of a function literal, go or defer statement's
// wrapper, or numbered init: func1, gowrap2, deferwrap1, 3.
var closureSuffix = regexp.MustCompile(`^(func|gowrap|deferwrap)?[0-9]+$`)

// splitFuncName splits a function's name as a profile gives it, such as
// "example.com/m/pkg.(*T[...]).Method.func1", into its package's path and the function it was declared as:
// "F" or "T.Method", type parameters and closures dropped.
func splitFuncName(name string) (pkg, fn string, err error) {
	// Type arguments come first: a shape's name may hold slashes and dots.
	var b strings.Builder
	depth := 0
	for _, r := range name {
		switch {
		case r == '[':
			depth++
		case r == ']':
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	plain := b.String()
	slash := strings.LastIndex(plain, "/")
	dot := strings.Index(plain[slash+1:], ".")
	if dot < 0 {
		return "", "", fmt.Errorf("%q is not a package-qualified function name", name)
	}
	pkg, rest := plain[:slash+1+dot], plain[slash+1+dot+1:]
	// A method value's wrapper is the method's name with -fm.
	rest = strings.TrimSuffix(rest, "-fm")
	parts := strings.Split(strings.NewReplacer("(*", "", ")", "").Replace(rest), ".")
	closure := false
	for len(parts) > 1 && closureSuffix.MatchString(parts[len(parts)-1]) {
		parts, closure = parts[:len(parts)-1], true
	}
	// A closure of a function inlined into the method declared has the inlined function's name after the
	// method's: "(*T).M.Inlined.func1".
	if closure && strings.HasPrefix(rest, "(*") && len(parts) > 2 {
		parts = parts[:2]
	}
	if len(parts) > 2 {
		return "", "", fmt.Errorf("%q: cannot tell the declared function from %q", name, rest)
	}
	return pkg, strings.Join(parts, "."), nil
}

// declaredFuncs returns the functions the Go files (tests left out) in dir declare, as splitFuncName names
// them: "F", or "T.Method" for a method of T or *T. A package that is gone declares none.
func declaredFuncs(dir string) (map[string]bool, error) {
	funcs := map[string]bool{}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return funcs, nil
	}
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if fd.Recv == nil || len(fd.Recv.List) == 0 {
				funcs[fd.Name.Name] = true
				continue
			}
			funcs[receiverType(fd.Recv.List[0].Type)+"."+fd.Name.Name] = true
		}
	}
	return funcs, nil
}

// receiverType returns the name of a method's receiver type: T for T, *T, T[P] and *T[P].
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// TestSplitFuncName holds splitFuncName to the names Go's profiles give.
func TestSplitFuncName(t *testing.T) {
	for _, tc := range []struct{ name, pkg, fn string }{
		{"github.com/nodelocaldns/nodelocaldns/plugin/wirecache.(*fastReader).run", modulePath + "/plugin/wirecache", "fastReader.run"},
		{"github.com/nodelocaldns/nodelocaldns/plugin/wirecache.parseWireQuery", modulePath + "/plugin/wirecache", "parseWireQuery"},
		{"github.com/nodelocaldns/nodelocaldns/plugin/wirecache.newFastReader.func2", modulePath + "/plugin/wirecache", "newFastReader"},
		{"github.com/nodelocaldns/nodelocaldns/plugin/upstreamsvc.(*pipeline).start.gowrap1", modulePath + "/plugin/upstreamsvc", "pipeline.start"},
		{"github.com/nodelocaldns/nodelocaldns/plugin/wirecache.child[go.shape.interface { Inc() }]", modulePath + "/plugin/wirecache", "child"},
		{"internal/sync.(*HashTrieMap[go.shape.interface {},go.shape.*example.com/a/b.T]).Load", "internal/sync", "HashTrieMap.Load"},
		{"github.com/nodelocaldns/nodelocaldns.init.0", modulePath, "init"},
		{"main.main.func1.2", "main", "main"},
		{"github.com/nodelocaldns/nodelocaldns/plugin/wirecache.(*fastReader).recv-fm", modulePath + "/plugin/wirecache", "fastReader.recv"},
		{"github.com/nodelocaldns/nodelocaldns/plugin/upstreamsvc.(*rawStream).readMessages.Serve.func2", modulePath + "/plugin/upstreamsvc", "rawStream.readMessages"},
	} {
		pkg, fn, err := splitFuncName(tc.name)
		if err != nil || pkg != tc.pkg || fn != tc.fn {
			t.Errorf("splitFuncName(%q) = %q, %q, %v; want %q, %q", tc.name, pkg, fn, err, tc.pkg, tc.fn)
		}
	}
}
