package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

func print(w io.Writer, format string, r result) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(w, escapeC1(string(b)))
		return err
	case "yaml":
		b, err := yaml.Marshal(r)
		if err != nil {
			return err
		}
		_, err = io.WriteString(w, escapeC1(string(b)))
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s/%s container %s", safe(r.Namespace), safe(r.Pod), safe(r.Container))
	if r.Node != "" {
		fmt.Fprintf(&b, " on node %s", safe(r.Node))
	}
	fmt.Fprintf(&b, ": %s", r.Verdict)
	if r.Generation != 0 {
		fmt.Fprintf(&b, " (generation %d", r.Generation)
		if r.ElapsedSeconds > 0 {
			fmt.Fprintf(&b, ", %.1f s after the patch", r.ElapsedSeconds)
		}
		b.WriteString(")")
	}
	b.WriteString("\n")
	if r.Reason != "" || r.Message != "" {
		who := "kubelet"
		if r.Verdict == Refused {
			who = "API server"
		} else if r.Verdict == Timeout {
			who = "waiting"
		}
		fmt.Fprintf(&b, "  %s: %s", who, safe(r.Reason))
		if r.Message != "" {
			if r.Reason != "" {
				b.WriteString(": ")
			}
			b.WriteString(safe(r.Message))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  spec:   %s\n", resources(r.Spec))
	if r.Status != nil {
		fmt.Fprintf(&b, "  status: %s (restarts %d)\n", resources(*r.Status), r.RestartCount)
	}
	if a := r.Agent; a != nil {
		if !a.Seen {
			fmt.Fprintf(&b, "  agent:  %s\n", safe(a.Note))
		}
		for _, e := range a.Events {
			fmt.Fprintf(&b, "  agent:  %s %s", safe(e.Reason), e.Time.UTC().Format("15:04:05"))
			if e.Node != "" {
				fmt.Fprintf(&b, " on %s", safe(e.Node))
			}
			fmt.Fprintf(&b, ": %s\n", safe(e.Message))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// resources renders requests and limits as "requests cpu=200m
// memory=32Mi, limits cpu=800m memory=96Mi".
func resources(r corev1.ResourceRequirements) string {
	list := func(l corev1.ResourceList) string {
		if len(l) == 0 {
			return "none"
		}
		var parts []string
		for k, v := range l {
			parts = append(parts, safe(string(k))+"="+v.String())
		}
		sort.Strings(parts)
		return strings.Join(parts, " ")
	}
	return "requests " + list(r.Requests) + ", limits " + list(r.Limits)
}

// safe makes a string from the server fit for a terminal: unprintable
// runes (control characters, escape sequences, invalid UTF-8) are written
// as Go escapes, so that a pod's name or a message can neither move the
// cursor nor forge lines (as resizectl does with the agent's strings).
func safe(s string) string {
	if !strings.ContainsFunc(s, unprintable) && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unprintable(r):
			q := fmt.Sprintf("%+q", string(r))
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func unprintable(r rune) bool { return !unicode.IsPrint(r) }

// escapeC1 escapes the runes encoding/json leaves raw that a terminal may
// act on: DEL and C1 (U+009B starts a control sequence on some
// terminals). In JSON they can only be inside strings, where \u is an
// escape; sigs.k8s.io/yaml writes them escaped in double quotes already.
func escapeC1(s string) string { return c1.Replace(s) }

var c1 = func() *strings.Replacer {
	var p []string
	for r := rune(0x7f); r <= 0x9f; r++ {
		p = append(p, string(r), fmt.Sprintf(`\u%04x`, r))
	}
	return strings.NewReplacer(p...)
}()
