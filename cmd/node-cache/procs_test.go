//go:build linux

package main

import "testing"

func TestMaxProcs(t *testing.T) {
	if procs, set := maxProcs(func(string) (string, bool) { return "", false }); procs != 1 || !set {
		t.Errorf("without GOMAXPROCS: %d, %v; want 1, true", procs, set)
	}
	for _, v := range []string{"1", "2", "16", ""} {
		lookup := func(name string) (string, bool) { return v, name == "GOMAXPROCS" }
		if _, set := maxProcs(lookup); set {
			t.Errorf("GOMAXPROCS=%q was overridden", v)
		}
	}
}
