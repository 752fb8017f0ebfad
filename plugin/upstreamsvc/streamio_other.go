//go:build !linux

package upstreamsvc

import "net"

func newStreamIO(c net.Conn) (streamIO, error) { return connIO{c}, nil }
