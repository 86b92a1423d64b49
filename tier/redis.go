package tier

import (
	"context"
	"crypto/sha1"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// RedisOptions configures the Redis backend.
type RedisOptions struct {
	// Addrs are host:port addresses: one node, or seed nodes of a cluster.
	Addrs []string
	// Cluster selects Redis Cluster (slots learned from the seeds); false
	// talks to Addrs[0] as a single node.
	Cluster bool
	// Username and Password authenticate (AUTH / an ACL user); an empty
	// Username with a Password is the default user (requirepass).
	Username, Password string
	// TLS, when set, connects with TLS.
	TLS *tls.Config
	// DB is the database number of a single node (SELECT; a cluster has 0
	// only).
	DB int
	// DialTimeout bounds a connection attempt (0: 2 s); IOTimeout bounds a
	// connection's wait for answers (0: 5 s), so a node that stops
	// answering fails the commands sent to it instead of hanging them.
	DialTimeout, IOTimeout time.Duration
	// TTL, when positive, stores every value with that expiry (a value
	// stored again gets it afresh), except a pinned one (Pin: no expiry,
	// kept by a store again). With the server's maxmemory-policy
	// volatile-lru (or volatile-ttl, volatile-lfu) only values with an
	// expiry are evicted: pinned values never are. 0: no expiry (the
	// server's policy, e.g. allkeys-lru, evicts any value). At most
	// MaxRedisTTL; at least a millisecond.
	TTL time.Duration
}

// MaxRedisTTL bounds RedisOptions.TTL (a year).
const MaxRedisTTL = 365 * 24 * time.Hour

// Redis is the Redis backend (one node or a cluster) over rueidis: each
// Get, Set or Exists of many keys is one DoMulti, pipelined on the
// connection of every node it touches (rueidis splits a cluster batch by
// slot). Without a TTL values are stored with plain SET, no expiry: the
// server's maxmemory policy (allkeys-lru) evicts them, and an evicted
// value is a miss. With RedisOptions.TTL each value is stored by a short
// Lua script (one EVALSHA a value, pipelined) that keeps a pinned value
// (one with no expiry) unexpiring and gives any other the TTL.
type Redis struct {
	c       rueidis.Client
	name    string
	cluster bool
	ttl     string // milliseconds, "" without a TTL
	closed  atomic.Bool
}

// setTTL stores ARGV[1] under KEYS[1] with ARGV[2] ms of expiry, keeping
// no expiry on a key that exists without one (pinned).
const setTTL = `if redis.call('PTTL', KEYS[1]) == -1 then return redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL') end
return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])`

var setTTLSha = fmt.Sprintf("%x", sha1.Sum([]byte(setTTL)))

// NewRedis connects to the server or cluster. A refused password is
// ErrAuth; an unreachable server ErrUnavailable.
func NewRedis(opt RedisOptions) (*Redis, error) {
	if len(opt.Addrs) == 0 {
		return nil, fmt.Errorf("%w: no redis address", ErrConfig)
	}
	if opt.DialTimeout == 0 {
		opt.DialTimeout = 2 * time.Second
	}
	if opt.IOTimeout == 0 {
		opt.IOTimeout = 5 * time.Second
	}
	co := rueidis.ClientOption{
		InitAddress:       opt.Addrs,
		Username:          opt.Username,
		Password:          opt.Password,
		TLSConfig:         opt.TLS,
		DisableCache:      true, // values are read once per import: no client-side cache
		ForceSingleClient: !opt.Cluster,
		SelectDB:          opt.DB,
		Dialer:            net.Dialer{Timeout: opt.DialTimeout, KeepAlive: time.Second},
		ConnWriteTimeout:  opt.IOTimeout,
		ClientName:        "omnicache-tier",
		// A tier read that fails is a miss (the engine recomputes): no
		// retries, so a dead node costs one failed round trip, not a
		// backoff up to the batch's timeout.
		DisableRetry: true,
	}
	if opt.Cluster && opt.DB != 0 {
		return nil, fmt.Errorf("%w: database %d on a Redis Cluster (database 0 only)", ErrConfig, opt.DB)
	}
	if opt.DB < 0 {
		return nil, fmt.Errorf("%w: database %d", ErrConfig, opt.DB)
	}
	if opt.TTL < 0 || opt.TTL > MaxRedisTTL || (opt.TTL > 0 && opt.TTL < time.Millisecond) {
		return nil, fmt.Errorf("%w: TTL %v not 0 or in [1ms, %v]", ErrConfig, opt.TTL, MaxRedisTTL)
	}
	c, err := rueidis.NewClient(co)
	if err != nil {
		return nil, connectError(opt, "connect", err)
	}
	r := &Redis{c: c, name: spec(opt), cluster: opt.Cluster}
	if opt.TTL > 0 {
		r.ttl = strconv.FormatInt(opt.TTL.Milliseconds(), 10)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opt.DialTimeout+opt.IOTimeout)
	defer cancel()
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
		c.Close()
		return nil, connectError(opt, "ping", err)
	}
	if opt.Cluster {
		// rueidis falls back to a single node when the seed is not a
		// cluster node: refuse that, the keys would not be spread.
		info, err := c.Do(ctx, c.B().ClusterInfo().Build()).ToString()
		if err != nil || !strings.Contains(info, "cluster_state:") {
			c.Close()
			if err != nil && strings.Contains(err.Error(), "cluster support disabled") {
				return nil, fmt.Errorf("%w: %v is not a Redis Cluster node (cluster support disabled); use redis://", ErrConfig, opt.Addrs)
			}
			return nil, connectError(opt, "cluster info", err)
		}
	}
	return r, nil
}

