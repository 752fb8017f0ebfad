package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// The OCI media types this tool writes (image-spec v1.1).
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

// imageConfig is the OCI image configuration; only the fields this image sets.
type imageConfig struct {
	Created      string `json:"created"`
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		Env        []string          `json:"Env"`
		Labels     map[string]string `json:"Labels,omitempty"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
	History []history `json:"history"`
}

type history struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

// layer is one layer: a directory and the line its history gets.
type layer struct {
	Dir, CreatedBy string
}

// image is what to write: the layers in order and the configuration of the image made of them.
type image struct {
	Layers     []layer
	Entrypoint []string
	Env        []string
	Labels     map[string]string
	Arch       string
	// Epoch is every timestamp in the image: the files' and the configuration's (SOURCE_DATE_EPOCH).
	Epoch time.Time
	// Refs are the index's annotations naming the image (the tag, the full name).
	Refs map[string]string
}

// result says what was written.
type result struct {
	Digest       string // the manifest's, the image's digest
	Compressed   int64  // the layers' bytes as pulled
	Uncompressed int64  // the layers' bytes unpacked (tar streams)
}

// writeLayout writes img as an OCI image layout in dir, which must not exist yet.
func writeLayout(dir string, img image) (result, error) {
	var res result
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return res, fmt.Errorf("creating %s: %w", blobs, err)
	}
	created := img.Epoch.UTC().Format(time.RFC3339)
	var cfg imageConfig
	cfg.Created, cfg.Architecture, cfg.OS = created, img.Arch, "linux"
	cfg.Config.Entrypoint, cfg.Config.Env, cfg.Config.Labels = img.Entrypoint, img.Env, img.Labels
	cfg.RootFS.Type = "layers"
	m := manifest{SchemaVersion: 2, MediaType: mediaTypeManifest}
	for _, l := range img.Layers {
		var raw bytes.Buffer
		if err := tarDir(&raw, l.Dir, img.Epoch); err != nil {
			return res, fmt.Errorf("packing layer %s: %w", l.Dir, err)
		}
		diffID := sha256.Sum256(raw.Bytes())
		var gz bytes.Buffer
		zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
		if err != nil {
			return res, err
		}
		if _, err := zw.Write(raw.Bytes()); err != nil {
			return res, fmt.Errorf("compressing layer %s: %w", l.Dir, err)
		}
		if err := zw.Close(); err != nil {
			return res, fmt.Errorf("compressing layer %s: %w", l.Dir, err)
		}
		d, err := writeBlob(blobs, mediaTypeLayer, gz.Bytes())
		if err != nil {
			return res, err
		}
		m.Layers = append(m.Layers, d)
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, "sha256:"+hex.EncodeToString(diffID[:]))
		cfg.History = append(cfg.History, history{Created: created, CreatedBy: l.CreatedBy})
		res.Compressed += d.Size
		res.Uncompressed += int64(raw.Len())
	}
	var err error
	if m.Config, err = writeJSONBlob(blobs, mediaTypeConfig, cfg); err != nil {
		return res, err
	}
	md, err := writeJSONBlob(blobs, mediaTypeManifest, m)
	if err != nil {
		return res, err
	}
	md.Platform = &platform{Architecture: img.Arch, OS: "linux"}
	md.Annotations = img.Refs
	idx, err := json.Marshal(index{SchemaVersion: 2, MediaType: mediaTypeIndex, Manifests: []descriptor{md}})
	if err != nil {
		return res, err
	}
	if err := writePublic(filepath.Join(dir, "index.json"), idx); err != nil {
		return res, fmt.Errorf("writing index.json: %w", err)
	}
	if err := writePublic(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return res, fmt.Errorf("writing oci-layout: %w", err)
	}
	res.Digest = md.Digest
	return res, nil
}

func writeJSONBlob(blobs, mediaType string, v any) (descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return descriptor{}, err
	}
	return writeBlob(blobs, mediaType, b)
}

// writeBlob stores b under its digest and returns its descriptor.
func writeBlob(blobs, mediaType string, b []byte) (descriptor, error) {
	sum := sha256.Sum256(b)
	hexSum := hex.EncodeToString(sum[:])
	if err := writePublic(filepath.Join(blobs, hexSum), b); err != nil {
		return descriptor{}, fmt.Errorf("writing blob %s: %w", hexSum, err)
	}
	return descriptor{MediaType: mediaType, Digest: "sha256:" + hexSum, Size: int64(len(b))}, nil
}

// writePublic writes a file of the layout: readable by everyone, as the tools that push or import it may not
// run as its owner, and as a registry serves it.
func writePublic(path string, b []byte) error {
	return os.WriteFile(path, b, 0o644) //nolint:gosec // an image is public content
}

// tarDir writes the tree under root as a tar stream that depends on nothing but the tree's names, contents,
// modes and symlink targets: entries in lexical order (WalkDir's), owned by root, every time set to epoch.
// Directories, regular files and symlinks only; anything else is an error, so that nothing is left out
// unnoticed.
func tarDir(w io.Writer, root string, epoch time.Time) error {
	tw := tar.NewWriter(w)
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h := &tar.Header{
			Name:    filepath.ToSlash(rel),
			Mode:    int64(info.Mode().Perm()),
			ModTime: epoch,
			Format:  tar.FormatPAX,
		}
		if info.Mode()&fs.ModeSetuid != 0 {
			h.Mode |= 0o4000
		}
		if info.Mode()&fs.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		if info.Mode()&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		switch {
		case info.Mode().IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case info.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, info.Size()
		case info.Mode()&fs.ModeSymlink != 0:
			h.Typeflag, h.Mode = tar.TypeSymlink, 0o777
			if h.Linkname, err = os.Readlink(path); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: not a directory, regular file or symlink (%v)", path, info.Mode())
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := r.Open(rel)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// writeArchive writes the layout in dir as one tar stream (an oci-archive, which `ctr images import`,
// `podman load` and `skopeo copy oci-archive:` read), as tarDir does.
func writeArchive(path, dir string, epoch time.Time) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := tarDir(f, dir, epoch); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
