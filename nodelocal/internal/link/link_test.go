//go:build linux

package link

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/netnstest"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

var (
	v4 = netip.MustParseAddr("169.254.20.10")
	v6 = netip.MustParseAddr("fd00::10")
)

// fresh starts the test in a network namespace of its own.
func fresh(t *testing.T) bool {
	t.Helper()
	privtest.RequirePrivileged(t, "ip")
	return netnstest.Run(t)
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func mustNew(t *testing.T, opts Options) *Manager {
	t.Helper()
	m, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// checkUsable verifies the link is up and that every address is local and can be bound at once.
func checkUsable(t *testing.T, name string, addrs ...netip.Addr) {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s is down", name)
	}
	list, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		i := slices.IndexFunc(list, func(x netlink.Addr) bool { return x.IP.Equal(net.IP(a.AsSlice())) })
		if i < 0 {
			t.Errorf("%s lacks %s: %v", name, a, list)
			continue
		}
		if ones, _ := list[i].Mask.Size(); ones != a.BitLen() {
			t.Errorf("%s holds %s with prefix length %d", name, a, ones)
		}
		if a.Is6() && list[i].Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
			t.Errorf("%s is tentative: flags %#x", a, list[i].Flags)
		}
		pc, err := net.ListenPacket("udp", netip.AddrPortFrom(a, 0).String())
		if err != nil {
			t.Errorf("bind %s: %v", a, err)
			continue
		}
		pc.Close()
	}
}

func TestEnsureCreatesUsableLink(t *testing.T) {
	if !fresh(t) {
		return
	}
	ctx := context.Background()
	m := mustNew(t, Options{})
	res, err := m.Ensure(ctx, []netip.Addr{v4, v6})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || !res.Owned || len(res.Added) != 2 || len(res.Foreign) != 0 {
		t.Errorf("first Ensure: %+v", res)
	}
	if res.FellBack != (res.Kind == "bridge") || (res.Kind != "dummy" && res.Kind != "bridge") {
		t.Errorf("kind %s, fell back %v", res.Kind, res.FellBack)
	}
	t.Logf("kind %s (fell back: %v)", res.Kind, res.FellBack)
	checkUsable(t, DefaultName, v4, v6)

	res, err = m.Ensure(ctx, []netip.Addr{v4, v6})
	if err != nil {
		t.Fatal(err)
	}
	if res.Created || res.BroughtUp || len(res.Added) != 0 || !slices.Equal(res.Present, []netip.Addr{v4, v6}) {
		t.Errorf("second Ensure changed something: %+v", res)
	}
}

