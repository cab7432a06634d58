// Command image writes the agent's container image without Docker: an OCI
// image layout packed as a tar (oci-layout, index.json, blobs/sha256/...)
// whose index.json points at one image index with a manifest per platform.
// `ctr images import` and `kind load image-archive` accept it.
//
// Each platform's image has one layer holding what deploy/Dockerfile puts
// in its image: /usr/local/bin/resize-agent and /usr/local/bin/resizectl on
// a distroless-like root (root and nobody in /etc/passwd and /etc/group, a
// /tmp), entrypoint /usr/local/bin/resize-agent, user 0:0, port 9847. The
// archive is reproducible: fixed times, owner 0:0, sorted entries.
//
//	go run ./deploy/image -name docker.io/library/resize-agent:dev -o bin/resize-agent-image.tar \
//	    -platform linux/amd64=bin/image/linux_amd64 -platform linux/arm64=bin/image/linux_arm64
//
// Each -platform directory holds the two static binaries built for it.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"

	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// The OCI media types (opencontainers/image-spec specs-go/v1/mediatype.go).
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// binaries are the files every platform directory must hold.
var binaries = []string{"resize-agent", "resizectl"}

// epoch is every file's and the config's time: the same inputs give the
// same digests.
var epoch = time.Unix(0, 0).UTC()

type platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant,omitempty"`
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

// platformDir is one -platform os/arch=DIR.
type platformDir struct {
	platform
	dir string
}

type platformFlag []platformDir

func (p *platformFlag) String() string { return fmt.Sprint(len(*p)) }

var platformRE = regexp.MustCompile(`^(linux)/(amd64|arm64)=(.+)$`)

func (p *platformFlag) Set(v string) error {
	m := platformRE.FindStringSubmatch(v)
	if m == nil {
		return fmt.Errorf("%q: want linux/amd64=DIR or linux/arm64=DIR", v)
	}
	for _, have := range *p {
		if have.Architecture == m[2] {
			return fmt.Errorf("%q: platform linux/%s given twice", v, m[2])
		}
	}
	*p = append(*p, platformDir{platform{OS: m[1], Architecture: m[2]}, m[3]})
	return nil
}

// refRE is a reference with registry, path and tag, as containerd stores
// names ("docker.io/library/resize-agent:dev").
var refRE = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

func main() {
	var (
		name      = flag.String("name", "docker.io/library/resize-agent:dev", "the image's full name, registry/path:tag")
		out       = flag.String("o", "", "the archive to write")
		platforms platformFlag
	)
	flag.Var(&platforms, "platform", "os/arch=DIR with DIR holding that platform's resize-agent and resizectl (repeatable)")
	flag.Parse()
	if err := run(*name, *out, platforms); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(name, out string, platforms []platformDir) error {
	if !refRE.MatchString(name) {
		return fmt.Errorf("-name %q: want a full reference like docker.io/library/resize-agent:dev", name)
	}
	if out == "" {
		return errors.New("-o: no output file")
	}
	if len(platforms) == 0 {
		return errors.New("no -platform given")
	}
	blobs := map[string][]byte{}
	add := func(b []byte) descriptor {
		d := digest(b)
		blobs[d] = b
		return descriptor{Digest: d, Size: int64(len(b))}
	}
	var manifests []descriptor
	for _, p := range platforms {
		layerTar, err := layer(p.dir)
		if err != nil {
			return fmt.Errorf("linux/%s: %w", p.Architecture, err)
		}
		var gz bytes.Buffer
		zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
		if err != nil {
			return err
		}
		zw.ModTime = epoch
		if _, err := zw.Write(layerTar); err != nil {
			return err
		}
		if err := zw.Close(); err != nil {
			return err
		}
		config, err := json.Marshal(map[string]any{
			"created":      epoch.Format(time.RFC3339),
			"os":           p.OS,
			"architecture": p.Architecture,
			"config": map[string]any{
				"User":         "0:0",
				"Env":          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
				"Entrypoint":   []string{"/usr/local/bin/resize-agent"},
				"ExposedPorts": map[string]any{"9847/tcp": map[string]any{}},
				"WorkingDir":   "/",
			},
			"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{digest(layerTar)}},
			"history": []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "resize-agent deploy/image"}},
		})
		if err != nil {
			return err
		}
		cd, ld := add(config), add(gz.Bytes())
		cd.MediaType, ld.MediaType = mediaConfig, mediaLayerGz
		manifest, err := json.Marshal(map[string]any{
			"schemaVersion": 2, "mediaType": mediaManifest, "config": cd, "layers": []descriptor{ld},
		})
		if err != nil {
			return err
		}
		md := add(manifest)
		md.MediaType = mediaManifest
		md.Platform = &platform{OS: p.OS, Architecture: p.Architecture}
		manifests = append(manifests, md)
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaIndex, "manifests": manifests})
	if err != nil {
		return err
	}
	id := add(index)
	id.MediaType = mediaIndex
	// containerd's importer names the image after io.containerd.image.name;
	// org.opencontainers.image.ref.name is the tag, as docker save writes it
	// (containerd core/images/archive/importer.go).
	id.Annotations = map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:],
	}
	top, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaIndex, "manifests": []descriptor{id}})
	if err != nil {
		return err
	}
	return writeArchive(out, top, blobs)
}

// layer packs a platform's binaries with the files a distroless static
// image has that matter here.
func layer(dir string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirEntry := func(name string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: epoch, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []struct {
		name string
		mode int64
	}{{"etc/", 0o755}, {"tmp/", 0o1777}, {"usr/", 0o755}, {"usr/local/", 0o755}, {"usr/local/bin/", 0o755}} {
		if err := dirEntry(d.name, d.mode); err != nil {
			return nil, err
		}
	}
	if err := file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")); err != nil {
		return nil, err
	}
	if err := file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n")); err != nil {
		return nil, err
	}
	for _, b := range binaries {
		data, err := readELF(filepath.Join(dir, b))
		if err != nil {
			return nil, err
		}
		if err := file("usr/local/bin/"+b, 0o755, data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// readELF reads an executable, refusing anything that is not an ELF file.
func readELF(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(data, []byte("\x7fELF")) {
		return nil, fmt.Errorf("%s: not an ELF executable", path)
	}
	return data, nil
}

func writeArchive(out string, index []byte, blobs map[string][]byte) (err error) {
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	tw := tar.NewWriter(f)
	put := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", index); err != nil {
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(blobs))
	for d := range blobs {
		names = append(names, d)
	}
	slices.Sort(names)
	for _, d := range names {
		if err := put("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), blobs[d]); err != nil {
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

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}
