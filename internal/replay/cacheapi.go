package replay

import "github.com/omnicache/omnicache"

// Cache is the part of *omnicache.Cache the replay drives. The replay uses
// the real cache (RealCache) unless Options.NewCache says otherwise (tests
// plug in fakes).
type Cache interface {
	Begin(p *omnicache.Plan) error
	Save(o *omnicache.Outputs) (omnicache.StepID, error)
	// Materialize consumes id and returns the rows of reqs; the Rows stay
	// valid until the next Materialize.
	Materialize(id omnicache.StepID, reqs []int64) (Rows, error)
	Discard(id omnicache.StepID) error
	Sync() error
	Peek(k int, slots []int32, dst []byte) error
	Stats() omnicache.Stats
	Close() error
}

// Rows is what Materialize returns; *omnicache.Result implements it.
type Rows interface {
	Len() int
	ID(i int) int64
	Prefix(i int) int
	Tokens(i int) int
	From(i int) int // the position of request i's first row
	Rows(i, k int) []byte
}

// RealCache adapts *omnicache.Cache to Cache, reusing one Result.
type RealCache struct {
	C   *omnicache.Cache
	res omnicache.Result
}

// NewRealCache is the default Options.NewCache: omnicache.New.
func NewRealCache(cfg omnicache.Config) (Cache, error) {
	c, err := omnicache.New(cfg)
	if err != nil {
		return nil, err
	}
	return &RealCache{C: c}, nil
}

func (r *RealCache) Begin(p *omnicache.Plan) error { return r.C.Begin(p) }

func (r *RealCache) Save(o *omnicache.Outputs) (omnicache.StepID, error) { return r.C.Save(o) }

func (r *RealCache) Materialize(id omnicache.StepID, reqs []int64) (Rows, error) {
	if err := r.C.Materialize(id, reqs, &r.res); err != nil {
		return nil, err
	}
	return &r.res, nil
}

func (r *RealCache) Discard(id omnicache.StepID) error { return r.C.Discard(id) }
func (r *RealCache) Sync() error                       { return r.C.Sync() }
func (r *RealCache) Peek(k int, slots []int32, dst []byte) error {
	return r.C.Peek(k, slots, dst)
}
func (r *RealCache) Stats() omnicache.Stats { return r.C.Stats() }
func (r *RealCache) Close() error           { return r.C.Close() }

// Histograms is the cache's (metrics.HistogramSource).
func (r *RealCache) Histograms() []omnicache.Histogram { return r.C.Histograms() }
