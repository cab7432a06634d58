// Command ociimage writes a single-layer OCI image archive (an OCI image
// layout packed as a tar: oci-layout, index.json, blobs/sha256/...) from a
// root filesystem directory. The archive can be imported with
//
//	ctr -n k8s.io images import IMAGE.tar
//
// It is part of the VM test harness (test/vm/vm.sh) and only uses the
// standard library. The output is reproducible: file owners are 0:0 and all
// timestamps are fixed.
//
// Usage:
//
//	ociimage -rootfs DIR -name localhost/resize-agent/busybox:latest \
//	         [-entrypoint '["/bin/sh"]'] [-cmd '["-c","echo hi"]'] \
//	         [-env PATH=/bin] -o image.tar
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// epoch is the timestamp used for every file and for the image config.
var epoch = time.Unix(0, 0).UTC()

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	var (
		rootfs     = flag.String("rootfs", "", "root filesystem directory to pack as the only layer")
		name       = flag.String("name", "", "full image reference, e.g. localhost/resize-agent/busybox:latest")
		out        = flag.String("o", "", "output OCI archive (tar)")
		entrypoint = flag.String("entrypoint", "", "JSON array for config.Entrypoint")
		cmd        = flag.String("cmd", "", "JSON array for config.Cmd")
		workdir    = flag.String("workdir", "/", "config.WorkingDir")
		envs       stringList
	)
	flag.Var(&envs, "env", "KEY=VALUE for config.Env (repeatable)")
	flag.Parse()
	if *rootfs == "" || *name == "" || *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	if len(envs) == 0 {
		envs = stringList{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	if err := run(*rootfs, *name, *out, *entrypoint, *cmd, *workdir, envs); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func parseJSONList(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var l []string
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return nil, fmt.Errorf("parse %q as a JSON string array: %w", s, err)
	}
	return l, nil
}

func run(rootfs, name, out, entrypoint, cmd, workdir string, envs []string) error {
	ep, err := parseJSONList(entrypoint)
	if err != nil {
		return err
	}
	cm, err := parseJSONList(cmd)
	if err != nil {
		return err
	}

	// The layer: uncompressed tar (for the diff ID) and its gzip (the blob).
	var layerTar bytes.Buffer
	if err := writeLayer(&layerTar, rootfs); err != nil {
		return err
	}
	var layerGz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&layerGz, gzip.BestSpeed)
	zw.ModTime = epoch
	if _, err := zw.Write(layerTar.Bytes()); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	diffID := digest(layerTar.Bytes())

	config := map[string]any{
		"created":      epoch.Format(time.RFC3339),
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Env":        envs,
			"Entrypoint": ep,
			"Cmd":        cm,
			"WorkingDir": workdir,
		},
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{diffID},
		},
		"history": []map[string]any{{
			"created":    epoch.Format(time.RFC3339),
			"created_by": "resize-agent test/vm/ociimage",
		}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return err
	}

	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config": descriptor{
			MediaType: "application/vnd.oci.image.config.v1+json",
			Digest:    digest(configJSON),
			Size:      int64(len(configJSON)),
		},
		"layers": []descriptor{{
			MediaType: "application/vnd.oci.image.layer.v1.tar+gzip",
			Digest:    digest(layerGz.Bytes()),
			Size:      int64(layerGz.Len()),
		}},
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return err
	}

	tag := "latest"
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		tag = name[i+1:]
	}
	index := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []descriptor{{
			MediaType: "application/vnd.oci.image.manifest.v1+json",
			Digest:    digest(manifestJSON),
			Size:      int64(len(manifestJSON)),
			Annotations: map[string]string{
				// containerd's importer uses this as the full image name.
				"io.containerd.image.name": name,
				// The OCI standard annotation (the tag only).
				"org.opencontainers.image.ref.name": tag,
			},
			Platform: &platform{Architecture: runtime.GOARCH, OS: "linux"},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}

	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", indexJSON},
		{blobPath(manifestJSON), manifestJSON},
		{blobPath(configJSON), configJSON},
		{blobPath(layerGz.Bytes()), layerGz.Bytes()},
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	for _, file := range files {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: file.name, Mode: 0o644, Size: int64(len(file.data)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(file.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// writeLayer packs dir as a layer tar: sorted entries, owner 0:0, fixed
// times; regular files, directories and symlinks only.
func writeLayer(w io.Writer, dir string) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	tw := tar.NewWriter(w)
	for _, p := range paths {
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{
			Name:    filepath.ToSlash(rel),
			Mode:    int64(fi.Mode().Perm()),
			ModTime: epoch,
			Format:  tar.FormatPAX,
		}
		if fi.Mode()&fs.ModeSetuid != 0 {
			hdr.Mode |= 0o4000
		}
		if fi.Mode()&fs.ModeSetgid != 0 {
			hdr.Mode |= 0o2000
		}
		if fi.Mode()&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		switch {
		case fi.IsDir():
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = target
		case fi.Mode().IsRegular():
			hdr.Typeflag = tar.TypeReg
			hdr.Size = fi.Size()
		default:
			return fmt.Errorf("%s: unsupported file type %v", p, fi.Mode().Type())
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(b []byte) string {
	sum := sha256.Sum256(b)
	return "blobs/sha256/" + hex.EncodeToString(sum[:])
}
