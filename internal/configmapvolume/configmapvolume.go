// Package configmapvolume writes a directory the way the kubelet's atomic writer projects a ConfigMap volume,
// for tests of a program that reads one (node-cache's -basecorefile and -kubednscm).
//
// The data goes into a new hidden directory named ..<timestamp>, a symlink ..data is pointed at it in one
// rename, and each key is a symlink KEY -> ..data/KEY in the volume's root; keys an update drops lose their
// symlink, and the previous data directory is removed. A reader therefore sees all the old files or all the
// new ones, never a mix.
package configmapvolume

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Volume is one projected ConfigMap volume. Its methods are safe for one goroutine at a time.
type Volume struct {
	dir string
}

// New returns the volume at dir, creating the directory (empty, as an optional ConfigMap that does not exist
// projects).
func New(dir string) (*Volume, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating ConfigMap volume %s: %w", dir, err)
	}
	return &Volume{dir: dir}, nil
}

// Dir is the volume's directory, the path a container mounts it at.
func (v *Volume) Dir() string { return v.dir }

// Project makes data (key -> content) the volume's content.
func (v *Volume) Project(data map[string]string) error {
	// The kubelet names it ..<timestamp>.<random>; a temporary directory's name is unique the same way.
	tsDir, err := os.MkdirTemp(v.dir, ".."+time.Now().UTC().Format("2006_01_02_15_04_05")+".")
	if err != nil {
		return fmt.Errorf("projecting into %s: %w", v.dir, err)
	}
	if err := os.Chmod(tsDir, 0o755); err != nil {
		return fmt.Errorf("projecting into %s: %w", v.dir, err)
	}
	ts := filepath.Base(tsDir)
	for key, value := range data {
		if err := os.WriteFile(filepath.Join(v.dir, ts, key), []byte(value), 0o644); err != nil {
			return fmt.Errorf("projecting %s into %s: %w", key, v.dir, err)
		}
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		return fmt.Errorf("projecting into %s: %w", v.dir, err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		return fmt.Errorf("projecting into %s: %w", v.dir, err)
	}
	entries, err := os.ReadDir(v.dir)
	if err != nil {
		return fmt.Errorf("projecting into %s: %w", v.dir, err)
	}
	for _, e := range entries {
		if name := e.Name(); !strings.HasPrefix(name, "..") {
			if _, keep := data[name]; !keep {
				if err := os.Remove(filepath.Join(v.dir, name)); err != nil {
					return fmt.Errorf("projecting into %s: %w", v.dir, err)
				}
			}
		}
	}
	for key := range data {
		link := filepath.Join(v.dir, key)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", key), link); err != nil {
			return fmt.Errorf("projecting %s into %s: %w", key, v.dir, err)
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, old)); err != nil {
			return fmt.Errorf("projecting into %s: %w", v.dir, err)
		}
	}
	return nil
}
