package tier

import (
	"container/list"
	"context"
	"fmt"
	"sync"
)

// DefaultEmbeddedBytes bounds an embedded store made with a zero capacity.
const DefaultEmbeddedBytes = 1 << 30

// Embedded is the in-process backend: values held in Go memory, bounded in
// bytes (key and value lengths), least recently used out first. It is the
// default tier: one process's caches (replicas in one replay) share it.
type Embedded struct {
	mu     sync.Mutex
	max    int64
	used   int64
	lru    *list.List // front: most recently used; elements are *entry
	idx    map[string]*list.Element
	closed bool
	evicts int64
}

type entry struct {
	key string
	val []byte
}

// NewEmbedded returns an embedded store of at most maxBytes (0:
// DefaultEmbeddedBytes).
func NewEmbedded(maxBytes int64) (*Embedded, error) {
	if maxBytes == 0 {
		maxBytes = DefaultEmbeddedBytes
	}
	if maxBytes < 0 {
		return nil, fmt.Errorf("%w: embedded store of %d bytes", ErrConfig, maxBytes)
	}
	return &Embedded{max: maxBytes, lru: list.New(), idx: map[string]*list.Element{}}, nil
}

func (e *Embedded) String() string { return "embedded" }

// Get implements Backend. The values returned are the store's own (values
// are never modified in place: Set replaces them).
func (e *Embedded) Get(_ context.Context, keys []string) ([][]byte, []error) {
	vals, errs := make([][]byte, len(keys)), make([]error, len(keys))
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, k := range keys {
		if e.closed {
			errs[i] = ErrClosed
			continue
		}
		if el, ok := e.idx[k]; ok {
			e.lru.MoveToFront(el)
			vals[i] = el.Value.(*entry).val
		}
	}
	return vals, errs
}

// Set implements Backend: it keeps each value (the caller hands it over),
// evicting the least recently used values to stay within the bound.
func (e *Embedded) Set(_ context.Context, keys []string, vals [][]byte) []error {
	errs := make([]error, len(keys))
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, k := range keys {
		if e.closed {
			errs[i] = ErrClosed
			continue
		}
		size := int64(len(k) + len(vals[i]))
		if size > e.max {
			errs[i] = fmt.Errorf("%w: %d bytes, the store holds %d", ErrTooLarge, size, e.max)
			continue
		}
		if el, ok := e.idx[k]; ok {
			e.remove(el)
		}
		for e.used+size > e.max {
			e.remove(e.lru.Back())
			e.evicts++
		}
		e.idx[k] = e.lru.PushFront(&entry{key: k, val: vals[i]})
		e.used += size
	}
	return errs
}

func (e *Embedded) remove(el *list.Element) {
	en := el.Value.(*entry)
	e.lru.Remove(el)
	delete(e.idx, en.key)
	e.used -= int64(len(en.key) + len(en.val))
}

// Exists implements Backend.
func (e *Embedded) Exists(_ context.Context, keys []string) ([]bool, []error) {
	held, errs := make([]bool, len(keys)), make([]error, len(keys))
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, k := range keys {
		if e.closed {
			errs[i] = ErrClosed
			continue
		}
		_, held[i] = e.idx[k]
	}
	return held, errs
}

// Close drops every value; later calls fail with ErrClosed.
func (e *Embedded) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.idx, e.used = nil, 0
	e.lru.Init()
	return nil
}

// Usage reports the bytes held, the bound and the values evicted so far.
func (e *Embedded) Usage() (used, max, evicted int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.used, e.max, e.evicts
}

// Delete drops keys as an eviction would (what a server under memory
// pressure does to a value between a Lookup and its fetch).
func (e *Embedded) Delete(keys ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range keys {
		if el, ok := e.idx[k]; ok {
			e.remove(el)
			e.evicts++
		}
	}
}
