package cgroup_test

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resizer/resize-agent/cgroup"
)

// escapeTree is a cgroup root with symlinks that lead out of it (absolute,
// relative, to the filesystem root) next to real cgroups, and the directory
// they lead to, which holds directories a path through a link would reach.
func escapeTree(t testing.TB) (root, outside string) {
	base := t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{"root/a/b", "root/kubepods/pod1/c1", "outside/sub/deeper"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, to := range map[string]string{
		"root/link":     outside,
		"root/a/up":     "../..",
		"root/a/b/rel":  "../../../outside/sub",
		"root/slash":    "/",
		"root/a/inside": "../kubepods",
	} {
		if err := os.Symlink(to, filepath.Join(base, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "a", "cpu.max"), []byte("max 100000"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, outside
}

// FuzzCleanPath: whatever the input, a path CleanPath accepts is canonical
// and joins to a directory below the root, and the Manager never reaches a
// directory outside the root through it, however the symlinks in the tree
// lead; everything else is refused with ErrInvalidPath.
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{
		"kubepods/pod1/c1", "/kubepods/pod1/c1", "/a", "", "/", "..", "/../etc", "a/../../etc", "a/./b", "a//b",
		"a/b/", "/sys/fs/cgroup/a", "a\x00b", "/link", "/link/sub", "/link/sub/deeper", "/a/up", "/a/up/outside/sub",
		"/a/b/rel/deeper", "/slash/tmp", "/slash", "/a/inside/pod1", "/a/cpu.max", "/a/cpu.max/x", "//a", "/.", "/...",
		"/a/..b", "\\..\\x", "/a\n/b", strings.Repeat("a/", 2100), "/" + strings.Repeat("x", 300),
	} {
		f.Add(s)
	}
	root, outside := escapeTree(f)
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		f.Fatal(err)
	}
	m := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	f.Fuzz(func(t *testing.T, in string) {
		p, err := cgroup.CleanPath(in)
		if err != nil {
			if !errors.Is(err, cgroup.ErrInvalidPath) {
				t.Fatalf("CleanPath(%q) = %v, not ErrInvalidPath", in, err)
			}
			if p != "" {
				t.Fatalf("CleanPath(%q) = %q with error %v", in, p, err)
			}
		} else {
			if p == "/" || path.Clean(p) != p || !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
				t.Fatalf("CleanPath(%q) = %q, not canonical", in, p)
			}
			if again, err := cgroup.CleanPath(p); err != nil || again != p {
				t.Fatalf("CleanPath(%q) = %q, but again = %q, %v", in, p, again, err)
			}
			if j := filepath.Join(root, p); !strings.HasPrefix(j, root+"/") {
				t.Fatalf("CleanPath(%q) = %q joins to %s, outside %s", in, p, j, root)
			}
		}
		ok, err := m.Exists(in)
		switch {
		case err != nil:
			if !errors.Is(err, cgroup.ErrInvalidPath) && !errors.Is(err, cgroup.ErrNotFound) {
				t.Fatalf("Exists(%q) = %v, want ErrInvalidPath or ErrNotFound", in, err)
			}
		case ok:
			got, err := filepath.EvalSymlinks(filepath.Join(root, p))
			if err != nil {
				t.Fatalf("Exists(%q), but resolving it: %v", in, err)
			}
			if !strings.HasPrefix(got, realRoot+"/") || strings.HasPrefix(got, outside) {
				t.Fatalf("Exists(%q): it resolves to %s, outside the root %s", in, got, realRoot)
			}
		}
	})
}

// FuzzParseProcCgroup: what PathOf makes of the text of /proc/<pid>/cgroup
// is a path CleanPath accepts as it is, or an error.
func FuzzParseProcCgroup(f *testing.F) {
	for _, s := range []string{
		"0::/kubepods/pod1/c1\n", "0::/\n", "0::/../../x\n", "12:memory:/a\n0::/b\n", "0::/a\n0::/b\n", "0::\n", "0::a/b",
		"1:name=systemd:/user.slice\n", "", "\n\n", "0::/a (deleted)\n", "0::/a\x00b\n", "0::/a//b\n", "0:/a\n", " 0::/a\n", "0::/" + strings.Repeat("a", 70000),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := cgroup.ParseProcCgroup(strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, cgroup.ErrInvalidPath) && !errors.Is(err, cgroup.ErrParse) {
				t.Fatalf("ParseProcCgroup(%q) = %v, want ErrInvalidPath or ErrParse", in, err)
			}
			return
		}
		if c, err := cgroup.CleanPath(p); err != nil || c != p {
			t.Fatalf("ParseProcCgroup(%q) = %q, not clean: %q, %v", in, p, c, err)
		}
		if !strings.Contains(in, "0::"+p) {
			t.Fatalf("ParseProcCgroup(%q) = %q, not in the input", in, p)
		}
	})
}
