package omnicache

import "errors"

var errTODO = errors.New("omnicache: not implemented yet")

// Cache is the prefix-cache core. See the package doc for the contract.
type Cache struct{}

// New creates a cache. It allocates no mirror memory: the mirror of a key is
// created lazily when the key first writes.
func New(cfg Config) (*Cache, error) { return nil, errTODO }

// Begin registers a step plan. Engine goroutine only.
func (c *Cache) Begin(p *Plan) error { return errTODO }

// Save hands in the step's outputs and returns its step id. Engine goroutine only.
func (c *Cache) Save(o *Outputs) (StepID, error) { return 0, errTODO }

// Materialize fills dst with the rows of reqs for step id and consumes the id.
func (c *Cache) Materialize(id StepID, reqs []int64, dst *Result) error { return errTODO }

// Discard consumes step id without reading it.
func (c *Cache) Discard(id StepID) error { return errTODO }

// Sync writes out the decode buffer and waits until every write handed to
// the committer has landed in the mirror. Deferred rows of live requests stay
// pending (they land when their request finishes). Engine goroutine only.
func (c *Cache) Sync() error { return errTODO }

// Peek reads the committed mirror rows of key k (Config.Keys order) for
// slots into dst (len(slots)*RowBytes bytes); slots never written read as
// zeros. A diagnostic for tests and verification: call it after Sync.
func (c *Cache) Peek(k int, slots []int32, dst []byte) error { return errTODO }

// Close stops the committer and releases pages and budget.
func (c *Cache) Close() error { return nil }

// Stats returns the cache's counters.
func (c *Cache) Stats() Stats { return Stats{} }
