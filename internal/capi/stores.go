// The tier stores a cache's spec opens, and the process's named embedded
// stores that several caches share.

package main

import (
	"fmt"
	"strings"
	"sync"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/tier"
)

// sharedPrefix names an embedded store shared by every cache of the
// process that names it: the prefill and decode instances of one process
// (and tests) meet through it.
const sharedPrefix = "embedded://"

var (
	sharedMu     sync.Mutex
	sharedStores = map[string]*sharedStore{}
)

// sharedStore is a named embedded store and how many caches hold it; the
// last Close closes it.
type sharedStore struct {
	*tier.Embedded
	name string
	refs int
}

func (s *sharedStore) Close() error {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if s.refs--; s.refs > 0 {
		return nil
	}
	delete(sharedStores, s.name)
	return s.Embedded.Close()
}

// openBackend opens the store of a tier spec: "embedded://NAME" is the
// process's store of that name (made by its first cache), anything else
// what tier.Open makes of it.
func openBackend(spec string) (tier.Backend, error) {
	name, ok := strings.CutPrefix(spec, sharedPrefix)
	if !ok {
		return tier.Open(spec, tier.RedisOptions{})
	}
	if name == "" {
		return nil, fmt.Errorf("%w: tier spec %q names no store", omnicache.ErrConfig, spec)
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	s := sharedStores[name]
	if s == nil {
		e, err := tier.NewEmbedded(0)
		if err != nil {
			return nil, err
		}
		s = &sharedStore{Embedded: e, name: name}
		sharedStores[name] = s
	}
	s.refs++
	return s, nil
}
