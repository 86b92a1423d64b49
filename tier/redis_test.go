package tier

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/omnicache/omnicache/internal/redistest"
)

func redisTier(t *testing.T, opt RedisOptions) *Tier {
	t.Helper()
	r, err := NewRedis(opt)
	if err != nil {
		t.Fatal(err)
	}
	return newTier(t, r)
}

func TestRedisRoundTripPassword(t *testing.T) {
	s := redistest.Start(t, redistest.Options{Password: "s3cret"})
	roundTrip(t, redisTier(t, RedisOptions{Addrs: []string{s.Addr}, Password: "s3cret"}), 64)
}

func TestRedisRoundTripACLUser(t *testing.T) {
	s := redistest.Start(t, redistest.Options{Password: "adminpw", ACL: []string{"omni on >omnipw ~oc:* +@all"}})
	b, err := Open("redis://omni:omnipw@"+s.Addr, RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, newTier(t, b), 16)
}

func TestRedisWrongPassword(t *testing.T) {
	s := redistest.Start(t, redistest.Options{Password: "right", ACL: []string{"omni on >omnipw ~oc:* +@all"}})
	for _, opt := range []RedisOptions{
		{Addrs: []string{s.Addr}, Password: "pw-9f3kq"},
		{Addrs: []string{s.Addr}, Username: "omni", Password: "pw-9f3kq"},
		{Addrs: []string{s.Addr}, Username: "nobody", Password: "omnipw"},
		{Addrs: []string{s.Addr}}, // no password at all
	} {
		r, err := NewRedis(opt)
		if err == nil {
			r.Close()
			t.Fatalf("user %q password %q: connected", opt.Username, opt.Password)
		}
		if !errors.Is(err, ErrAuth) {
			t.Fatalf("user %q password %q: %v, want ErrAuth", opt.Username, opt.Password, err)
		}
		if strings.Contains(err.Error(), "pw-9f3kq") || strings.Contains(err.Error(), "omnipw") {
			t.Fatalf("the error echoes a password: %v", err)
		}
	}
	// Nothing listening: unavailable, not an auth failure.
	s.Kill()
	if _, err := NewRedis(RedisOptions{Addrs: []string{s.Addr}, Password: "right"}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("dead server: %v, want ErrUnavailable", err)
	}
}

