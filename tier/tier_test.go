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
	"time"
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
	const addr = "oc:{m/0000000000000001/b4/0000000000000007}:hidden"
	for _, sl := range []*sealer{newSealer(nil), newSealer([]byte("0123456789abcdef"))} {
		r := rows(testNS, 7, 0)
		v := sl.encode(nil, addr, 7, 4, 32, r)
		if len(v) != sl.valueSize(len(addr), 4, 32) {
			t.Fatalf("value of %d bytes, want %d", len(v), sl.valueSize(len(addr), 4, 32))
		}
		got, err := sl.decode(v, addr, 7, 4, 32)
		if err != nil || !bytes.Equal(got, r) {
			t.Fatalf("decode: %v", err)
		}
		other := func(a string) func() ([]byte, error) {
			return func() ([]byte, error) { return sl.decode(v, a, 7, 4, 32) }
		}
		cases := map[string]func() ([]byte, error){
			"other key":        other("oc:{m/0000000000000001/b4/0000000000000007}:codes1"),
			"other model":      other("oc:{n/0000000000000001/b4/0000000000000007}:hidden"),
			"other layout":     other("oc:{m/0000000000000002/b4/0000000000000007}:hidden"),
			"other block":      other("oc:{m/0000000000000001/b4/0000000000000008}:hidden"),
			"other hash":       func() ([]byte, error) { return sl.decode(v, addr, 8, 4, 32) },
			"other block size": func() ([]byte, error) { return sl.decode(sl.encode(nil, addr, 7, 2, 64, r), addr, 7, 4, 32) },
			"other row bytes":  func() ([]byte, error) { return sl.decode(sl.encode(nil, addr, 7, 8, 16, r), addr, 7, 4, 32) },
			"truncated":        func() ([]byte, error) { return sl.decode(v[:len(v)-1], addr, 7, 4, 32) },
			"empty":            func() ([]byte, error) { return sl.decode(nil, addr, 7, 4, 32) },
			"other secret": func() ([]byte, error) {
				return sl.decode(newSealer([]byte("fedcba9876543210")).encode(nil, addr, 7, 4, 32, r), addr, 7, 4, 32)
			},
			"sealed other kind":  func() ([]byte, error) { return sl.decode(otherKind(sl).encode(nil, addr, 7, 4, 32, r), addr, 7, 4, 32) },
			"resealed with crc":  func() ([]byte, error) { return sl.decode(fixCRC(append([]byte(nil), v...)), addr, 7, 4, 32) },
			"same length, other": func() ([]byte, error) { return sl.decode(v, addr[:len(addr)-1]+"x", 7, 4, 32) },
		}
		if !sl.keyed() {
			delete(cases, "other secret")
			delete(cases, "resealed with crc")
		}
		for off := 0; off < len(v); off++ {
			c := append([]byte(nil), v...)
			c[off] ^= 0x10
			cases[fmt.Sprintf("bit flip at %d", off)] = func() ([]byte, error) { return sl.decode(c, addr, 7, 4, 32) }
		}
		ver := sl.encode(nil, addr, 7, 4, 32, r)
		ver[4] = FormatVersion + 1 // a future format version, its seal valid: still refused
		sl.seal(ver)
		cases["future version"] = func() ([]byte, error) { return sl.decode(ver, addr, 7, 4, 32) }
		for name, f := range cases {
			if got, err := f(); !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrMiss) || got != nil {
				t.Errorf("keyed %v: %s: got %d bytes, err %v; want ErrCorrupt and ErrMiss", sl.keyed(), name, len(got), err)
			}
		}
	}
}

// otherKind is a sealer of the other kind than s (crc32c for a keyed one).
func otherKind(s *sealer) *sealer {
	if s.keyed() {
		return newSealer(nil)
	}
	return newSealer([]byte("0123456789abcdef"))
}

// fixCRC reseals v's last 4 bytes with crc32c (what anyone can compute).
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
	bad[headerBytes+len(tr.Addr(hs[0], 0))+5] ^= 1
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

