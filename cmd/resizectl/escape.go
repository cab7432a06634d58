package main

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// safe makes a string from the server fit to print on a terminal: control
// characters (C0 with tab and newline, DEL, C1), escape sequences and other
// unprintable runes are written as Go escapes, so that a name or message
// can neither recolour or move the cursor nor forge table rows. The agent
// refuses such names; this holds with an older or a hostile server.
func safe(s string) string {
	clean := true
	for _, r := range s {
		if !unicode.IsPrint(r) || r == utf8.RuneError {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r):
			b.WriteString(s[i : i+n])
		case r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

// jsonSafe escapes, in JSON output, the runes encoding/json leaves raw that
// a terminal may act on: DEL and C1 (U+0080-U+009F, of which U+009B starts a
// control sequence on some terminals). They can only be inside strings, where
// \u escapes are valid JSON.
type jsonSafe struct{ w io.Writer }

func (j jsonSafe) Write(p []byte) (int, error) {
	s := string(p)
	if !strings.ContainsFunc(s, isC1) {
		return j.w.Write(p)
	}
	var b strings.Builder
	for _, r := range s {
		if isC1(r) {
			fmt.Fprintf(&b, `\u%04x`, r)
		} else {
			b.WriteRune(r)
		}
	}
	if _, err := io.WriteString(j.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}

func isC1(r rune) bool { return r >= 0x7f && r <= 0x9f }
