package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/tier"
)

// TestEveryErrorHasACode parses the root package's and the tier package's
// sources for their exported Err* sentinels and checks that each one has
// its entry in codes, and that every code is declared in omnicache.h.
func TestEveryErrorHasACode(t *testing.T) {
	mapped := map[string]bool{}
	for _, c := range codes {
		mapped[c.err.Error()] = true
	}
	// every non-test file of the two packages, so that a sentinel moved
	// to another file is still found
	sentinels := map[string][]string{"omnicache": goFiles(t, "../.."), "tier": goFiles(t, "../../tier")}
	n := 0
	for pkg, files := range sentinels {
		for _, f := range files {
			for _, name := range exportedErrs(t, f) {
				n++
				if notReturned[pkg+"."+name] {
					continue
				}
				v, ok := sentinelValues[pkg+"."+name]
				if !ok {
					t.Errorf("%s.%s (%s) is not in sentinelValues: give it an ABI code in codes and here", pkg, name, f)
					continue
				}
				if !mapped[v.Error()] {
					t.Errorf("%s.%s has no ABI code", pkg, name)
				}
			}
		}
	}
	if n < 18 {
		t.Fatalf("found %d sentinels; the parser missed some", n)
	}
	h, err := os.ReadFile("omnicache.h")
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, m := range regexp.MustCompile(`OMNICACHE_(?:OK|ERR_\w+) = (\d+)`).FindAllStringSubmatch(string(h), -1) {
		declared[m[1]] = true
	}
	for _, c := range codes {
		if !declared[strconv.Itoa(int(c.code))] {
			t.Errorf("code %d (%v) is not declared in omnicache.h", c.code, c.err)
		}
	}
}

// sentinelValues names every exported sentinel of the two packages.
var sentinelValues = map[string]error{
	"omnicache.ErrReset":          omnicache.ErrReset,
	"tier.ErrCircuitOpen":         tier.ErrCircuitOpen,
	"omnicache.ErrConfig":         omnicache.ErrConfig,
	"omnicache.ErrClosed":         omnicache.ErrClosed,
	"omnicache.ErrSequence":       omnicache.ErrSequence,
	"omnicache.ErrPlan":           omnicache.ErrPlan,
	"omnicache.ErrUnalignedHit":   omnicache.ErrUnalignedHit,
	"omnicache.ErrHitBlocks":      omnicache.ErrHitBlocks,
	"omnicache.ErrTokenCount":     omnicache.ErrTokenCount,
	"omnicache.ErrOutputs":        omnicache.ErrOutputs,
	"omnicache.ErrStepTooLarge":   omnicache.ErrStepTooLarge,
	"omnicache.ErrStagingTimeout": omnicache.ErrStagingTimeout,
	"omnicache.ErrUnknownStep":    omnicache.ErrUnknownStep,
	"omnicache.ErrNotInStep":      omnicache.ErrNotInStep,
	"omnicache.ErrAbsentRequired": omnicache.ErrAbsentRequired,
	"omnicache.ErrReassigned":     omnicache.ErrReassigned,
	"omnicache.ErrBudget":         omnicache.ErrBudget,
	"omnicache.ErrWriteFailed":    omnicache.ErrWriteFailed,
	"omnicache.ErrDeviceTimeout":  omnicache.ErrDeviceTimeout,
	"omnicache.ErrTierMiss":       omnicache.ErrTierMiss,
	"omnicache.ErrNotPublished":   omnicache.ErrNotPublished,
	"tier.ErrMiss":                tier.ErrMiss,
	"tier.ErrCorrupt":             tier.ErrCorrupt,
	"tier.ErrUnavailable":         tier.ErrUnavailable,
	"tier.ErrAuth":                tier.ErrAuth,
	"tier.ErrConfig":              tier.ErrConfig,
	"tier.ErrClosed":              tier.ErrClosed,
}

// notReturned are tier sentinels no ABI call returns: the embedded store's
// refusals of a value, met only by the cache's background publishers
// (counted in Stats.TierPublishErrors).
// tier.ErrUnsupported is met only through Tier.Pin and Unpin, which the
// ABI does not offer.
var notReturned = map[string]bool{"tier.ErrTooLarge": true, "tier.ErrNoRoom": true, "tier.ErrUnsupported": true}

// goFiles lists dir's non-test Go files.
func goFiles(t *testing.T, dir string) []string {
	fs, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(fs) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	out := fs[:0]
	for _, f := range fs {
		if !strings.HasSuffix(f, "_test.go") {
			out = append(out, f)
		}
	}
	return out
}

// exportedErrs lists the exported package-level variables named Err* that
// a file declares.
func exportedErrs(t *testing.T, path string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, s := range g.Specs {
			for _, id := range s.(*ast.ValueSpec).Names {
				if strings.HasPrefix(id.Name, "Err") && id.IsExported() {
					names = append(names, id.Name)
				}
			}
		}
	}
	return names
}
