package netnstest

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// KernelHasDummy reports whether the kernel offers the dummy link type, by creating and deleting one. Call
// it only inside the test's own namespace (after Run returned true).
func KernelHasDummy(t testing.TB) bool {
	t.Helper()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "probe0"
	probe := &netlink.Dummy{LinkAttrs: attrs}
	err := netlink.LinkAdd(probe)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return false
	}
	if err != nil {
		t.Fatalf("probe for the dummy link type: %v", err)
	}
	if err := netlink.LinkDel(probe); err != nil {
		t.Fatalf("deleting the dummy probe link: %v", err)
	}
	return true
}
