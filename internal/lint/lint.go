// Package lint checks the rules of the tree that docs/design.md states in
// its section "Rules the tree keeps": file sizes, import directions, the
// library module's dependencies and references to documents outside the
// repository. The rules are read from that section and from nothing else;
// its tests (run by make test) apply them to the repository.
package lint

import (
	"bufio"
	"bytes"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// RulesDoc is the document that states the rules, and RulesHeading the
// heading of its section.
const (
	RulesDoc     = "docs/design.md"
	RulesHeading = "## Rules the tree keeps"
)

// Rules are the rules as docs/design.md states them.
type Rules struct {
	Sizes   []SizeRule
	Imports []ImportRule
	// Modules are the modules the library module's graph never names.
	Modules []string
	Refs    []RefRule
	// SectionLines are the lines of RulesDoc (1-based, inclusive) that
	// state the rules: the reference check skips them.
	SectionLines [2]int
}

// SizeRule: files matching one of Globs have at most Max lines.
type SizeRule struct {
	Globs []string
	Max   int
}

// ImportRule: the Go files of the packages matching Packages but not
// Except never import a package matching Never. Patterns are paths from
// the repository root: "." is the root package, "x/..." is x and every
// package below it, "..." every package.
type ImportRule struct {
	Packages, Except, Never []string
}

// RefRule: no line matches Pattern; Example is a line it catches.
type RefRule struct {
	Pattern *regexp.Regexp
	What    string
	Example string
}

var (
	codeSpan  = regexp.MustCompile("`([^`]*)`")
	atMost    = regexp.MustCompile(`^(\d+) lines$`)
	generated = regexp.MustCompile(`^// Code generated .* DO NOT EDIT\.$`)
)

// ParseRules reads the rules from the section of doc (RulesDoc's text).
// Every table of the section must be one of the four the section is made
// of, with at least one row.
func ParseRules(doc string) (*Rules, error) {
	lines := strings.Split(doc, "\n")
	start := -1
	for i, l := range lines {
		if l == RulesHeading {
			start = i
			break
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("%s: no section %q", RulesDoc, RulesHeading)
	}
	end := len(lines)
	for i := start + 1; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "## ") {
			end = i
			break
		}
	}
	r := &Rules{SectionLines: [2]int{start + 1, end}}
	for i := start + 1; i < end; i++ {
		if !strings.HasPrefix(lines[i], "|") {
			continue
		}
		header := cells(lines[i])
		i += 2 // the header and its separator
		var rows [][]string
		for ; i < end && strings.HasPrefix(lines[i], "|"); i++ {
			rows = append(rows, cells(lines[i]))
		}
		if len(rows) == 0 {
			return nil, fmt.Errorf("%s: table %q has no row", RulesDoc, header)
		}
		if err := r.table(strings.Join(header, " | "), rows); err != nil {
			return nil, fmt.Errorf("%s: %w", RulesDoc, err)
		}
	}
	if len(r.Sizes) == 0 || len(r.Imports) == 0 || len(r.Modules) == 0 || len(r.Refs) == 0 {
		return nil, fmt.Errorf("%s: the section states %d size, %d import, %d module and %d reference rules: want each",
			RulesDoc, len(r.Sizes), len(r.Imports), len(r.Modules), len(r.Refs))
	}
	return r, nil
}

// table adds the rows of the table with the header given.
func (r *Rules) table(header string, rows [][]string) error {
	for _, c := range rows {
		switch header {
		case "files | at most":
			m := atMost.FindStringSubmatch(c[1])
			if len(c) != 2 || m == nil {
				return fmt.Errorf("size rule %q: want | `glob`, ... | N lines |", c)
			}
			n, _ := strconv.Atoi(m[1])
			r.Sizes = append(r.Sizes, SizeRule{Globs: spans(c[0]), Max: n})
		case "packages | except | never import":
			if len(c) != 3 || len(spans(c[0])) == 0 || len(spans(c[2])) == 0 {
				return fmt.Errorf("import rule %q: want | packages | except | never import |", c)
			}
			r.Imports = append(r.Imports, ImportRule{Packages: spans(c[0]), Except: spans(c[1]), Never: spans(c[2])})
		case "module the library never requires":
			if len(c) != 1 || len(spans(c[0])) != 1 {
				return fmt.Errorf("module rule %q: want | `module path` |", c)
			}
			r.Modules = append(r.Modules, spans(c[0])[0])
		case "pattern | what it cites | example":
			if len(c) != 3 || len(spans(c[0])) != 1 || len(spans(c[2])) != 1 {
				return fmt.Errorf("reference rule %q: want | `pattern` | what | `example` |", c)
			}
			re, err := regexp.Compile(spans(c[0])[0])
			if err != nil {
				return fmt.Errorf("reference rule %q: %w", c[0], err)
			}
			r.Refs = append(r.Refs, RefRule{Pattern: re, What: c[1], Example: spans(c[2])[0]})
		default:
			return fmt.Errorf("a table %q that states no rule this package knows", header)
		}
	}
	return nil
}

func cells(line string) []string {
	c := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
	for i := range c {
		c[i] = strings.TrimSpace(c[i])
	}
	return c
}

