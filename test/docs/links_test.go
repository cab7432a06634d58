// Package docs holds the repository's Markdown together with tests: every
// relative link in a .md file names a file that exists, a link with an
// anchor into a Markdown file names a heading that file has, and every
// resizectl, kubectl resize, resize-agent and make command the docs show
// is one the commands accept (commands_test.go).
package docs

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// skipDirs are trees whose Markdown is not the project's documentation.
var skipDirs = map[string]bool{".git": true, "bin": true, "testdata": true, "node_modules": true}

func TestRelativeLinksResolve(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, must := range []string{"README.md", "docs/api.md", "docs/benchmarks.md"} {
		if !slices.Contains(files, must) {
			t.Errorf("%s not found under %s: the walk is broken or the page was removed", must, root)
		}
	}
	anchors := map[string]map[string]bool{}
	checked := 0
	for _, f := range files {
		ls, err := linksIn(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			target, anchor, ok := relative(l.dest)
			if !ok {
				continue
			}
			checked++
			rel := f // a bare "#anchor" points into the file itself
			if target != "" {
				rel = filepath.ToSlash(filepath.Join(filepath.Dir(f), target))
			}
			if strings.HasPrefix(rel, "../") {
				t.Errorf("%s:%d: link %q leaves the repository", f, l.line, l.dest)
				continue
			}
			st, err := os.Stat(filepath.Join(root, rel))
			if err != nil {
				t.Errorf("%s:%d: link %q: %v", f, l.line, l.dest, err)
				continue
			}
			if anchor == "" || st.IsDir() || !strings.HasSuffix(rel, ".md") {
				continue
			}
			if anchors[rel] == nil {
				if anchors[rel], err = headingAnchors(filepath.Join(root, rel)); err != nil {
					t.Fatal(err)
				}
			}
			if !anchors[rel][anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", f, l.line, l.dest, rel, anchor)
			}
		}
	}
	if checked == 0 {
		t.Error("no relative link found in any Markdown file: the link pattern is broken")
	}
	t.Logf("%d relative links in %d Markdown files", checked, len(files))
}

// TestParsing keeps the parser honest on the cases the real files rely on.
func TestParsing(t *testing.T) {
	src := "See [a](docs/a.md#x-y) and [b](b.md), not `[c](c.md)`, [d](https://x.io/d.md).\n" +
		"```sh\n[e](e.md)\n```\n" +
		"## Pressure: eBPF, with PSI as the fallback\n" +
		"### A real node (`make test-node`)\n" +
		"## Applying, safely\n## Applying, safely\n"
	p := filepath.Join(t.TempDir(), "x.md")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	ls, err := linksIn(p)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range ls {
		if target, anchor, ok := relative(l.dest); ok {
			got = append(got, target+"|"+anchor)
		}
	}
	if want := []string{"docs/a.md|x-y", "b.md|"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("relative links: got %q, want %q", got, want)
	}
	a, err := headingAnchors(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pressure-ebpf-with-psi-as-the-fallback", "a-real-node-make-test-node", "applying-safely", "applying-safely-1"} {
		if !a[want] {
			t.Errorf("anchor %q missing from %v", want, a)
		}
	}
}

func repoRoot() (string, error) {
	root, err := filepath.Abs("../..")
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("repository root not at %s: %w", root, err)
	}
	return root, nil
}

// markdownFiles lists the .md files below root, relative to it, with slashes.
func markdownFiles(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (skipDirs[d.Name()] || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	return out, err
}

type link struct {
	dest string
	line int
}

var (
	// An inline link's destination: ](dest) or ](dest "title").
	linkRE = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeRE = regexp.MustCompile("`[^`]*`")
)

// linksIn returns the inline links of a Markdown file outside code.
func linksIn(path string) ([]link, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []link
	fence := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		for _, m := range linkRE.FindAllStringSubmatch(codeRE.ReplaceAllString(line, ""), -1) {
			out = append(out, link{dest: m[1], line: n})
		}
	}
	return out, sc.Err()
}

// relative splits a link destination into a path and an anchor; ok is false
// for links that leave the repository's files (a scheme or an absolute path).
func relative(dest string) (target, anchor string, ok bool) {
	if strings.Contains(dest, "://") || strings.HasPrefix(dest, "mailto:") || strings.HasPrefix(dest, "/") {
		return "", "", false
	}
	target, anchor, _ = strings.Cut(dest, "#")
	return target, anchor, true
}

var (
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	// What GitHub drops from a heading's text when it makes the anchor.
	slugDropRE = regexp.MustCompile(`[^\p{L}\p{N}\s_-]`)
)

// headingAnchors returns the anchors GitHub gives a file's headings: lower
// case, punctuation dropped, spaces to hyphens, "-1", "-2" for repeats.
func headingAnchors(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		m := headingRE.FindStringSubmatch(line)
		if fence || m == nil {
			continue
		}
		slug := strings.ReplaceAll(slugDropRE.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if k := seen[slug]; k > 0 {
			out[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out, sc.Err()
}