func TestFallbackToBridgeWithoutDummy(t *testing.T) {
	if !fresh(t) {
		return
	}
	add := AddFunc(netlink.LinkAdd)
	if netnstest.KernelHasDummy(t) {
		// Stand in for a kernel without the dummy type.
		add = func(l netlink.Link) error {
			if l.Type() == "dummy" {
				return unix.EOPNOTSUPP
			}
			return netlink.LinkAdd(l)
		}
	} else {
		t.Log("the kernel has no dummy link type: this is the real fallback")
	}
	m := mustNew(t, Options{Add: add})
	res, err := m.Ensure(context.Background(), []netip.Addr{v4, v6})
	if err != nil {
		t.Fatal(err)
	}
	if !res.FellBack || res.Kind != "bridge" || !res.Owned {
		t.Errorf("Ensure: %+v", res)
	}
	l, err := netlink.LinkByName(DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	if br, ok := l.(*netlink.Bridge); !ok {
		t.Errorf("link is %T", l)
	} else if l.Attrs().MasterIndex != 0 {
		t.Errorf("bridge %v is enslaved", br.Attrs())
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range links {
		if x.Attrs().MasterIndex == l.Attrs().Index {
			t.Errorf("the bridge has port %s", x.Attrs().Name)
		}
	}
	checkUsable(t, DefaultName, v4, v6)
}

func TestDummyPath(t *testing.T) {
	if !fresh(t) {
		return
	}
	add := AddFunc(netlink.LinkAdd)
	wantKind := "dummy"
	if !netnstest.KernelHasDummy(t) {
		// Stand in for a kernel with the dummy type: create an ifb, another port-less local link, when
		// asked for a dummy, and refuse anything else so that a fallback would show.
		wantKind = "ifb"
		add = func(l netlink.Link) error {
			if _, ok := l.(*netlink.Dummy); !ok {
				return errors.New("test: only dummy links may be created here")
			}
			return netlink.LinkAdd(&netlink.Ifb{LinkAttrs: *l.Attrs()})
		}
		t.Log("the kernel has no dummy link type: a stand-in creates an ifb link instead")
	}
	m := mustNew(t, Options{Add: add})
	res, err := m.Ensure(context.Background(), []netip.Addr{v4, v6})
	if err != nil {
		t.Fatal(err)
	}
	if res.FellBack || !res.Created || res.Kind != wantKind || !res.Owned {
		t.Errorf("Ensure: %+v", res)
	}
	checkUsable(t, DefaultName, v4, v6)
	if err := m.Teardown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(DefaultName); err == nil {
		t.Error("Teardown left the link it created")
	}
}

func TestEnsureRepairs(t *testing.T) {
	if !fresh(t) {
		return
	}
	ctx := context.Background()
	m := mustNew(t, Options{})
	want := []netip.Addr{v4, v6}
	if _, err := m.Ensure(ctx, want); err != nil {
		t.Fatal(err)
	}
	damages := []struct {
		name  string
		args  []string
		check func(Result) bool
	}{
		{"address deleted", []string{"addr", "del", "169.254.20.10/32", "dev", DefaultName}, func(r Result) bool { return slices.Equal(r.Added, []netip.Addr{v4}) }},
		{"IPv6 address deleted", []string{"addr", "del", "fd00::10/128", "dev", DefaultName}, func(r Result) bool { return slices.Equal(r.Added, []netip.Addr{v6}) }},
		{"link down", []string{"link", "set", DefaultName, "down"}, func(r Result) bool { return r.BroughtUp }},
		{"link deleted", []string{"link", "del", DefaultName}, func(r Result) bool { return r.Created && len(r.Added) == 2 }},
	}
	for _, d := range damages {
		ip(t, d.args...)
		res, err := m.Ensure(ctx, want)
		if err != nil {
			t.Fatalf("%s: %v", d.name, err)
		}
		if !d.check(res) {
			t.Errorf("%s: Ensure did %+v", d.name, res)
		}
		checkUsable(t, DefaultName, want...)
	}
}

func TestForeignAddressesAndLinks(t *testing.T) {
	if !fresh(t) {
		return
	}
	ctx := context.Background()
	// Someone else made the link and put an address on it, one of ours among others.
	ip(t, "link", "add", DefaultName, "type", "bridge")
	ip(t, "addr", "add", "192.0.2.1/24", "dev", DefaultName)
	ip(t, "addr", "add", "169.254.20.10/32", "dev", DefaultName)
	m := mustNew(t, Options{})
	v4b := netip.MustParseAddr("169.254.20.11")
	res, err := m.Ensure(ctx, []netip.Addr{v4, v4b, v6})
	if err != nil {
		t.Fatal(err)
	}
	if res.Owned || res.Created || !res.BroughtUp {
		t.Errorf("Ensure on a foreign link: %+v", res)
	}
	if !slices.Equal(res.Added, []netip.Addr{v4b, v6}) {
		t.Errorf("added %v", res.Added)
	}
	if !slices.Equal(res.Foreign, []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}) {
		t.Errorf("foreign %v", res.Foreign)
	}

	// Dropping addresses removes only those we added.
	res, err = m.Ensure(ctx, []netip.Addr{v6})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Removed, []netip.Addr{v4b}) {
		t.Errorf("removed %v, want only %s", res.Removed, v4b)
	}
	if !slices.Equal(res.Foreign, []netip.Prefix{netip.MustParsePrefix("169.254.20.10/32"), netip.MustParsePrefix("192.0.2.1/24")}) {
		t.Errorf("foreign %v", res.Foreign)
	}

	for i := range 2 {
		if err := m.Teardown(ctx); err != nil {
			t.Fatalf("teardown %d: %v", i+1, err)
		}
	}
	l, err := netlink.LinkByName(DefaultName)
	if err != nil {
		t.Fatalf("Teardown removed a link it did not create: %v", err)
	}
	list, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range list {
		got = append(got, a.IPNet.String())
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"169.254.20.10/32", "192.0.2.1/24"}) {
		t.Errorf("after Teardown the link holds %v", got)
	}
	list, err = netlink.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list {
		if a.IP.Equal(net.IP(v6.AsSlice())) {
			t.Errorf("Teardown left %s, which it added", v6)
		}
	}
}

