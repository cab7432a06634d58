package intent

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strings"
)

// hugeNumber matches number-like text that resource.ParseQuantity would
// spend long on: it rounds every quantity to nano units with big decimals,
// which for 1e-9999999 takes minutes, for 1e-999 0.1 ms, and for tens of
// thousands of digits tens of milliseconds.
var hugeNumber = regexp.MustCompile(`^[+-]?[0-9.]*([eE][+-]?[0-9]{3,}|[0-9.]{65,}.*)$`)

// CheckQuantities refuses JSON holding a number, or a string that reads as
// one, with an exponent of three digits or more or over 64 digits: no
// resource quantity needs one, and decoding such a quantity into a Spec
// would pin a CPU. It looks at every value, not only at resources, so that
// duplicate or differently cased keys cannot slip one past it. Call it on a
// body before decoding it into a Spec; its error matches ErrInvalid.
// Malformed JSON passes: the decoder reports it.
func CheckQuantities(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) || err != nil {
			return nil
		}
		var s string
		switch v := tok.(type) {
		case string:
			s = strings.TrimSpace(v)
		case json.Number:
			s = string(v)
		default:
			continue
		}
		if hugeNumber.MatchString(s) {
			if len(s) > 40 {
				s = s[:40] + "..."
			}
			return invalid("%q: quantities have at most 64 digits and a 2-digit exponent", s)
		}
	}
}
