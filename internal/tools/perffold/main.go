// Command perffold folds `perf script -F comm,tid,ip,sym` output: for samples whose
// stack holds one of the root functions, it counts the path from the root
// down (at most -depth frames; -roots names them), and prints "count<TAB>path"
// lines.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

var (
	rootsFlag = flag.String("roots", "omnicache.(*Cache).Begin,omnicache.(*Cache).Save,omnicache.(*Cache).Discard", "comma-separated function name suffixes a path starts at (the match nearest the leaf)")
	depth     = flag.Int("depth", 6, "frames kept from the root down")
	leafIP    = flag.Bool("leafip", false, "count the leaf frame's address (hex, for go tool addr2line) instead of paths")
	roots     []string
)

func short(s string) string {
	if i := strings.LastIndex(s, " ("); i > 0 {
		s = s[:i]
	}
	if i := strings.LastIndex(s, "+0x"); i > 0 {
		s = s[:i]
	}
	s = strings.ReplaceAll(s, "github.com/omnicache/omnicache/", "")
	return s
}

func main() {
	flag.Parse()
	roots = strings.Split(*rootsFlag, ",")
	paths := map[string]int{}
	total := 0
	var fr, ips []string
	flush := func() {
		total++
		for i, n := range fr {
			for _, r := range roots {
				if strings.HasSuffix(n, r) && *leafIP {
					paths[ips[0]+"\t"+fr[0]]++
					return
				}
				if strings.HasSuffix(n, r) {
					var chain []string
					for j := i; j >= 0 && len(chain) < *depth; j-- {
						chain = append(chain, fr[j])
					}
					paths[strings.Join(chain, " > ")]++
					return
				}
			}
		}
	}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.TrimSpace(l) == "" {
			if len(fr) > 0 {
				flush()
			}
			fr, ips = fr[:0], ips[:0]
			continue
		}
		if l[0] == '\t' || l[0] == ' ' {
			f := strings.SplitN(strings.TrimSpace(l), " ", 2)
			if len(f) == 2 {
				fr = append(fr, short(f[1]))
				ips = append(ips, "0x"+f[0])
			}
		}
	}
	if len(fr) > 0 {
		flush()
	}
	type kv struct {
		k string
		v int
	}
	var out []kv
	for k, v := range paths {
		out = append(out, kv{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].v > out[j].v })
	fmt.Printf("%d\tALL SAMPLES\n", total)
	for _, x := range out {
		fmt.Printf("%d\t%s\n", x.v, x.k)
	}
}
