package tier

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
)

// testNS is a two-key layout: a hidden state and a narrow optional key.
var testNS = Namespace{Model: "test-model", BlockSize: 4, Keys: []Key{{"hidden", 32}, {"codes", 8}}}

// rows is the deterministic content of block hash's rows of key k.
func rows(ns Namespace, hash uint64, k int) []byte {
	b := make([]byte, ns.BlockSize*ns.Keys[k].RowBytes)
	x := hash*0x9e3779b97f4a7c15 + uint64(k+1)*0xbf58476d1ce4e5b9
	for i := range b {
		x ^= x >> 31
		x *= 0x94d049bb133111eb
		b[i] = byte(x >> 56)
	}
	return b
}

func block(ns Namespace, hash uint64) Block {
	b := Block{Hash: hash}
	for k := range ns.Keys {
		b.Rows = append(b.Rows, rows(ns, hash, k))
	}
	return b
}

func dstFor(t *Tier, n int) [][]byte {
	var d [][]byte
	for j := 0; j < n; j++ {
		for k := range t.Namespace().Keys {
			d = append(d, make([]byte, t.BlockBytes(k)))
		}
	}
	return d
}

// checkServed fails on any served block whose rows are not its own, and
// returns how many blocks were served.
func checkServed(tb testing.TB, t *Tier, hashes []uint64, dst [][]byte, errs []error) int {
	tb.Helper()
	nk := len(t.Namespace().Keys)
	served := 0
	for j, h := range hashes {
		if errs[j] != nil {
			if !errors.Is(errs[j], ErrMiss) {
				tb.Fatalf("block %x: error %v does not match ErrMiss", h, errs[j])
			}
			continue
		}
		served++
		for k := 0; k < nk; k++ {
			if !bytes.Equal(dst[j*nk+k], rows(t.Namespace(), h, k)) {
				tb.Fatalf("block %x key %d: wrong rows served", h, k)
			}
		}
	}
	return served
}

func TestValueRoundTripAndChecks(t *testing.T) {
	r := rows(testNS, 7, 0)
	v := encode(nil, "hidden", 7, 4, 32, r)
	if len(v) != valueSize("hidden", 4, 32) {
		t.Fatalf("value of %d bytes, want %d", len(v), valueSize("hidden", 4, 32))
	}
	got, err := decode(v, "hidden", 7, 4, 32)
	if err != nil || !bytes.Equal(got, r) {
		t.Fatalf("decode: %v", err)
	}
	cases := map[string]func() ([]byte, error){
		"other key":        func() ([]byte, error) { return decode(v, "codes", 7, 4, 32) },
		"other hash":       func() ([]byte, error) { return decode(v, "hidden", 8, 4, 32) },
		"other block size": func() ([]byte, error) { return decode(encode(nil, "hidden", 7, 2, 64, r), "hidden", 7, 4, 32) },
		"other row bytes":  func() ([]byte, error) { return decode(encode(nil, "hidden", 7, 8, 16, r), "hidden", 7, 4, 32) },
		"truncated":        func() ([]byte, error) { return decode(v[:len(v)-1], "hidden", 7, 4, 32) },
		"empty":            func() ([]byte, error) { return decode(nil, "hidden", 7, 4, 32) },
	}
	for off := 0; off < len(v); off++ {
		c := append([]byte(nil), v...)
		c[off] ^= 0x10
		cases[fmt.Sprintf("bit flip at %d", off)] = func() ([]byte, error) { return decode(c, "hidden", 7, 4, 32) }
	}
	ver := encode(nil, "hidden", 7, 4, 32, r)
	ver[4] = 2 // a future format version, its checksum valid: still refused
	cases["version 2"] = func() ([]byte, error) { return decode(fixCRC(ver), "hidden", 7, 4, 32) }
	for name, f := range cases {
		if got, err := f(); !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrMiss) || got != nil {
			t.Errorf("%s: got %d bytes, err %v; want ErrCorrupt and ErrMiss", name, len(got), err)
		}
	}
}

func fixCRC(v []byte) []byte {
	n := len(v) - crcBytes
	binary.LittleEndian.PutUint32(v[n:], crc32.Checksum(v[:n], castagnoli))
	return v
}

func newTier(tb testing.TB, b Backend) *Tier {
	tb.Helper()
	tr, err := New(b, testNS, Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Close() })
	return tr
}

func hashes(lo, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = uint64(lo+i)*0x100000001b3 + 0xcbf29ce484222325
	}
	return h
}

