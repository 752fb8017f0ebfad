// Package readmetest finds a plugin's directive in the Corefile examples of its README, so that each
// plugin's tests can parse every example and a README cannot drift from the syntax it documents.
package readmetest

import (
	"os"
	"strings"
	"testing"
)

// Examples returns every use of directive in the `~~~ corefile` blocks of the README at path: a one-line
// use, or the lines from the directive's opening brace to its closing one. It fails the test when the file
// cannot be read, a block is left open, or there are fewer than atLeast uses.
func Examples(t testing.TB, path, directive string, atLeast int) []string {
	t.Helper()
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the README: %v", err)
	}
	var examples, open []string
	inCorefile := false
	for line := range strings.SplitSeq(string(readme), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "~~~ corefile":
			inCorefile = true
		case trimmed == "~~~":
			if open != nil {
				t.Fatalf("%s: a %s example is not closed: %s", path, directive, strings.Join(open, "\n"))
			}
			inCorefile = false
		case !inCorefile:
		case open == nil && isUse(trimmed, directive):
			if strings.HasSuffix(trimmed, "{") {
				open = []string{trimmed}
			} else {
				examples = append(examples, trimmed)
			}
		case open != nil:
			open = append(open, trimmed)
			if trimmed == "}" {
				examples = append(examples, strings.Join(open, "\n"))
				open = nil
			}
		}
	}
	if len(examples) < atLeast {
		t.Fatalf("%s: found %d %s examples, want at least %d", path, len(examples), directive, atLeast)
	}
	return examples
}

// isUse reports whether line starts with directive as a whole word.
func isUse(line, directive string) bool {
	rest, ok := strings.CutPrefix(line, directive)
	return ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t' || rest[0] == '{')
}