func TestTeardownRemovesLinkLeftByEarlierProcess(t *testing.T) {
	if !fresh(t) {
		return
	}
	ctx := context.Background()
	if _, err := mustNew(t, Options{}).Ensure(ctx, []netip.Addr{v4}); err != nil {
		t.Fatal(err)
	}
	// A new Manager, as after a restart, knows the link by its alias.
	later := mustNew(t, Options{})
	res, err := later.Ensure(ctx, []netip.Addr{v4})
	if err != nil {
		t.Fatal(err)
	}
	if res.Created || !res.Owned {
		t.Errorf("Ensure after restart: %+v", res)
	}
	for i := range 2 {
		if err := later.Teardown(ctx); err != nil {
			t.Fatalf("teardown %d: %v", i+1, err)
		}
	}
	if _, err := netlink.LinkByName(DefaultName); err == nil {
		t.Error("the link is still there")
	}
}

func TestErrorsSayWhatWasBeingDone(t *testing.T) {
	if !fresh(t) {
		return
	}
	m := mustNew(t, Options{Name: "nl-test", Add: func(netlink.Link) error { return unix.EPERM }})
	_, err := m.Ensure(context.Background(), []netip.Addr{v4})
	var le *Error
	if !errors.As(err, &le) || le.Phase != Change || !strings.Contains(err.Error(), "create dummy link nl-test") || !errors.Is(err, unix.EPERM) {
		t.Errorf("Ensure with a failing create: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = mustNew(t, Options{}).Ensure(ctx, []netip.Addr{v4})
	if !errors.As(err, &le) || le.Phase != Check || !errors.Is(err, context.Canceled) {
		t.Errorf("Ensure with a cancelled context: %v", err)
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"nodelocaldns", "a", "nl-dns.0", strings.Repeat("x", 15)} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "a:b", "a b", strings.Repeat("x", 16), "ü"} {
		if err := ValidName(bad); err == nil {
			t.Errorf("ValidName(%q) accepts", bad)
		}
	}
}

func TestRemoveAddresses(t *testing.T) {
	if !fresh(t) {
		return
	}
	ctx := context.Background()
	m := mustNew(t, Options{})
	if removed, err := m.RemoveAddresses(ctx, []netip.Addr{v4}); err != nil || len(removed) != 0 {
		t.Fatalf("without a link: removed %v, %v", removed, err)
	}
	clusterIP := netip.MustParseAddr("10.96.0.10")
	if _, err := m.Ensure(ctx, []netip.Addr{v4, v6, clusterIP}); err != nil {
		t.Fatal(err)
	}
	// Another Manager, as in another process, removes what the first added.
	other := mustNew(t, Options{})
	removed, err := other.RemoveAddresses(ctx, []netip.Addr{clusterIP, v6, netip.MustParseAddr("10.96.0.99")})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []netip.Addr{clusterIP, v6}) {
		t.Errorf("removed %v, want [10.96.0.10 fd00::10]", removed)
	}
	checkUsable(t, DefaultName, v4)
	out, err := exec.Command("ip", "addr", "show", "dev", DefaultName).CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "10.96.0.10") || strings.Contains(string(out), "fd00::10") {
		t.Errorf("addresses still on the link:\n%s", out)
	}
}
