package tier

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Open builds a backend from a spec:
//
//	embedded                                 the in-process store (DefaultEmbeddedBytes)
//	redis://[user:password@]HOST[:PORT][/DB] one Redis node (port 6379 by default, database DB)
//	rediss://[user:password@]HOST[:PORT][/DB] one Redis node over TLS
//	redis-cluster://[user:password@]H1[:P1],H2[:P2],...   a Redis Cluster (seed nodes)
//	redis-clusters://...                     a Redis Cluster over TLS
//
// A Redis spec may end in "?ttl=DURATION" (a Go duration, "6h"): every
// value is stored with that expiry (RedisOptions.TTL).
//
// A password with no user ("redis://:secret@h:p") authenticates the default
// user. base supplies what the spec does not (timeouts, a TLS config). A
// cluster spec against a server that is not a cluster node is ErrConfig, as
// is a database number other than 0 on a cluster. On an error the backend
// is nil.
func Open(spec string, base RedisOptions) (Backend, error) {
	if spec == "" || spec == "embedded" {
		e, err := NewEmbedded(0)
		if err != nil {
			return nil, err
		}
		return e, nil
	}
	opt, err := parseSpec(spec, base)
	if err != nil {
		return nil, err
	}
	r, err := NewRedis(opt)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// DefaultRedisPort is the port of a spec's address that names none.
const DefaultRedisPort = "6379"

// parseSpec turns a redis spec into options. Its errors never echo a
// password (Redact).
func parseSpec(spec string, base RedisOptions) (RedisOptions, error) {
	scheme, rest, ok := strings.Cut(spec, "://")
	if !ok {
		return base, fmt.Errorf("%w: tier spec %q: want embedded, redis://HOST:PORT or redis-cluster://H1:P1,...", ErrConfig, Redact(spec))
	}
	opt := base
	switch scheme {
	case "redis", "rediss":
	case "redis-cluster", "redis-clusters":
		opt.Cluster = true
	default:
		return base, fmt.Errorf("%w: tier spec %q: unknown scheme %q", ErrConfig, Redact(spec), Redact(scheme))
	}
	if (scheme == "rediss" || scheme == "redis-clusters") && opt.TLS == nil {
		opt.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		ui, err := url.Parse("x://" + rest[:at] + "@h")
		if err != nil || ui.User == nil {
			return base, fmt.Errorf("%w: tier spec: bad credentials", ErrConfig) // never echo a password
		}
		opt.Username = ui.User.Username()
		opt.Password, _ = ui.User.Password()
		rest = rest[at+1:]
	}
	if hosts, query, ok := strings.Cut(rest, "?"); ok {
		rest = hosts
		for _, kv := range strings.Split(query, "&") {
			k, v, _ := strings.Cut(kv, "=")
			if k != "ttl" {
				return base, fmt.Errorf("%w: tier spec %s://%s: unknown option %q (want ttl=DURATION)", ErrConfig, scheme, rest, k)
			}
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return base, fmt.Errorf("%w: tier spec %s://%s: ttl %q is not a positive duration", ErrConfig, scheme, rest, v)
			}
			opt.TTL = d
		}
	}
	if hosts, db, ok := strings.Cut(rest, "/"); ok {
		rest = hosts
		if db != "" {
			n, err := strconv.Atoi(db)
			if err != nil || n < 0 || n > 1<<16 {
				return base, fmt.Errorf("%w: tier spec %s://%s/%s: database %q is not a number", ErrConfig, scheme, rest, db, db)
			}
			if n != 0 && opt.Cluster {
				return base, fmt.Errorf("%w: tier spec %s://%s/%s: a Redis Cluster has database 0 only", ErrConfig, scheme, rest, db)
			}
			opt.DB = n
		}
	}
	opt.Addrs = nil
	for _, a := range strings.Split(rest, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			// No port: the default one (a bare IPv6 address needs brackets).
			if a == "" || strings.Count(a, ":") > 1 && !strings.HasPrefix(a, "[") {
				return base, fmt.Errorf("%w: tier spec %s://%s: address %q: %w", ErrConfig, scheme, rest, a, err)
			}
			a = net.JoinHostPort(strings.Trim(a, "[]"), DefaultRedisPort)
			if _, _, err := net.SplitHostPort(a); err != nil {
				return base, fmt.Errorf("%w: tier spec %s://%s: address %q: %w", ErrConfig, scheme, rest, a, err)
			}
		}
		opt.Addrs = append(opt.Addrs, a)
	}
	if !opt.Cluster && len(opt.Addrs) != 1 {
		return base, fmt.Errorf("%w: %s:// takes one address, got %d (a cluster is redis-cluster://)", ErrConfig, scheme, len(opt.Addrs))
	}
	return opt, nil
}

// Redact hides the password of a tier spec, so that the spec can be
// printed and logged. It reads the credentials as parseSpec does: they end
// at the spec's last "@" and start after its scheme's "://"; the password
// is what follows the user's ":". Every byte between that ":" and the last
// "@" becomes "xxxxx", whatever the password holds (quotes, "@", ":", "/",
// "://", %-escapes, spaces). Where the scheme is mistyped (no "://" before
// the first ":"), everything between the first ":" and the last "@" is
// hidden. A spec with no "@" holds no credentials and is returned as it is,
// as is one whose credentials have no ":" (a user and no password). A
// message quoting one spec is redacted the same way.
func Redact(spec string) string {
	at := strings.LastIndex(spec, "@")
	if at < 0 {
		return spec
	}
	c := strings.IndexByte(spec[:at], ':')
	if c >= 0 && strings.HasPrefix(spec[c:], "://") {
		// The scheme's separator: the password follows the user's ":".
		if u := strings.IndexByte(spec[c+3:at], ':'); u >= 0 {
			c += 3 + u
		} else {
			c = -1
		}
	}
	if c < 0 {
		return spec // a user and no password
	}
	return spec[:c+1] + "xxxxx" + spec[at:]
}