func spans(cell string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// A Finding is one broken rule: where, and which rule how.
type Finding struct {
	File string
	Line int // 0: the whole file
	What string
}

func (f Finding) String() string {
	if f.Line == 0 {
		return f.File + ": " + f.What
	}
	return fmt.Sprintf("%s:%d: %s", f.File, f.Line, f.What)
}

// Files lists the files of the tree at root the rules apply to: those git
// tracks or would track (untracked ones it does not ignore), but go.sum
// files, testdata/ folders and files deleted from the working tree.
func Files(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", root, err)
	}
	var files []string
	seen := map[string]bool{}
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if f == "" || seen[f] || path.Base(f) == "go.sum" || strings.HasPrefix(f, "testdata/") || strings.Contains(f, "/testdata/") {
			continue
		}
		seen[f] = true
		if _, err := os.Lstat(filepath.Join(root, f)); err == nil {
			files = append(files, f)
		}
	}
	return files, nil
}

// text is a file's content, or nil for a binary file (a NUL byte in its
// first 8 KiB).
func text(root, f string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(root, f))
	if err != nil {
		return nil, err
	}
	if bytes.IndexByte(b[:min(len(b), 8192)], 0) >= 0 {
		return nil, nil
	}
	return b, nil
}

// matchGlob matches a file against a size rule's glob: a glob without a
// slash against the file's name, one with a slash against its path.
func matchGlob(glob, f string) bool {
	name := f
	if !strings.Contains(glob, "/") {
		name = path.Base(f)
	}
	ok, _ := path.Match(glob, name)
	return ok
}

// CheckSizes finds the files over their size rule's limit.
func (r *Rules) CheckSizes(root string, files []string) ([]Finding, error) {
	var out []Finding
	for _, f := range files {
		var rule *SizeRule
		for i := range r.Sizes {
			for _, g := range r.Sizes[i].Globs {
				if rule == nil && matchGlob(g, f) {
					rule = &r.Sizes[i]
				}
			}
		}
		if rule == nil {
			continue
		}
		b, err := text(root, f)
		if err != nil {
			return nil, err
		}
		if b == nil {
			continue
		}
		first, _, _ := bytes.Cut(b, []byte("\n"))
		if generated.Match(bytes.TrimRight(first, "\r")) {
			continue
		}
		if n := bytes.Count(b, []byte("\n")); n > rule.Max {
			out = append(out, Finding{File: f, What: fmt.Sprintf("%d lines, more than %d (split it; %s)", n, rule.Max, RulesDoc)})
		}
	}
	return out, nil
}

// matchPkg matches a package path from the root ("." for the root)
// against an import rule's pattern.
func matchPkg(pattern, pkg string) bool {
	switch {
	case pattern == "...":
		return true
	case strings.HasSuffix(pattern, "/..."):
		p := strings.TrimSuffix(pattern, "/...")
		return pkg == p || strings.HasPrefix(pkg, p+"/")
	default:
		return pkg == pattern
	}
}

func matchAny(patterns []string, pkg string) bool {
	for _, p := range patterns {
		if matchPkg(p, pkg) {
			return true
		}
	}
	return false
}

// CheckImports finds the imports against an import rule in the Go files
// (every build tag's) of the module whose path is module, rooted at root.
func (r *Rules) CheckImports(root, module string, files []string) ([]Finding, error) {
	var out []Finding
	fset := token.NewFileSet()
	for _, f := range files {
		if !strings.HasSuffix(f, ".go") {
			continue
		}
		src, err := text(root, f)
		if err != nil {
			return nil, err
		}
		ast, err := parser.ParseFile(fset, f, src, parser.ImportsOnly)
		if err != nil {
			return nil, err
		}
		pkg := path.Dir(f)
		for _, im := range ast.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			var dep string
			switch {
			case p == module:
				dep = "."
			case strings.HasPrefix(p, module+"/"):
				dep = strings.TrimPrefix(p, module+"/")
			default:
				continue // another module's
			}
			for _, rule := range r.Imports {
				if matchAny(rule.Packages, pkg) && !matchAny(rule.Except, pkg) && matchAny(rule.Never, dep) {
					out = append(out, Finding{File: f, Line: fset.Position(im.Pos()).Line,
						What: fmt.Sprintf("package %s imports %s: %s never import %s (%s)", pkg, p,
							strings.Join(rule.Packages, ", "), strings.Join(rule.Never, ", "), RulesDoc)})
				}
			}
		}
	}
	return out, nil
}

// CheckRefs finds the lines that cite a document outside the repository,
// but the lines of RulesDoc that state the rules.
func (r *Rules) CheckRefs(root string, files []string) ([]Finding, error) {
	var out []Finding
	for _, f := range files {
		b, err := text(root, f)
		if err != nil {
			return nil, err
		}
		if b == nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, len(b)+1)
		for n := 1; sc.Scan(); n++ {
			if f == RulesDoc && n >= r.SectionLines[0] && n <= r.SectionLines[1] {
				continue
			}
			for _, ref := range r.Refs {
				if ref.Pattern.MatchString(sc.Text()) {
					out = append(out, Finding{File: f, Line: n,
						What: fmt.Sprintf("cites %s (%s): say what it says instead (%s)", ref.What, ref.Pattern, RulesDoc)})
				}
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return out, nil
}

// CheckModuleGraph finds the modules the library must not require in
// graph, the output of go mod graph: each with a requirement naming it.
func (r *Rules) CheckModuleGraph(graph string) []Finding {
	var out []Finding
	found := map[string]bool{}
	for _, line := range strings.Split(graph, "\n") {
		from, to, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		mod, _, _ := strings.Cut(to, "@")
		for _, m := range r.Modules {
			if mod == m && !found[m] {
				found[m] = true
				out = append(out, Finding{File: "go.mod", What: fmt.Sprintf("the library module's graph names %s (%s requires %s): it must not (%s)",
					m, from, to, RulesDoc)})
			}
		}
	}
	return out
}