// connectError classifies a failure to connect, with a hint when a TLS
// handshake timed out (a plain server never answers one).
func connectError(opt RedisOptions, what string, err error) error {
	err = classify(fmt.Sprintf("%s %v", what, opt.Addrs), err)
	if opt.TLS != nil && (isTimeout(err) || strings.Contains(err.Error(), "handshake") || strings.Contains(err.Error(), "first record does not look like a TLS handshake")) {
		return fmt.Errorf("%w (is the server speaking TLS?)", err)
	}
	return err
}

func spec(opt RedisOptions) string {
	scheme := "redis"
	if opt.Cluster {
		scheme = "redis-cluster"
	}
	if opt.TLS != nil {
		scheme += "s"
	}
	return scheme + "://" + strings.Join(opt.Addrs, ",")
}

// classify maps a rueidis error to this package's sentinels.
func classify(what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, rueidis.ErrClosing) {
		return fmt.Errorf("%w: %s: %w", ErrClosed, what, err)
	}
	msg := err.Error()
	if strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "NOPERM") ||
		strings.Contains(msg, "invalid username-password") {
		return fmt.Errorf("%w: %s: %w", ErrAuth, what, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
}

func (r *Redis) String() string { return r.name }

// Client is the rueidis client, for diagnostics and tests.
func (r *Redis) Client() rueidis.Client { return r.c }

// closedErrs is n errors, each ErrClosed: a closed backend's answer to a
// batch of n keys.
func closedErrs(n int) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = ErrClosed
	}
	return errs
}

// Purge implements Purger: on every node (each master of a cluster) it
// scans for the keys matching prefix (glob characters in it escaped) and
// deletes them, a scan page at a time.
func (r *Redis) Purge(ctx context.Context, prefix string) (int, error) {
	if r.closed.Load() {
		return 0, ErrClosed
	}
	pattern := globEscape(prefix) + "*"
	total := 0
	for addr, c := range r.c.Nodes() {
		if r.cluster {
			role, err := c.Do(ctx, c.B().Role().Build()).ToArray()
			if err != nil {
				return total, classify("role "+addr, err)
			}
			if s, _ := role[0].ToString(); s != "master" {
				continue // its master deletes the keys (replicas are read-only)
			}
		}
		var cursor uint64
		for {
			e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
			if err != nil {
				return total, classify("scan "+addr, err)
			}
			if len(e.Elements) > 0 {
				cmds := make(rueidis.Commands, len(e.Elements))
				for i, k := range e.Elements {
					cmds[i] = c.B().Del().Key(k).Build()
				}
				for i, res := range c.DoMulti(ctx, cmds...) {
					n, err := res.AsInt64()
					if err != nil {
						return total, classify("del "+e.Elements[i], err)
					}
					total += int(n)
				}
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return total, nil
}

// globEscape escapes the characters SCAN MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		switch c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

// Delete implements Deleter: one pipelined DEL per key.
func (r *Redis) Delete(ctx context.Context, keys []string) []error {
	if r.closed.Load() {
		return closedErrs(len(keys))
	}
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Del().Key(k).Build()
	}
	errs := make([]error, len(keys))
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		errs[i] = classify("del "+keys[i], res.Error())
	}
	return errs
}

// Get implements Backend: one pipelined GET per key.
func (r *Redis) Get(ctx context.Context, keys []string) ([][]byte, []error) {
	vals := make([][]byte, len(keys))
	if r.closed.Load() {
		return vals, closedErrs(len(keys))
	}
	errs := make([]error, len(keys))
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Get().Key(k).Build()
	}
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		v, err := res.AsBytes()
		switch {
		case err == nil:
			vals[i] = v
		case rueidis.IsRedisNil(err):
		default:
			errs[i] = classify("get "+keys[i], err)
		}
	}
	return vals, errs
}

