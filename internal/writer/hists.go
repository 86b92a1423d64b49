package writer

import (
	"time"

	"github.com/omnicache/omnicache/internal/hist"
)

// Hists are the write path's latency and size histograms (Config.Hists;
// nil: off). Each observation is a few atomic adds (package hist).
type Hists struct {
	// PageWait: a Save's wait for a free staging page, 0 when one was
	// free (no clock read then).
	PageWait *hist.H
	// CommitterWait: the engine goroutine's waits for the committer (Sync,
	// budget pressure).
	CommitterWait *hist.H
	// CopyTime: a write's device→host copies, from their issue to the
	// committer seeing them complete; CopyBytes their bytes.
	CopyTime, CopyBytes *hist.H
}

// NewHists returns the write path's histograms.
func NewHists() *Hists {
	return &Hists{PageWait: hist.NewDur(), CommitterWait: hist.NewDur(), CopyTime: hist.NewDur(), CopyBytes: hist.NewSize()}
}

// now is time.Now when h is on, else the zero time (no clock read).
func (h *Hists) now() time.Time {
	if h == nil {
		return time.Time{}
	}
	return time.Now()
}

// committerWait observes a wait on the committer that began at t0.
func (h *Hists) committerWait(t0 time.Time) {
	if h != nil {
		h.CommitterWait.Observe(int64(time.Since(t0)))
	}
}
