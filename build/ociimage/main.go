// Command ociimage writes an OCI image layout (and optionally an oci-archive tarball of it) from directories,
// one layer each, reproducibly: the same directories and flags give the same bytes and so the same digest.
// Files are packed in lexical order, owned by root, with every timestamp set to SOURCE_DATE_EPOCH (or -epoch);
// the configuration's times are the same instant. build/image.sh assembles the directories and runs it.
//
//	go run ./build/ociimage -out bin/image -name ghcr.io/nodelocaldns/node-cache -tag 0.1.0 \
//	    -layer 'debian packages=DIR1' -layer 'node-cache=DIR2' -entrypoint /node-cache
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// listFlag is a flag given once per value.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("ociimage", flag.ContinueOnError)
	var layers, env, labels, entrypoint listFlag
	out := fs.String("out", "", "the OCI layout directory to write (replaced)")
	archive := fs.String("archive", "", "also write the layout as this oci-archive tarball")
	name := fs.String("name", "", "the image's repository, e.g. ghcr.io/nodelocaldns/node-cache")
	tag := fs.String("tag", "", "the image's tag")
	arch := fs.String("arch", runtime.GOARCH, "the image's architecture (GOARCH)")
	epochFlag := fs.String("epoch", os.Getenv("SOURCE_DATE_EPOCH"), "every timestamp in the image, in seconds since 1970 (default $SOURCE_DATE_EPOCH)")
	fs.Var(&layers, "layer", "HISTORY=DIR: a layer from the tree under DIR (the text after the last =), with HISTORY as its history line; repeat, lowest first")
	fs.Var(&entrypoint, "entrypoint", "the entry point's words; repeat")
	fs.Var(&env, "env", "KEY=VALUE of the image's environment; repeat")
	fs.Var(&labels, "label", "KEY=VALUE label; repeat")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *name == "" || *tag == "" || len(layers) == 0 || len(entrypoint) == 0 {
		return fmt.Errorf("-out, -name, -tag, -layer and -entrypoint are required")
	}
	secs, err := strconv.ParseInt(*epochFlag, 10, 64)
	if err != nil {
		return fmt.Errorf("-epoch or SOURCE_DATE_EPOCH %q: want seconds since 1970: %w", *epochFlag, err)
	}
	img := image{
		Entrypoint: entrypoint,
		Env:        env,
		Arch:       *arch,
		Epoch:      time.Unix(secs, 0),
		Refs: map[string]string{
			// The tag, as `skopeo copy oci:DIR:TAG` and `umoci unpack --image DIR:TAG` find it, and the full
			// name, which `ctr images import` gives the image.
			"org.opencontainers.image.ref.name": *tag,
			"io.containerd.image.name":          *name + ":" + *tag,
		},
	}
	for _, l := range layers {
		i := strings.LastIndex(l, "=")
		history, dir := l[:max(i, 0)], l[i+1:]
		if i < 0 || dir == "" {
			return fmt.Errorf("-layer %q: want HISTORY=DIR", l)
		}
		img.Layers = append(img.Layers, layer{Dir: dir, CreatedBy: history})
	}
	if len(labels) > 0 {
		img.Labels = map[string]string{}
		for _, kv := range labels {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("-label %q: want KEY=VALUE", kv)
			}
			img.Labels[k] = v
		}
	}
	if err := os.RemoveAll(*out); err != nil {
		return err
	}
	res, err := writeLayout(*out, img)
	if err != nil {
		return fmt.Errorf("writing %s: %w", *out, err)
	}
	if *archive != "" {
		if err := writeArchive(*archive, *out, img.Epoch); err != nil {
			return err
		}
	}
	fmt.Printf("%s:%s %s: %d layers, %.1f MB compressed, %.1f MB unpacked\n", *name, *tag, res.Digest,
		len(img.Layers), float64(res.Compressed)/1e6, float64(res.Uncompressed)/1e6)
	return nil
}