// crossCopy puts n blocks through tier a, copies every value under tier
// b's addresses of the same block hashes through the raw backend (what a
// misconfigured or hostile writer does), and checks that b serves none of
// them, reports them corrupt and deleted, and that its Lookup then misses.
func crossCopy(t *testing.T, a, b *Tier, raw Backend, n int) {
	t.Helper()
	ctx := context.Background()
	hs := hashes(100, n)
	var blocks []Block
	for _, h := range hs {
		blocks = append(blocks, block(a.Namespace(), h))
	}
	if _, err := a.Put(ctx, blocks); err != nil {
		t.Fatal(err)
	}
	from, to := a.addrs(hs), b.addrs(hs)
	vals, errs := raw.Get(ctx, from)
	for i, err := range errs {
		if err != nil || vals[i] == nil {
			t.Fatalf("raw get %s: %v", from[i], err)
		}
	}
	for i, err := range raw.Set(ctx, to, vals) {
		if err != nil {
			t.Fatalf("raw set %s: %v", to[i], err)
		}
	}
	if got, err := b.Lookup(ctx, hs); got != n || err != nil {
		t.Fatalf("Lookup before the fetch: %d, %v; want %d (presence only)", got, err, n)
	}
	dst := dstFor(b, n)
	for j, err := range b.Get(ctx, hs, dst) {
		if !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrMiss) {
			t.Fatalf("block %d copied from model %q: %v, want ErrCorrupt", j, a.Namespace().Model, err)
		}
	}
	st, nv := b.Stats(), int64(n*len(b.ns.Keys))
	if st.Hits != 0 || st.Corrupt != nv || st.CorruptDeleted != nv {
		t.Fatalf("stats %+v: want 0 served, %d values corrupt, every one deleted", st, nv)
	}
	if got, err := b.Lookup(ctx, hs); got != 0 || err != nil {
		t.Fatalf("Lookup after the fetch: %d, %v; want 0", got, err)
	}
	// a's own values are untouched.
	dst = dstFor(a, n)
	errs = a.Get(ctx, hs, dst)
	if served := checkServed(t, a, hs, dst, errs); served != n {
		t.Fatalf("tier a serves %d of its %d blocks", served, n)
	}
}

