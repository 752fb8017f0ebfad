package main

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// tree writes files (path -> content) under a new directory, in the order given, each with mtime.
func tree(t *testing.T, files [][2]string, mtime time.Time) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		path := filepath.Join(dir, f[0])
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(f[1]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("usr/bin", filepath.Join(dir, "bin")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestLayoutIsReproducible: two trees with the same names and contents, written in another order at other
// times, give the same image digest; another epoch gives another.
func TestLayoutIsReproducible(t *testing.T) {
	files := [][2]string{{"usr/bin/a", "a"}, {"etc/b", "b"}, {"usr/lib/c", "c"}}
	reversed := [][2]string{files[2], files[1], files[0]}
	epoch := time.Unix(1700000000, 0)
	write := func(dir string, epoch time.Time) result {
		t.Helper()
		res, err := writeLayout(filepath.Join(t.TempDir(), "image"), image{
			Layers: []layer{{Dir: dir, CreatedBy: "test"}}, Entrypoint: []string{"/a"}, Arch: "amd64", Epoch: epoch,
			Refs: map[string]string{"org.opencontainers.image.ref.name": "v1"},
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	first := write(tree(t, files, time.Unix(1, 0)), epoch)
	second := write(tree(t, reversed, time.Now()), epoch)
	if first.Digest != second.Digest {
		t.Errorf("the same tree gave %s and %s", first.Digest, second.Digest)
	}
	if other := write(tree(t, files, time.Unix(1, 0)), epoch.Add(time.Second)); other.Digest == first.Digest {
		t.Errorf("another SOURCE_DATE_EPOCH gave the same digest %s", other.Digest)
	}
}

// TestTarDirHeaders: entries in lexical order, owned by root, every time the epoch, symlinks kept.
func TestTarDirHeaders(t *testing.T) {
	epoch := time.Unix(1700000000, 0)
	dir := tree(t, [][2]string{{"usr/bin/a", "a"}, {"etc/b", "b"}}, time.Now())
	var buf bytes.Buffer
	if err := tarDir(&buf, dir, epoch); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || !h.ModTime.Equal(epoch) {
			t.Errorf("%s: uid %d gid %d uname %q mtime %v", h.Name, h.Uid, h.Gid, h.Uname, h.ModTime)
		}
		if h.Name == "bin" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/bin") {
			t.Errorf("bin: type %c -> %q, want a symlink to usr/bin", h.Typeflag, h.Linkname)
		}
	}
	want := []string{"bin", "etc/", "etc/b", "usr/", "usr/bin/", "usr/bin/a"}
	if len(names) != len(want) {
		t.Fatalf("entries %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Errorf("entries %v, want %v", names, want)
			break
		}
	}
}
