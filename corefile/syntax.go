package corefile

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/coredns/caddy/caddyfile"
)

// File is a Corefile as a tree of server blocks and directives, with the line each one started on.
//
// It keeps what CoreDNS sees (tokens, lines and nesting) and drops what it does not (comments, layout), so a
// File can be edited and written back in one canonical layout.
type File struct {
	Blocks []*Block
}

// Block is one server block: the zones and ports it serves, and its directives.
type Block struct {
	Keys       []string
	Line       int
	Directives []*Directive
}

// Directive is one line of a block, with the lines of its { } sub-block if it has one.
type Directive struct {
	Name string
	Args []string
	Line int
	// Block holds the lines inside the directive's braces; each is a Directive too, so that sub-options
	// like `success 9984 30` keep their line numbers and nested braces stay nested.
	Block []*Directive
}

// Parse reads a Corefile into a File. It tokenizes the way CoreDNS does (quotes, comments, escapes) but
// leaves `import` and snippets alone: they stay ordinary directives and blocks.
func Parse(data []byte) (*File, error) {
	p := &syntaxParser{}
	d := caddyfile.NewDispenser("Corefile", bytes.NewReader(data))
	for d.Next() {
		p.tokens = append(p.tokens, caddyfile.Token{Line: d.Line(), Text: d.Val()})
	}
	return p.file()
}

type syntaxParser struct {
	tokens []caddyfile.Token
	pos    int
}

func (p *syntaxParser) peek() (caddyfile.Token, bool) {
	if p.pos >= len(p.tokens) {
		return caddyfile.Token{}, false
	}
	return p.tokens[p.pos], true
}

func (p *syntaxParser) next() caddyfile.Token {
	t := p.tokens[p.pos]
	p.pos++
	return t
}

func (p *syntaxParser) file() (*File, error) {
	f := &File{}
	for {
		first, ok := p.peek()
		if !ok {
			return f, nil
		}
		if first.Text == "{" || first.Text == "}" {
			return nil, fmt.Errorf("line %d: unexpected %q where a server block's zones should be", first.Line, first.Text)
		}
		b := &Block{Line: first.Line}
		// Keys run up to the opening brace; a key ending in a comma continues on the next line.
		for {
			t, ok := p.peek()
			if !ok || t.Text == "{" {
				break
			}
			if len(b.Keys) > 0 && t.Line != p.tokens[p.pos-1].Line && !strings.HasSuffix(p.tokens[p.pos-1].Text, ",") {
				break
			}
			p.next()
			if key := strings.TrimSuffix(t.Text, ","); key != "" {
				b.Keys = append(b.Keys, key)
			}
		}
		t, ok := p.peek()
		if !ok || t.Text != "{" {
			// CoreDNS accepts one block without braces when it is the whole file.
			if len(f.Blocks) > 0 {
				return nil, fmt.Errorf("line %d: server block %s has no opening brace", b.Line, strings.Join(b.Keys, " "))
			}
			dirs, err := p.directives(false)
			if err != nil {
				return nil, err
			}
			b.Directives = dirs
			f.Blocks = append(f.Blocks, b)
			if _, more := p.peek(); more {
				return nil, fmt.Errorf("line %d: unexpected text after a server block without braces", p.tokens[p.pos].Line)
			}
			return f, nil
		}
		p.next()
		dirs, err := p.directives(true)
		if err != nil {
			return nil, err
		}
		b.Directives = dirs
		f.Blocks = append(f.Blocks, b)
	}
}

// directives reads lines up to the closing brace (nested) or the end of input (top level without braces).
func (p *syntaxParser) directives(nested bool) ([]*Directive, error) {
	var dirs []*Directive
	for {
		t, ok := p.peek()
		if !ok {
			if nested {
				return nil, fmt.Errorf("line %d: missing closing brace", p.tokens[len(p.tokens)-1].Line)
			}
			return dirs, nil
		}
		p.next()
		switch t.Text {
		case "}":
			if !nested {
				return nil, fmt.Errorf("line %d: unexpected '}' without an opening brace", t.Line)
			}
			return dirs, nil
		case "{":
			return nil, fmt.Errorf("line %d: unexpected '{' at the start of a line", t.Line)
		}
		d := &Directive{Name: t.Text, Line: t.Line}
		last := t.Line
		for {
			a, ok := p.peek()
			if !ok || a.Line != last || a.Text == "}" {
				break
			}
			p.next()
			if a.Text == "{" {
				sub, err := p.directives(true)
				if err != nil {
					return nil, err
				}
				d.Block = sub
				break
			}
			d.Args = append(d.Args, a.Text)
		}
		dirs = append(dirs, d)
	}
}

// Format writes f in the canonical layout: four-space indentation, one blank line between blocks.
func (f *File) Format() []byte {
	var buf bytes.Buffer
	for i, b := range f.Blocks {
		if i > 0 {
			buf.WriteByte('\n')
		}
		buf.WriteString(strings.Join(quoteAll(b.Keys), " "))
		buf.WriteString(" {\n")
		formatDirectives(&buf, b.Directives, 1)
		buf.WriteString("}\n")
	}
	return buf.Bytes()
}

func formatDirectives(buf *bytes.Buffer, dirs []*Directive, depth int) {
	indent := strings.Repeat("    ", depth)
	for _, d := range dirs {
		buf.WriteString(indent)
		buf.WriteString(quote(d.Name))
		for _, a := range d.Args {
			buf.WriteByte(' ')
			buf.WriteString(quote(a))
		}
		if len(d.Block) > 0 {
			buf.WriteString(" {\n")
			formatDirectives(buf, d.Block, depth+1)
			buf.WriteString(indent)
			buf.WriteString("}")
		}
		buf.WriteByte('\n')
	}
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = quote(s)
	}
	return out
}

// quote puts a token in double quotes when the lexer would otherwise split or drop it.
func quote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\r\n\"#\\{}") {
		return s
	}
	if s == "{" || s == "}" {
		// A bare brace token only comes from a quoted brace; keep it quoted so it stays an argument.
		return `"` + s + `"`
	}
	if strings.HasPrefix(s, "{$") || strings.HasPrefix(s, "{%") {
		return s // an environment placeholder such as {$HOST_IP}
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// Find returns the block's directives with the given name, in order.
func (b *Block) Find(name string) []*Directive {
	var out []*Directive
	for _, d := range b.Directives {
		if d.Name == name {
			out = append(out, d)
		}
	}
	return out
}

// Has reports whether the block has a directive with the given name.
func (b *Block) Has(name string) bool { return len(b.Find(name)) > 0 }

// Option returns the first line of d's sub-block with the given name, or nil.
func (d *Directive) Option(name string) *Directive {
	for _, o := range d.Block {
		if o.Name == name {
			return o
		}
	}
	return nil
}

// insertAfter puts nd right after the last directive named after, or at the end when there is none.
func (b *Block) insertAfter(after string, nd *Directive) {
	at := len(b.Directives)
	for i, d := range b.Directives {
		if d.Name == after {
			at = i + 1
		}
	}
	b.Directives = append(b.Directives[:at], append([]*Directive{nd}, b.Directives[at:]...)...)
}
