package tier

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Open builds a backend from a spec:
//
//	embedded                                 the in-process store (DefaultEmbeddedBytes)
//	redis://[user:password@]HOST:PORT        one Redis node
//	rediss://[user:password@]HOST:PORT       one Redis node over TLS
//	redis-cluster://[user:password@]H1:P1,H2:P2,...   a Redis Cluster (seed nodes)
//	redis-clusters://...                     a Redis Cluster over TLS
//
// A password with no user ("redis://:secret@h:p") authenticates the default
// user. base supplies what the spec does not (timeouts, a TLS config).
func Open(spec string, base RedisOptions) (Backend, error) {
	if spec == "" || spec == "embedded" {
		return NewEmbedded(0)
	}
	scheme, rest, ok := strings.Cut(spec, "://")
	if !ok {
		return nil, fmt.Errorf("%w: tier spec %q: want embedded, redis://HOST:PORT or redis-cluster://H1:P1,...", ErrConfig, spec)
	}
	opt := base
	switch scheme {
	case "redis", "rediss":
	case "redis-cluster", "redis-clusters":
		opt.Cluster = true
	default:
		return nil, fmt.Errorf("%w: tier spec %q: unknown scheme %q", ErrConfig, spec, scheme)
	}
	if (scheme == "rediss" || scheme == "redis-clusters") && opt.TLS == nil {
		opt.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		ui, err := url.Parse("x://" + rest[:at] + "@h")
		if err != nil || ui.User == nil {
			return nil, fmt.Errorf("%w: tier spec: bad credentials", ErrConfig) // never echo a password
		}
		opt.Username = ui.User.Username()
		opt.Password, _ = ui.User.Password()
		rest = rest[at+1:]
	}
	rest = strings.TrimSuffix(rest, "/")
	opt.Addrs = nil
	for _, a := range strings.Split(rest, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("%w: tier spec %s://%s: address %q: %w", ErrConfig, scheme, rest, a, err)
		}
		opt.Addrs = append(opt.Addrs, a)
	}
	if !opt.Cluster && len(opt.Addrs) != 1 {
		return nil, fmt.Errorf("%w: %s:// takes one address, got %d (a cluster is redis-cluster://)", ErrConfig, scheme, len(opt.Addrs))
	}
	return NewRedis(opt)
}