func TestRedisEvictionIsMiss(t *testing.T) {
	s := redistest.Start(t, redistest.Options{MaxMemory: "3mb"})
	tr := redisTier(t, RedisOptions{Addrs: []string{s.Addr}})
	ctx := context.Background()
	// Far more than 3 MB of values, in batches: the server evicts.
	big := Namespace{Model: "evict", BlockSize: 16, Keys: []Key{{"hidden", 4096}}}
	bt, err := New(tr.Backend(), big, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 400 // 400 × 64 KiB = 25 MiB
	hs := hashes(0, n)
	for lo := 0; lo < n; lo += 20 {
		var blocks []Block
		for _, h := range hs[lo : lo+20] {
			blocks = append(blocks, block(big, h))
		}
		if _, err := bt.Put(ctx, blocks); err != nil {
			t.Fatal(err)
		}
	}
	if ev := s.Cli(t, "info", "stats"); !strings.Contains(ev, "evicted_keys:") || strings.Contains(ev, "evicted_keys:0\r") {
		t.Fatalf("the server evicted nothing:\n%s", ev)
	}
	// The keys the server still holds before the read (the read itself may
	// evict more: its replies count against maxmemory).
	held := map[string]bool{}
	for _, k := range strings.Fields(s.Cli(t, "keys", "*")) {
		held[k] = true
	}
	dst := dstFor(bt, n)
	errs := bt.Get(ctx, hs, dst)
	served := checkServed(t, bt, hs, dst, errs)
	for j, h := range hs {
		if !held[bt.Addr(h, 0)] && errs[j] == nil {
			t.Fatalf("block %d was evicted before the read but served", j)
		}
	}
	if served == 0 || served > len(held) || served == n {
		t.Fatalf("%d of %d blocks served, the server held %d", served, n, len(held))
	}
	if st := bt.Stats(); st.Misses != int64(n-served) || st.Corrupt != 0 || st.Errs != 0 {
		t.Fatalf("stats %+v: want %d misses, nothing corrupt", st, n-served)
	}
}

func TestRedisCorruptIsMiss(t *testing.T) {
	s := redistest.Start(t, redistest.Options{Password: "pw"})
	tr := redisTier(t, RedisOptions{Addrs: []string{s.Addr}, Password: "pw"})
	ctx := context.Background()
	hs := hashes(0, 4)
	var blocks []Block
	for _, h := range hs {
		blocks = append(blocks, block(testNS, h))
	}
	if _, err := tr.Put(ctx, blocks); err != nil {
		t.Fatal(err)
	}
	raw := tr.Backend().(*Redis).Client()
	// Block 0: one row byte overwritten through a raw client. Block 1: a
	// truncated value. Block 2: block 3's value copied under its address.
	off := strconv.Itoa(headerBytes + len(tr.Addr(hs[0], 0)) + 3)
	cmds := []string{"SETRANGE " + tr.Addr(hs[0], 0) + " " + off + " Z", "SET " + tr.Addr(hs[1], 1) + " short"}
	for _, c := range cmds {
		if err := raw.Do(ctx, raw.B().Arbitrary(strings.Fields(c)...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	v, err := raw.Do(ctx, raw.B().Get().Key(tr.Addr(hs[3], 0)).Build()).AsBytes()
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Do(ctx, raw.B().Set().Key(tr.Addr(hs[2], 0)).Value(string(v)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	dst := dstFor(tr, 4)
	errs := tr.Get(ctx, hs, dst)
	if n := checkServed(t, tr, hs, dst, errs); n != 1 || errs[3] != nil {
		t.Fatalf("%d served: %v; want only block 3", n, errs)
	}
	for j := 0; j < 3; j++ {
		if !errors.Is(errs[j], ErrCorrupt) {
			t.Fatalf("block %d: %v, want ErrCorrupt", j, errs[j])
		}
	}
	// The rejected values were deleted: Lookup stops at block 0 now, and
	// block 3 is still held.
	if st := tr.Stats(); st.CorruptDeleted != 3 {
		t.Fatalf("stats %+v: want 3 corrupt values deleted", st)
	}
	if n, err := tr.Lookup(ctx, hs); n != 0 || err != nil {
		t.Fatalf("Lookup after the corrupt values were read: %d, %v; want 0", n, err)
	}
	if n, err := tr.Lookup(ctx, hs[3:]); n != 1 || err != nil {
		t.Fatalf("Lookup of the intact block: %d, %v; want 1", n, err)
	}
}

// TestRedisCrossNamespaceCopy copies every value of one model's blocks
// under another model's addresses (same block hashes, key names, row
// bytes and block size) through a raw client: the second model's tier
// serves none of them and deletes them.
func TestRedisCrossNamespaceCopy(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	a := redisTier(t, RedisOptions{Addrs: []string{s.Addr}})
	nsB := testNS
	nsB.Model = "other-model"
	bb, err := NewRedis(RedisOptions{Addrs: []string{s.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(bb, nsB, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	crossCopy(t, a, b, a.Backend(), 8)
}

func TestRedisClusterRoundTrip(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{})
	b, err := Open(c.Spec(), RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr := newTier(t, b)
	roundTrip(t, tr, 96)
	// Every node holds some of the blocks, each block's keys on one node.
	total := 0
	for _, n := range c.Nodes {
		k, _ := strconv.Atoi(n.Cli(t, "dbsize"))
		if k == 0 || k%len(testNS.Keys) != 0 {
			t.Fatalf("node %s holds %d keys: want a positive multiple of %d", n.Addr, k, len(testNS.Keys))
		}
		total += k
	}
	if total != 96*len(testNS.Keys) {
		t.Fatalf("%d keys in the cluster, want %d", total, 96*len(testNS.Keys))
	}
}

// TestRedisClusterNodeKilled kills a master mid-run: its blocks become
// misses (counted), no batch hangs, and every block served is exact.
func TestRedisClusterNodeKilled(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{})
	b, err := Open(c.Spec(), RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr := newTier(t, b)
	ctx := context.Background()
	const rounds, per = 6, 32
	var hits, misses [rounds]int
	var victimBlocks int
	for r := 0; r < rounds; r++ {
		hs := hashes(r*per, per)
		var blocks []Block
		for _, h := range hs {
			blocks = append(blocks, block(testNS, h))
		}
		_, perr := tr.Put(ctx, blocks)
		if r < rounds/2 && perr != nil {
			t.Fatalf("round %d before the kill: %v", r, perr)
		}
		if perr != nil && !errors.Is(perr, ErrUnavailable) {
			t.Fatalf("round %d: put error %v, want ErrUnavailable", r, perr)
		}
		if r == rounds/2-1 {
			k, _ := strconv.Atoi(c.Nodes[1].Cli(t, "dbsize"))
			victimBlocks = k / len(testNS.Keys)
			c.Nodes[1].Kill()
		}
		dst := dstFor(tr, per)
		errs := tr.Get(ctx, hs, dst)
		hits[r] = checkServed(t, tr, hs, dst, errs)
		misses[r] = per - hits[r]
		for _, e := range errs {
			if e != nil && !errors.Is(e, ErrUnavailable) {
				t.Fatalf("round %d: %v, want ErrUnavailable (a node down)", r, e)
			}
		}
	}
	t.Logf("hits per round %v, misses %v (the killed node held %d blocks)", hits, misses, victimBlocks)
	if victimBlocks == 0 {
		t.Fatal("the killed node held no block: the test proves nothing")
	}
	for r := 0; r < rounds; r++ {
		if r < rounds/2-1 && misses[r] != 0 {
			t.Fatalf("round %d before the kill: %d misses", r, misses[r])
		}
		if r >= rounds/2-1 && (misses[r] == 0 || hits[r] == 0) {
			t.Fatalf("round %d after the kill: %d hits, %d misses: want both (one node of three down)", r, hits[r], misses[r])
		}
	}
	if st := tr.Stats(); st.Errs == 0 {
		t.Fatalf("stats %+v: the lost blocks are not counted", st)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key (PEM) and
// returns their paths and a pool trusting it.
func selfSigned(t *testing.T) (cert, key string, pool *x509.CertPool) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(c)
	return cert, key, pool
}

func TestRedisTLS(t *testing.T) {
	cert, key, pool := selfSigned(t)
	s := redistest.Start(t, redistest.Options{Password: "pw", TLSCert: cert, TLSKey: key})
	tr := redisTier(t, RedisOptions{Addrs: []string{s.Addr}, Password: "pw", TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	if got := tr.String(); got != "rediss://"+s.Addr {
		t.Fatalf("backend %q", got)
	}
	roundTrip(t, tr, 8)
	// Plain TCP to a TLS port, and TLS that does not trust the server:
	// both fail to connect, as unavailable (not as a password problem).
	for _, opt := range []RedisOptions{
		{Addrs: []string{s.Addr}, Password: "pw", DialTimeout: time.Second, IOTimeout: time.Second},
		{Addrs: []string{s.Addr}, Password: "pw", TLS: &tls.Config{MinVersion: tls.VersionTLS12}},
	} {
		r, err := NewRedis(opt)
		if err == nil {
			r.Close()
			t.Fatalf("TLS %v: connected", opt.TLS != nil)
		}
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("TLS %v: %v, want ErrUnavailable", opt.TLS != nil, err)
		}
	}
}

// Open refuses a cluster spec against a server that is not a cluster
// node, selects a database number, and names TLS when a TLS handshake
// with a plain server times out.
func TestRedisOpenChecks(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	if b, err := Open("redis-cluster://"+s.Addr, RedisOptions{}); b != nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "not a Redis Cluster") {
		t.Fatalf("a cluster spec against a plain server: %v, %v; want nil, ErrConfig naming it", b, err)
	}
	b, err := Open("redis://"+s.Addr+"/3", RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := New(b, testNS, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := tr.Put(context.Background(), []Block{block(testNS, 1)}); err != nil {
		t.Fatal(err)
	}
	if n := s.Cli(t, "-n", "3", "dbsize"); n != "2" {
		t.Fatalf("database 3 holds %q keys, want 2", n)
	}
	if n := s.Cli(t, "-n", "0", "dbsize"); n != "0" {
		t.Fatalf("database 0 holds %q keys, want 0", n)
	}
	b, err = Open("rediss://"+s.Addr, RedisOptions{DialTimeout: 300 * time.Millisecond, IOTimeout: 300 * time.Millisecond})
	if b != nil || err == nil || !strings.Contains(err.Error(), "is the server speaking TLS?") {
		t.Fatalf("TLS against a plain server: %v, %v; want nil and a hint", b, err)
	}
}

// Purge removes one namespace's values from a Redis node and from every
// master of a cluster, whatever glob characters the model holds, and
// leaves other namespaces alone.
func TestRedisPurge(t *testing.T) {
	ctx := context.Background()
	for _, cluster := range []bool{false, true} {
		var spec string
		if cluster {
			spec = redistest.StartCluster(t, redistest.Options{}).Spec()
		} else {
			spec = "redis://" + redistest.Start(t, redistest.Options{}).Addr
		}
		open := func(model string) *Tier {
			b, err := Open(spec, RedisOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ns := testNS
			ns.Model = model
			tr, err := New(b, ns, Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tr.Close() })
			return tr
		}
		a, b := open("m*[x]?"), open("m")
		hs := hashes(0, 40)
		for _, tr := range []*Tier{a, b} {
			var blocks []Block
			for _, h := range hs {
				blocks = append(blocks, block(tr.Namespace(), h))
			}
			if _, err := tr.Put(ctx, blocks); err != nil {
				t.Fatal(err)
			}
		}
		n, err := a.Purge(ctx)
		if err != nil || n != len(hs)*len(testNS.Keys) {
			t.Fatalf("cluster %v: Purge removed %d values, %v; want %d", cluster, n, err, len(hs)*len(testNS.Keys))
		}
		if got, _ := a.Lookup(ctx, hs); got != 0 {
			t.Fatalf("cluster %v: %d blocks left after Purge", cluster, got)
		}
		if got, _ := b.Lookup(ctx, hs); got != len(hs) {
			t.Fatalf("cluster %v: the other namespace holds %d of %d blocks after Purge", cluster, got, len(hs))
		}
	}
}
