package docs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// command is a shell command line from a fenced block of a Markdown file.
type command struct {
	file string
	line int
	args []string // words, with $VARS and $(...) as placeholders
}

// TestCommandsExist runs every resizectl and kubectl resize command line
// the docs show (in sh/console blocks) through the real binaries, so far as
// they get without an agent or a cluster: a flag, a subcommand or a value
// the command refuses (its usage exit status, 2) fails here. resize-agent
// lines, which would start the daemon, have their flags looked up in its
// -help instead, and `make X` lines need a target X in the Makefile.
func TestCommandsExist(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []command
	for _, f := range files {
		cs, err := commandsIn(root, f)
		if err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cs...)
	}
	bin := buildCommands(t, root)
	agentHelp, _ := exec.Command(filepath.Join(bin, "resize-agent"), "-help").CombinedOutput()
	if !bytes.Contains(agentHelp, []byte("-metrics-address")) {
		t.Fatalf("resize-agent -help does not list its flags:\n%s", agentHelp)
	}
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, c := range cmds {
		where := fmt.Sprintf("%s:%d: %s", c.file, c.line, strings.Join(c.args, " "))
		t.Log(where)
		switch name := c.args[0]; {
		case name == "resizectl":
			count[name]++
			// No agent at this socket: a command that parses gets as far
			// as connecting (exit 1); one that does not exits 2.
			args := append([]string{"--socket", filepath.Join(t.TempDir(), "none.sock")}, withoutGlobal(c.args[1:], "--socket")...)
			if code, out := runBin(t, filepath.Join(bin, "resizectl"), args, nil); code == 2 {
				t.Errorf("%s: resizectl refuses it (usage):\n%s", where, out)
			}
		case name == "kubectl" && len(c.args) > 1 && c.args[1] == "resize", name == "kubectl-resize":
			count["kubectl resize"]++
			args := c.args[1:]
			if name == "kubectl" {
				args = c.args[2:]
			}
			// No cluster: a kubeconfig naming a server nobody listens on.
			kc := filepath.Join(t.TempDir(), "kubeconfig")
			if err := os.WriteFile(kc, []byte(deadKubeconfig), 0o600); err != nil {
				t.Fatal(err)
			}
			args = append(args, "--request-timeout=2s", "--timeout=1s", "--agent-wait=0")
			if code, out := runBin(t, filepath.Join(bin, "kubectl-resize"), args, []string{"KUBECONFIG=" + kc}); code == 2 {
				t.Errorf("%s: kubectl-resize refuses it (usage):\n%s", where, out)
			}
		case name == "resize-agent":
			count[name]++
			for _, a := range c.args[1:] {
				if !strings.HasPrefix(a, "-") {
					continue
				}
				f, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(f) + `\b`).Match(agentHelp) {
					t.Errorf("%s: resize-agent has no flag -%s", where, f)
				}
			}
		case name == "make":
			count[name]++
			for _, target := range c.args[1:] {
				if strings.Contains(target, "=") || strings.HasPrefix(target, "-") {
					continue
				}
				if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
					t.Errorf("%s: the Makefile has no target %s", where, target)
				}
			}
		}
	}
	for _, want := range []string{"resizectl", "kubectl resize", "make"} {
		if count[want] == 0 {
			t.Errorf("no %s command found in the docs: the extraction is broken", want)
		}
	}
	t.Logf("commands checked: %v", count)
}

// TestShellWords keeps the command extraction honest.
func TestShellWords(t *testing.T) {
	for in, want := range map[string]string{
		`sudo bin/resizectl resize web --cgroup /a/b`:                  "resizectl resize web --cgroup /a/b",
		`$ kubectl resize web --cpu-limit 1   # a comment`:             "kubectl resize web --cpu-limit 1",
		`kubectl -n x exec $AGENT -- resizectl kube-resizes --pod a/b`: "resizectl kube-resizes --pod a/b",
		`make build && cp bin/kubectl-resize /usr/local/bin/`:          "make build",
		`resizectl node -o json | awk '{print $2}'`:                    "resizectl node -o json",
		`ctl resize x --timeout "$(echo 1s)"`:                          "",
		`kubectl resize POD [-c CONTAINER]`:                            "",
		`X=$(resizectl --socket "$SOCK" node -o json)`:                 "",
		`kubectl patch pod web --patch '{"a": "b c"}'`:                 "",
	} {
		ws := commandWords(in)
		if got := strings.Join(ws, " "); got != want {
			t.Errorf("commandWords(%q) = %q, want %q", in, got, want)
		}
	}
}

const deadKubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: default}}]
current-context: c
`

// withoutGlobal drops a global flag and its value that the doc gave.
func withoutGlobal(args []string, flag string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == flag {
			i++
			continue
		}
		if strings.HasPrefix(args[i], flag+"=") {
			continue
		}
		out = append(out, args[i])
	}
	return out
}

func runBin(t *testing.T, bin string, args, env []string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("%s: %v", bin, err)
	return 0, ""
}

// buildCommands builds the three commands the docs name into a temporary
// directory.
func buildCommands(t *testing.T, root string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	dir := t.TempDir()
	// The flags of make build, so that its cache serves this build too.
	cmd := exec.Command(gobin, "build", "-trimpath", "-o", dir+string(filepath.Separator), "./cmd/resizectl", "./cmd/kubectl-resize", "./cmd/resize-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the commands: %v\n%s", err, out)
	}
	return dir
}

var fenceRE = regexp.MustCompile("^\\s*```\\s*([a-z]*)")

// commandsIn returns the command lines of a Markdown file's sh, bash,
// console and unlabelled fenced blocks (a continued line joined).
func commandsIn(root, rel string) ([]command, error) {
	f, err := os.Open(filepath.Join(root, rel))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []command
	in, shell := false, false
	heredoc := ""
	var cont string
	contLine := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			if !in {
				lang := m[1]
				shell = lang == "" || lang == "sh" || lang == "bash" || lang == "console" || lang == "shell"
			}
			in, heredoc, cont = !in, "", ""
			continue
		}
		if !in || !shell {
			continue
		}
		if heredoc != "" {
			if strings.TrimSpace(line) == heredoc {
				heredoc = ""
			}
			continue
		}
		if m := heredocRE.FindStringSubmatch(line); m != nil {
			heredoc = m[1]
		}
		if cont == "" {
			contLine = n
		}
		if strings.HasSuffix(line, `\`) {
			cont += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		full := cont + line
		cont = ""
		if ws := commandWords(full); len(ws) > 0 {
			out = append(out, command{file: rel, line: contLine, args: ws})
		}
	}
	return out, sc.Err()
}

var heredocRE = regexp.MustCompile(`<<-?\s*'?"?([A-Za-z_]+)`)

// commandWords splits a shell line into the words of the command it runs
// among resizectl, kubectl resize, kubectl-resize, resize-agent and make
// (after sudo, a path, a "$ " prompt, or kubectl exec ... --); nil for
// anything else, for a synopsis with [optional] parts, and for a line
// whose command sits inside a quote or $(...).
func commandWords(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "$ ")
	words, ok := split(line)
	if !ok {
		return nil
	}
	if i := indexOf(words, "--"); i >= 0 && len(words) > 1 && words[0] == "kubectl" && indexOf(words, "exec") >= 0 {
		words = words[i+1:]
	}
	for len(words) > 0 && words[0] == "sudo" {
		words = words[1:]
	}
	if len(words) == 0 {
		return nil
	}
	words[0] = filepath.Base(words[0])
	switch {
	case words[0] == "resizectl", words[0] == "kubectl-resize", words[0] == "resize-agent", words[0] == "make":
	case words[0] == "kubectl" && len(words) > 1 && words[1] == "resize":
	default:
		return nil
	}
	for _, w := range words {
		if strings.HasPrefix(w, "[") || w == "..." {
			return nil // a synopsis, not a command
		}
	}
	return words
}

// split is a small shell word splitter: quotes, comments, and the end of
// the first command (|, &&, ||, ;, &, a redirection). $VAR and $(...)
// become the placeholder "x"; ok is false where a command substitution
// holds the line's command.
func split(s string) (words []string, ok bool) {
	var w strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, w.String())
		}
		w.Reset()
		inWord = false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, false
			}
			w.WriteString(s[i+1 : i+1+j])
			inWord, i = true, i+1+j
		case c == '"':
			j := strings.IndexByte(s[i+1:], '"')
			if j < 0 {
				return nil, false
			}
			q := s[i+1 : i+1+j]
			if strings.Contains(q, "$(") && len(words) == 0 {
				return nil, false
			}
			if strings.Contains(q, "$") {
				q = "x"
			}
			w.WriteString(q)
			inWord, i = true, i+1+j
		case c == '$' && i+1 < len(s) && s[i+1] == '(':
			if len(words) == 0 && !inWord || strings.HasSuffix(w.String(), "=") {
				return nil, false // X=$(cmd ...): the command is inside
			}
			depth := 0
			for ; i < len(s); i++ {
				if s[i] == '(' {
					depth++
				} else if s[i] == ')' {
					if depth--; depth == 0 {
						break
					}
				}
			}
			w.WriteString("x")
			inWord = true
		case c == '$':
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] == '{' || s[j] == '}' || 'A' <= s[j] && s[j] <= 'Z' || 'a' <= s[j] && s[j] <= 'z' || '0' <= s[j] && s[j] <= '9') {
				j++
			}
			w.WriteString("x")
			inWord, i = true, j-1
		case c == '#' && !inWord:
			flush()
			return words, true
		case c == '|' || c == ';' || c == '&' || c == '>' || c == '<':
			flush()
			return words, true
		case c == ' ' || c == '\t':
			flush()
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words, true
}

func indexOf(ws []string, s string) int {
	for i, w := range ws {
		if w == s {
			return i
		}
	}
	return -1
}