// Set implements Backend: one pipelined SET per key.
func (r *Redis) Set(ctx context.Context, keys []string, vals [][]byte) []error {
	if r.closed.Load() {
		return closedErrs(len(keys))
	}
	errs := make([]error, len(keys))
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		if r.ttl == "" {
			cmds[i] = r.c.B().Set().Key(k).Value(rueidis.BinaryString(vals[i])).Build()
		} else {
			cmds[i] = r.c.B().Evalsha().Sha1(setTTLSha).Numkeys(1).Key(k).Arg(rueidis.BinaryString(vals[i]), r.ttl).Build()
		}
	}
	var again []int // values whose node lacked the script: sent with EVAL
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			if re, ok := rueidis.IsRedisErr(err); ok && re.IsNoScript() {
				again = append(again, i)
				continue
			}
			errs[i] = classify("set "+keys[i], err)
		}
	}
	if len(again) > 0 {
		cmds = cmds[:0]
		for _, i := range again {
			cmds = append(cmds, r.c.B().Eval().Script(setTTL).Numkeys(1).Key(keys[i]).Arg(rueidis.BinaryString(vals[i]), r.ttl).Build())
		}
		for j, res := range r.c.DoMulti(ctx, cmds...) {
			if err := res.Error(); err != nil {
				errs[again[j]] = classify("set "+keys[again[j]], err)
			}
		}
	}
	return errs
}

// Pin implements Pinner: every key is checked first (one pipelined
// EXISTS; a key not held is ErrMiss and nothing is pinned), then its
// expiry removed (PERSIST). A value evicted between the two fails alone
// (ErrMiss).
func (r *Redis) Pin(ctx context.Context, keys []string) []error {
	held, errs := r.Exists(ctx, keys)
	failed := false
	for i := range keys {
		if errs[i] == nil && !held[i] {
			errs[i] = fmt.Errorf("%w: %s", ErrMiss, keys[i])
		}
		failed = failed || errs[i] != nil
	}
	if failed {
		return errs
	}
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Persist().Key(k).Build()
	}
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			errs[i] = classify("persist "+keys[i], err)
		}
	}
	// PERSIST answers 0 for a key with no expiry (pinned already, or
	// stored without a TTL) and for one that is gone: tell them apart.
	held, herrs := r.Exists(ctx, keys)
	for i := range keys {
		if errs[i] == nil && herrs[i] == nil && !held[i] {
			errs[i] = fmt.Errorf("%w: %s (evicted while being pinned)", ErrMiss, keys[i])
		}
	}
	return errs
}

// Unpin implements Pinner: with a TTL, every key with no expiry gets it
// (PEXPIRE NX); without one, values have no expiry anyway and Unpin
// changes nothing.
func (r *Redis) Unpin(ctx context.Context, keys []string) []error {
	if r.closed.Load() {
		return closedErrs(len(keys))
	}
	errs := make([]error, len(keys))
	if r.ttl == "" {
		return errs
	}
	ms, _ := strconv.ParseInt(r.ttl, 10, 64)
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Pexpire().Key(k).Milliseconds(ms).Nx().Build()
	}
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			errs[i] = classify("pexpire "+keys[i], err)
		}
	}
	return errs
}

// Exists implements Backend: one pipelined EXISTS per key.
func (r *Redis) Exists(ctx context.Context, keys []string) ([]bool, []error) {
	held := make([]bool, len(keys))
	if r.closed.Load() {
		return held, closedErrs(len(keys))
	}
	errs := make([]error, len(keys))
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Exists().Key(k).Build()
	}
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		n, err := res.AsInt64()
		if err != nil {
			errs[i] = classify("exists "+keys[i], err)
			continue
		}
		held[i] = n > 0
	}
	return held, errs
}

// Close closes every connection. A second Close returns nil.
func (r *Redis) Close() error {
	if !r.closed.Swap(true) {
		r.c.Close()
	}
	return nil
}
