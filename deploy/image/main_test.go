package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func fakeBinaries(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("\x7fELF"+body+b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// readArchive returns the archive's files by name.
func readArchive(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
}

func blob(t *testing.T, files map[string][]byte, d descriptor) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
	if !ok || digest(b) != d.Digest || int64(len(b)) != d.Size {
		t.Fatalf("blob %s missing or wrong", d.Digest)
	}
	return b
}

func TestArchiveIsAnIndexOfBothPlatforms(t *testing.T) {
	out := filepath.Join(t.TempDir(), "image.tar")
	plats := []platformDir{
		{platform{OS: "linux", Architecture: "amd64"}, fakeBinaries(t, "x86")},
		{platform{OS: "linux", Architecture: "arm64"}, fakeBinaries(t, "arm")},
	}
	if err := run("docker.io/library/resize-agent:dev", out, plats); err != nil {
		t.Fatal(err)
	}
	files := readArchive(t, out)
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Fatalf("oci-layout: %q", files["oci-layout"])
	}
	var top struct{ Manifests []descriptor }
	if err := json.Unmarshal(files["index.json"], &top); err != nil || len(top.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, files["index.json"])
	}
	if d := top.Manifests[0]; d.MediaType != mediaIndex || d.Annotations["io.containerd.image.name"] != "docker.io/library/resize-agent:dev" ||
		d.Annotations["org.opencontainers.image.ref.name"] != "dev" {
		t.Fatalf("index.json's descriptor: %+v", d)
	}
	var idx struct{ Manifests []descriptor }
	if err := json.Unmarshal(blob(t, files, top.Manifests[0]), &idx); err != nil || len(idx.Manifests) != 2 {
		t.Fatalf("image index: %v %+v", err, idx)
	}
	for i, m := range idx.Manifests {
		arch := plats[i].Architecture
		if m.MediaType != mediaManifest || m.Platform == nil || m.Platform.Architecture != arch || m.Platform.OS != "linux" {
			t.Fatalf("manifest %d: %+v", i, m)
		}
		var man struct {
			Config descriptor
			Layers []descriptor
		}
		if err := json.Unmarshal(blob(t, files, m), &man); err != nil || len(man.Layers) != 1 {
			t.Fatalf("manifest %s: %v", arch, err)
		}
		var cfg struct {
			Architecture string
			Config       struct {
				User       string
				Entrypoint []string
			}
			RootFS struct {
				DiffIDs []string `json:"diff_ids"`
			}
		}
		if err := json.Unmarshal(blob(t, files, man.Config), &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.Architecture != arch || cfg.Config.User != "0:0" || len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/usr/local/bin/resize-agent" {
			t.Fatalf("config %s: %+v", arch, cfg)
		}
		zr, err := gzip.NewReader(bytes.NewReader(blob(t, files, man.Layers[0])))
		if err != nil {
			t.Fatal(err)
		}
		layer, _ := io.ReadAll(zr)
		if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != digest(layer) {
			t.Fatalf("diff_ids %v, layer %s", cfg.RootFS.DiffIDs, digest(layer))
		}
		modes := map[string]int64{}
		tr := tar.NewReader(bytes.NewReader(layer))
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Uid != 0 || h.Gid != 0 {
				t.Errorf("%s: owner %d:%d", h.Name, h.Uid, h.Gid)
			}
			modes[h.Name] = h.Mode
			if h.Name == "usr/local/bin/resizectl" {
				b, _ := io.ReadAll(tr)
				if !bytes.Contains(b, []byte(map[string]string{"amd64": "x86", "arm64": "arm"}[arch])) {
					t.Errorf("%s: resizectl of the other platform", arch)
				}
			}
		}
		for name, mode := range map[string]int64{"usr/local/bin/resize-agent": 0o755, "usr/local/bin/resizectl": 0o755, "etc/passwd": 0o644, "tmp/": 0o1777} {
			if modes[name] != mode {
				t.Errorf("%s: %s mode %o, want %o", arch, name, modes[name], mode)
			}
		}
	}

	// Reproducible: the same inputs, the same bytes.
	again := filepath.Join(t.TempDir(), "again.tar")
	if err := run("docker.io/library/resize-agent:dev", again, plats); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Error("two runs over the same inputs wrote different archives")
	}
}

func TestRejectsBadInput(t *testing.T) {
	good := fakeBinaries(t, "x")
	notELF := t.TempDir()
	for _, b := range binaries {
		os.WriteFile(filepath.Join(notELF, b), []byte("#!/bin/sh\n"), 0o755)
	}
	amd64 := platform{OS: "linux", Architecture: "amd64"}
	for name, tc := range map[string]struct {
		ref   string
		plats []platformDir
	}{
		"no tag":          {"docker.io/library/resize-agent", []platformDir{{amd64, good}}},
		"no registry":     {"resize-agent:dev", []platformDir{{amd64, good}}},
		"no platform":     {"docker.io/library/resize-agent:dev", nil},
		"not ELF":         {"docker.io/library/resize-agent:dev", []platformDir{{amd64, notELF}}},
		"missing binary":  {"docker.io/library/resize-agent:dev", []platformDir{{amd64, t.TempDir()}}},
		"upper-case path": {"docker.io/Library/resize-agent:dev", []platformDir{{amd64, good}}},
	} {
		out := filepath.Join(t.TempDir(), "image.tar")
		if err := run(tc.ref, out, tc.plats); err == nil {
			t.Errorf("%s: no error", name)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s: wrote %s anyway", name, out)
		}
	}
	var p platformFlag
	for _, bad := range []string{"linux/amd64", "windows/amd64=x", "linux/386=x", "linux/amd64="} {
		if err := p.Set(bad); err == nil {
			t.Errorf("-platform %q accepted", bad)
		}
	}
	if err := p.Set("linux/amd64=a"); err != nil {
		t.Fatal(err)
	}
	if err := p.Set("linux/amd64=b"); err == nil {
		t.Error("-platform linux/amd64 accepted twice")
	}
}