// A value copied under another namespace's address (another model, or the
// same model with another key layout that shares the key) is corrupt there.
func TestCrossNamespaceCopyIsCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name string
		ns   Namespace
	}{
		{"other model", Namespace{Model: "other-model", BlockSize: testNS.BlockSize, Keys: testNS.Keys}},
		{"other layout", Namespace{Model: testNS.Model, BlockSize: testNS.BlockSize, Keys: []Key{{"hidden", 32}, {"codes", 8}, {"extra", 8}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := NewEmbedded(0)
			a := newTier(t, e)
			b, err := New(e, tc.ns, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.name == "other layout" {
				// Only the shared key can be copied: give b's third key
				// a's second key's value too, so every key is "present".
				b.ns.Keys = b.ns.Keys[:2]
				b.tmpl = b.tmpl[:2]
			}
			crossCopy(t, a, b, e, 6)
		})
	}
}

// With a secret, a value written by anyone without it is corrupt, even at
// its exact address with a valid crc32c; tiers sharing the secret share
// values.
func TestSecretSealsValues(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(0)
	secret := []byte("a shared secret, 32 bytes long!!")
	a, err := New(e, testNS, Options{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := New(e, testNS, Options{Secret: secret})
	open, _ := New(e, testNS, Options{})
	wrong, _ := New(e, testNS, Options{Secret: []byte("another secret of 32 bytes long!")})
	hs := hashes(0, 4)
	if _, err := a.Put(ctx, []Block{block(testNS, hs[0]), block(testNS, hs[1])}); err != nil {
		t.Fatal(err)
	}
	dst := dstFor(b, 2)
	errs := b.Get(ctx, hs[:2], dst)
	if served := checkServed(t, b, hs[:2], dst, errs); served != 2 {
		t.Fatalf("a tier with the same secret serves %d of 2 blocks: %v", served, errs)
	}
	// A writer without the secret stores blocks 2 and 3 at their exact
	// addresses; the keyed tiers refuse them.
	if _, err := open.Put(ctx, []Block{block(testNS, hs[2]), block(testNS, hs[3])}); err != nil {
		t.Fatal(err)
	}
	for j, err := range a.Get(ctx, hs[2:], dstFor(a, 2)) {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("block %d written without the secret: %v, want ErrCorrupt", j+2, err)
		}
	}
	if _, err := wrong.Put(ctx, []Block{block(testNS, hs[0])}); err != nil {
		t.Fatal(err)
	}
	if err := b.Get(ctx, hs[:1], dstFor(b, 1))[0]; !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a block written under another secret: %v, want ErrCorrupt", err)
	}
	if _, err := New(e, testNS, Options{Secret: []byte("short")}); !errors.Is(err, ErrConfig) {
		t.Fatalf("a 5-byte secret: %v, want ErrConfig", err)
	}
}

// Tier.Delete removes every key of the blocks; Lookup misses them after.
func TestTierDelete(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(0)
	tr := newTier(t, e)
	hs := hashes(0, 3)
	if _, err := tr.Put(ctx, []Block{block(testNS, hs[0]), block(testNS, hs[1]), block(testNS, hs[2])}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Delete(ctx, hs[1:2]); err != nil {
		t.Fatal(err)
	}
	if n, _ := tr.Lookup(ctx, hs); n != 1 {
		t.Fatalf("Lookup after deleting block 1: %d, want 1", n)
	}
	if n, _ := tr.Lookup(ctx, hs[2:]); n != 1 {
		t.Fatalf("block 2 was deleted too")
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
		{Model: "m{x}", BlockSize: 4, Keys: testNS.Keys},
		{Model: strings.Repeat("m", MaxNameBytes+1), BlockSize: 4, Keys: testNS.Keys},
		{Model: "m", BlockSize: MaxBlockSize + 1, Keys: testNS.Keys},
		{Model: "m", BlockSize: 1 << 20, Keys: []Key{{"a", 1 << 12}}},
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
	for _, s := range []string{"memcached://h:1", "redis://", "redis://a:1,b:2", "nonsense",
		"redis://h:1/x", "redis://h:1/-1", "redis-cluster://h:1/2", "redis://u:secret@h:1/x"} {
		b, err := Open(s, RedisOptions{})
		if !errors.Is(err, ErrConfig) {
			t.Errorf("Open(%q): %v, want ErrConfig", s, err)
		}
		if b != nil {
			t.Errorf("Open(%q) returned a backend with its error", s)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q): the error %q shows the password", s, err)
		}
	}
	// A backend that fails to connect is nil, not a typed nil in the
	// interface (Close on it would panic).
	if b, err := Open("redis://127.0.0.1:1", RedisOptions{DialTimeout: 200 * time.Millisecond}); b != nil || !errors.Is(err, ErrUnavailable) {
		t.Errorf("Open of a closed port: %v, %v; want nil, ErrUnavailable", b, err)
	}
	for spec, want := range map[string]RedisOptions{
		"redis://h":                   {Addrs: []string{"h:6379"}},
		"redis://h/":                  {Addrs: []string{"h:6379"}},
		"redis://h:7000/0":            {Addrs: []string{"h:7000"}},
		"redis://u:p@h:7000/3":        {Addrs: []string{"h:7000"}, DB: 3, Username: "u", Password: "p"},
		"redis://[::1]":               {Addrs: []string{"[::1]:6379"}},
		"redis-cluster://a,b:7001/0":  {Addrs: []string{"a:6379", "b:7001"}, Cluster: true},
		"redis-cluster://a:1,b:2,c:3": {Addrs: []string{"a:1", "b:2", "c:3"}, Cluster: true},
	} {
		got, err := parseSpec(spec, RedisOptions{})
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("parseSpec(%q) = %+v, %v; want %+v", spec, got, err, want)
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

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://u:pw@h:1":              "redis://u:xxxxx@h:1",
		"redis://:pw@h:1/2":             "redis://:xxxxx@h:1/2",
		"redis://h:1":                   "redis://h:1",
		"redis://u@h:1":                 "redis://u@h:1",
		"tier redis://u:a@b@h:1 failed": "tier redis://u:xxxxx@h:1 failed",
		"embedded":                      "embedded",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// hostilePasswords hold every byte that ends a password for a scanner:
// quotes, "@", ":", "/", %-escapes, spaces, and "://" itself. Each holds
// "hunter2", which no redacted text may show.
var hostilePasswords = []string{
	"pa'hunter2ss", `pa"hunter2"ss`, "hunter2@x@y", "a:hunter2:b", "hunter2/z/", "%27hunter2%40%3A",
	"hunter2 with spaces\t", "x://hunter2@", "@hunter2", ":hunter2", "hunter2\n'", "hunter2?ttl=1h#f", "hunter2\\",
}

// TestRedactHostilePasswords: whatever bytes a password holds, no byte of
// it survives Redact, in any scheme, mistyped or not, and tier.Open's
// error for a mistyped scheme or a malformed spec never shows it.
func TestRedactHostilePasswords(t *testing.T) {
	for _, pw := range hostilePasswords {
		for _, form := range []string{
			"redis://u:%s@127.0.0.1:1", "rediss://:%s@h:1/0?ttl=1h", "redis-cluster://u:%s@a:1,b:2",
			"redsi://u:%s@h:1", "redis:/u:%s@h:1", "redis//u:%s@h", "u:%s@h://x", "redis://u:%s@h:1:2:3",
		} {
			spec := fmt.Sprintf(form, pw)
			if got := Redact(spec); strings.Contains(got, "hunter2") || !strings.Contains(got, "xxxxx") {
				t.Errorf("Redact(%q) = %q: the password shows", spec, got)
			}
			b, err := Open(spec, RedisOptions{DialTimeout: time.Millisecond})
			if err == nil {
				b.Close()
				continue // a well-formed spec: the unreachable server failed later, or the client is lazy
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Open(%q): %v: the password shows", spec, err)
			}
		}
	}
}