// roundTrip puts n blocks, looks them up and reads them back exactly.
func roundTrip(t *testing.T, tr *Tier, n int) {
	t.Helper()
	ctx := context.Background()
	hs := hashes(0, n)
	var blocks []Block
	for _, h := range hs {
		blocks = append(blocks, block(testNS, h))
	}
	stored, err := tr.Put(ctx, blocks)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(n * (tr.ValueBytes(0) + tr.ValueBytes(1)))
	if stored != want {
		t.Fatalf("stored %d bytes, want %d", stored, want)
	}
	dst := dstFor(tr, n)
	errs := tr.Get(ctx, hs, dst)
	if got := checkServed(t, tr, hs, dst, errs); got != n {
		t.Fatalf("%d of %d blocks served: %v", got, n, errors.Join(errs...))
	}
	// Lookup counts leading blocks: a block never stored ends the run.
	probe := append(append([]uint64(nil), hs[:3]...), hashes(1000, 1)[0], hs[3])
	if got, err := tr.Lookup(ctx, probe); err != nil || got != 3 {
		t.Fatalf("Lookup = %d, %v; want 3", got, err)
	}
	if got, err := tr.Lookup(ctx, hs); err != nil || got != n {
		t.Fatalf("Lookup = %d, %v; want %d", got, err, n)
	}
	miss := hashes(5000, 2)
	errs = tr.Get(ctx, miss, dstFor(tr, 2))
	for j := range miss {
		if !errors.Is(errs[j], ErrMiss) || errors.Is(errs[j], ErrCorrupt) {
			t.Fatalf("never stored block: %v, want a plain ErrMiss", errs[j])
		}
	}
}

func TestEmbeddedRoundTrip(t *testing.T) {
	e, _ := NewEmbedded(0)
	roundTrip(t, newTier(t, e), 64)
}

func TestEmbeddedLRUEviction(t *testing.T) {
	ctx := context.Background()
	probe, _ := New(&Embedded{}, testNS, Options{})
	per := int64(probe.ValueBytes(0) + probe.ValueBytes(1) + 2*len(probe.Addr(0, 0)))
	e, _ := NewEmbedded(10 * per) // room for 10 blocks
	tr := newTier(t, e)
	hs := hashes(0, 12)
	for _, h := range hs[:10] {
		if _, err := tr.Put(ctx, []Block{block(testNS, h)}); err != nil {
			t.Fatal(err)
		}
	}
	// Touch block 0 so that block 1 is the least recently used.
	if errs := tr.Get(ctx, hs[:1], dstFor(tr, 1)); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if _, err := tr.Put(ctx, []Block{block(testNS, hs[10])}); err != nil {
		t.Fatal(err)
	}
	used, max, evicted := e.Usage()
	if used > max || evicted != 2 {
		t.Fatalf("used %d of %d, %d values evicted; want 2 (one block)", used, max, evicted)
	}
	dst := dstFor(tr, 11)
	errs := tr.Get(ctx, hs[:11], dst)
	checkServed(t, tr, hs[:11], dst, errs)
	for j := range hs[:11] {
		if (j == 1) != (errs[j] != nil) {
			t.Fatalf("block %d: %v (only block 1, the least recently used, is evicted)", j, errs[j])
		}
	}
	// A value larger than the whole store is refused, not stored.
	small, _ := NewEmbedded(16)
	if _, err := newTier(t, small).Put(ctx, []Block{block(testNS, 1)}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized put: %v, want ErrTooLarge", err)
	}
}

func TestEmbeddedCorruptIsMiss(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(0)
	tr := newTier(t, e)
	hs := hashes(0, 3)
	if _, err := tr.Put(ctx, []Block{block(testNS, hs[0]), block(testNS, hs[1]), block(testNS, hs[2])}); err != nil {
		t.Fatal(err)
	}
	// Block 0: a row byte flipped. Block 1: block 2's value stored under
	// block 1's address (a valid value, for the wrong block).
	v, _ := e.Get(ctx, []string{tr.Addr(hs[0], 0)})
	bad := append([]byte(nil), v[0]...)
	bad[headerBytes+len("hidden")+5] ^= 1
	v2, _ := e.Get(ctx, []string{tr.Addr(hs[2], 1)})
	e.Set(ctx, []string{tr.Addr(hs[0], 0), tr.Addr(hs[1], 1)}, [][]byte{bad, v2[0]})
	dst := dstFor(tr, 3)
	errs := tr.Get(ctx, hs, dst)
	if n := checkServed(t, tr, hs, dst, errs); n != 1 || errs[2] != nil {
		t.Fatalf("%d served (%v); want only block 2", n, errs)
	}
	for j := 0; j < 2; j++ {
		if !errors.Is(errs[j], ErrCorrupt) {
			t.Fatalf("block %d: %v, want ErrCorrupt", j, errs[j])
		}
	}
	if st := tr.Stats(); st.Corrupt != 2 || st.Hits != 4 {
		t.Fatalf("stats %+v: want 2 corrupt values, 4 served", st)
	}
}

func TestNewValidates(t *testing.T) {
	e, _ := NewEmbedded(0)
	bad := []Namespace{
		{Model: "m", BlockSize: 0, Keys: testNS.Keys},
		{Model: "m", BlockSize: 4},
		{Model: "m", BlockSize: 4, Keys: []Key{{"a", 1}, {"a", 2}}},
		{Model: "m", BlockSize: 4, Keys: []Key{{"", 1}}},
		{Model: "m", BlockSize: 4, Keys: []Key{{"a", 0}}},
	}
	for _, ns := range bad {
		if _, err := New(e, ns, Options{}); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", ns, err)
		}
	}
	tr := newTier(t, e)
	if _, err := tr.Put(context.Background(), []Block{{Hash: 1, Rows: [][]byte{make([]byte, 3), make([]byte, 32)}}}); !errors.Is(err, ErrConfig) {
		t.Errorf("short rows: %v, want ErrConfig", err)
	}
	// Namespaces that differ in model, layout or block size never share
	// an address.
	a := map[string]bool{}
	for _, ns := range []Namespace{testNS, {Model: "other", BlockSize: 4, Keys: testNS.Keys},
		{Model: "test-model", BlockSize: 8, Keys: testNS.Keys}, {Model: "test-model", BlockSize: 4, Keys: []Key{{"hidden", 64}, {"codes", 8}}}} {
		x, err := New(e, ns, Options{})
		if err != nil {
			t.Fatal(err)
		}
		a[x.Addr(42, 0)] = true
	}
	if len(a) != 4 {
		t.Fatalf("addresses collide across namespaces: %v", a)
	}
}

func TestOpenSpecs(t *testing.T) {
	for _, s := range []string{"memcached://h:1", "redis://", "redis://h", "redis://a:1,b:2", "nonsense"} {
		if _, err := Open(s, RedisOptions{}); !errors.Is(err, ErrConfig) {
			t.Errorf("Open(%q): %v, want ErrConfig", s, err)
		}
	}
	b, err := Open("embedded", RedisOptions{})
	if err != nil || b.String() != "embedded" {
		t.Fatalf("Open(embedded) = %v, %v", b, err)
	}
	b.Close()
	if _, errs := b.Get(context.Background(), []string{"x"}); !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", errs[0])
	}
}

func TestNewValuePutValues(t *testing.T) {
	e, _ := NewEmbedded(0)
	tr := newTier(t, e)
	hs := hashes(0, 3)
	var vals [][]byte
	for _, h := range hs {
		for k := range testNS.Keys {
			v, r := tr.NewValue(h, k)
			copy(r, rows(testNS, h, k))
			vals = append(vals, v)
		}
	}
	if _, err := tr.PutValues(context.Background(), hs, vals[:5]); !errors.Is(err, ErrConfig) {
		t.Fatalf("PutValues of 5 values for 3 blocks of 2 keys: %v, want ErrConfig", err)
	}
	if n, err := tr.PutValues(context.Background(), hs, vals); err != nil || n != int64(3*(tr.ValueBytes(0)+tr.ValueBytes(1))) {
		t.Fatalf("PutValues = %d, %v", n, err)
	}
	dst := dstFor(tr, 3)
	if got := checkServed(t, tr, hs, dst, tr.Get(context.Background(), hs, dst)); got != 3 {
		t.Fatalf("%d of 3 served", got)
	}
}

// TestAddrFormat pins the address layout (values stored by an earlier build
// on a Redis server stay reachable): the namespace prefix, the hash as 16
// lower-case hex digits, "}:", the key name; addrs agrees with Addr.
func TestAddrFormat(t *testing.T) {
	e, _ := NewEmbedded(0)
	tr, err := New(e, testNS, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	hs := []uint64{0, 1, 0xabc, 0x0123456789abcdef, ^uint64(0)}
	hs = append(hs, hashes(0, 50)...)
	got := tr.addrs(hs)
	for i, h := range hs {
		for k, key := range testNS.Keys {
			want := fmt.Sprintf("%s%016x}:%s", tr.prefix, h, key.Name)
			if a := tr.Addr(h, k); a != want {
				t.Fatalf("Addr(%x, %d) = %q, want %q", h, k, a, want)
			}
			if a := got[i*len(testNS.Keys)+k]; a != want {
				t.Fatalf("addrs[%d] = %q, want %q", i*len(testNS.Keys)+k, a, want)
			}
		}
	}
	if !strings.HasPrefix(tr.prefix, "oc:{"+testNS.Model+"/") {
		t.Fatalf("prefix %q", tr.prefix)
	}
}
