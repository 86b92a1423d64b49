package writer

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/gputest"
	"github.com/omnicache/omnicache/soa"
)

// snapshot is what a failed Save must leave as it was.
type snapshot struct {
	charged       int64
	pages, parked int
	devBufs       int
	tasks, lastID uint64
	forced        int64
}

func (f *fixture) snap() snapshot {
	dev, _, _ := f.cd.live()
	return snapshot{charged: f.charged(), pages: f.p.pages.InUse(), parked: f.p.buf.K, devBufs: dev,
		tasks: f.p.q.Pushed(), lastID: f.p.nextID, forced: (&f.p.st).BudgetFlushes.Load()}
}

// A Save that fails for want of resources (a reservation larger than the
// budget, a budget held by steps not consumed yet, no staging page within
// the claim timeout) leaves nothing of the step behind: the budget charge,
// the pages in use, the device buffers, the queue, the write ids and the
// step's refs are as before, nothing was forced out, and the path is not
// failed. Once the cause is gone the step saves (the one larger than the
// budget from host rows), and every row is exact.
func TestPathSaveFailureLeavesNothingBehind(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Config)
		// hold makes the next Save fail (the steps it saved stay
		// unconsumed); free undoes it.
		hold func(f *fixture) []*Refs
		free func(f *fixture, refs []*Refs)
		want error
		// retry is the step's kinds once the cause is gone (nil: the same).
		retry []kind
	}{{
		name:  "larger than the budget",
		mod:   func(c *Config) { c.Budget = 100 },
		hold:  func(f *fixture) []*Refs { return nil },
		free:  func(f *fixture, _ []*Refs) {},
		want:  ErrOverBudget,
		retry: []kind{kHost, kHost, kHost}, // only the deferred rows need device bytes
	}, {
		name: "budget pinned by unconsumed steps",
		mod:  func(c *Config) { c.Budget = 256 },
		hold: func(f *fixture) []*Refs {
			// With the first step's, these deferred clones leave less than
			// the step below needs; their steps pin them, so none may be
			// forced out.
			var refs []*Refs
			for i := int32(0); i < 2; i++ {
				refs = append(refs, f.mustSave(f.step([]kind{kHost, kHost, kDev}, req{h: soa.Handle(i), slots: []int32{20 + i, 24 + i}})))
			}
			return refs
		},
		free: func(f *fixture, refs []*Refs) { f.unpin(refs...) },
		want: errs.Budget,
	}, {
		name: "no staging page",
		mod:  func(c *Config) { c.StagingDepth = 2 },
		hold: holdPages(1),
		free: func(f *fixture, refs []*Refs) { f.unpin(refs...) },
		want: errs.StagingTimeout,
	}, {
		name: "no staging page within the claim timeout",
		mod:  func(c *Config) { c.StagingDepth, c.ClaimTimeout, c.Hists = 2, time.Millisecond, NewHists() },
		hold: holdPages(1),
		free: func(f *fixture, refs []*Refs) { f.unpin(refs...) },
		want: errs.StagingTimeout,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, false, tc.mod)
			f.mustSave(f.step(nil, req{h: 5, slots: slotRange(0, 3)}))
			refs := tc.hold(f)
			f.sync()
			before := f.snap()
			// Every kind of device bytes: clones of immediate and
			// deferred rows.
			s := f.step([]kind{kDev, kDev, kDev}, req{h: 6, slots: slotRange(1, 4)}, req{h: 7, slots: []int32{12}})
			_, err := f.save(s)
			require.ErrorIs(t, err, tc.want)
			if errors.Is(tc.want, errs.StagingTimeout) {
				var te *TimeoutError
				require.ErrorAs(t, err, &te)
				require.Equal(t, max(f.cfg.ClaimTimeout, 0), te.Waited)
			} else {
				require.ErrorIs(t, err, errs.Budget)
			}
			require.Equal(t, before, f.snap(), "state after the failed Save")
			require.Zero(t, f.failPins, "the failed step pins nothing")
			require.NoError(t, f.p.Err(), "a resource failure is not sticky")
			f.sync()
			f.check() // nothing of the step landed

			tc.free(f, refs)
			kinds := []kind{kDev, kDev, kDev}
			if tc.retry != nil {
				kinds = tc.retry
			}
			f.mustSave(f.step(kinds, req{h: 6, slots: slotRange(1, 4)}, req{h: 7, slots: []int32{12}}))
			f.finish(0, 1, 5, 6, 7) // rows a budget flush forced out land in the oracle too
			f.p.flushFinished()
			f.sync()
			f.check()
		})
	}
}

// holdPages saves n steps and keeps them unconsumed: their pages stay
// held.
func holdPages(n int) func(f *fixture) []*Refs {
	return func(f *fixture) []*Refs {
		var refs []*Refs
		for i := 0; i < n; i++ {
			refs = append(refs, f.mustSave(f.step(nil, req{h: soa.Handle(i), slots: slotRange(int32(16+4*i), 2)})))
		}
		return refs
	}
}

// A Save that finds every page held waits for one (back-pressure): it
// returns once a step is consumed, or fails with the cache closed when the
// path is stopped.
func TestPathSaveWaitsForAPage(t *testing.T) {
	f := newFixture(t, false, func(c *Config) { c.StagingDepth, c.ClaimTimeout, c.Hists = 1, deadlockTimeout, NewHists() })
	r0 := f.mustSave(f.step(nil, req{h: 0, slots: slotRange(0, 2)}))
	f.sync()
	done := async(func() error { _, err := f.save(f.step(nil, req{h: 1, slots: slotRange(4, 2)})); return err })
	require.True(t, blocked(done), "Save returned with every page held")
	f.p.Unpin(r0) // not f.unpin: the fixture is the saving goroutine's
	require.NoError(t, recv(t, done, "Save after a page was freed"))
	delete(f.live, r0)
	require.Positive(t, (&f.p.st).StallNanos.Load())
	f.sync()
	f.check()

	done = async(func() error { _, err := f.save(f.step(nil, req{h: 2, slots: slotRange(8, 2)})); return err })
	require.True(t, blocked(done))
	f.p.pages.Close()
	require.ErrorIs(t, recv(t, done, "Save after Stop"), errs.Closed)
}

// A device failure fails the path for good: the call that meets it (Save,
// or Sync for a copy the committer makes) returns an error matching
// errs.WriteFailed and the device's, and so does every later Save, Sync and
// Reset, even once the device works again. Close still frees everything
// (the fixture checks).
func TestPathDeviceFailureIsSticky(t *testing.T) {
	cases := []struct {
		name  string
		op    gputest.Op
		after int64 // calls of op that succeed first
		kinds []kind
		want  error
	}{
		{"clone of a lent device tensor", gputest.OpCopyDtoD, 0, []kind{kDev, kHost, kOmit}, gpu.ErrCopy},
		{"clone allocation", gputest.OpAlloc, 0, []kind{kDev, kHost, kOmit}, gpu.ErrAlloc},
		{"deferred rows to the device", gputest.OpCopyHtoD, 0, []kind{kHost, kHost, kHost}, gpu.ErrCopy},
		{"event after host rows", gputest.OpRecord, 0, []kind{kHost, kHost, kOmit}, gpu.ErrCopy},
		{"committer's copy of device rows", gputest.OpCopyDtoH, 0, []kind{kOwnDev, kOwnDev, kOmit}, gpu.ErrCopy},
		{"committer's copy of deferred rows", gputest.OpCopyDtoH, 0, []kind{kHost, kHost, kOwnDev}, gpu.ErrCopy},
		{"event wait", gputest.OpWait, 0, []kind{kHost, kHost, kOmit}, gpu.ErrCopy},
		{"staging page allocation", gputest.OpAllocHost, 0, []kind{kHost, kHost, kOmit}, gpu.ErrAlloc},
		{"deferred chunk allocation", gputest.OpAllocHost, 1, []kind{kHost, kHost, kDev}, gpu.ErrAlloc},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, true, nil)
			f.fault.FailOpAfter(tc.op, tc.after)
			first := func() error {
				if _, err := f.save(f.step(tc.kinds, req{h: 1, slots: slotRange(4, 4)})); err != nil {
					return err
				}
				f.p.finish(1)
				f.p.flushFinished()
				return f.p.Sync()
			}()
			require.ErrorIs(t, first, errs.WriteFailed)
			require.ErrorIs(t, first, tc.want)
			require.ErrorIs(t, f.p.Err(), errs.WriteFailed)
			f.fault.Heal()
			for _, kd := range []kind{kHost, kDev, kOwnDev} {
				_, err := f.save(f.step([]kind{kd, kd, kd}, req{h: 2, slots: slotRange(8, 2)}))
				require.ErrorIs(t, err, errs.WriteFailed, "Save of %v rows after the failure", kd)
			}
			require.ErrorIs(t, f.p.Sync(), errs.WriteFailed)
			require.ErrorIs(t, f.p.Reset(), errs.WriteFailed)
			require.ErrorIs(t, f.p.fail(errors.New("later")), tc.want, "the first failure stays")
		})
	}
}

// A device that never completes a copy: a wait for the committer gives up
// after the wait timeout and fails the path (errs.DeviceTimeout), and Close
// frees nothing while the committer is stuck, until the device completes.
func TestPathHungDeviceTimesOut(t *testing.T) {
	f := newFixture(t, true, func(c *Config) { c.WaitTimeout = 20 * time.Millisecond })
	f.fault.Hang()
	r := f.mustSave(f.step(nil, req{h: 0, slots: slotRange(0, 4)}))
	err := f.p.Sync()
	require.ErrorIs(t, err, errs.DeviceTimeout)
	require.ErrorIs(t, err, errs.WriteFailed)
	_, err = f.save(f.step(nil, req{h: 1, slots: slotRange(4, 4)}))
	require.ErrorIs(t, err, errs.WriteFailed)

	require.ErrorIs(t, f.p.Close(time.Now(), unconsumed(r)), errs.DeviceTimeout)
	require.Equal(t, 1, f.p.pages.InUse(), "nothing freed while the committer may still copy")
	f.fault.Release()
	f.close() // now it stops, and everything is freed
}

// A step of more rows than a page holds fails with ErrStepTooLarge before
// anything is claimed (the root refuses it at Begin; the path checks it
// too): the state is unchanged and a step that fits then lands exactly.
func TestPathStepLargerThanAPage(t *testing.T) {
	f := newFixture(t, false, nil)
	f.mustSave(f.step(nil, req{h: 5, slots: slotRange(0, 3)}))
	f.sync()
	before := f.snap()
	_, err := f.save(f.step(nil, req{h: 6, slots: slotRange(4, int32(f.cfg.Capacity)+1)}))
	require.ErrorIs(t, err, errs.StepTooLarge)
	require.Equal(t, before, f.snap(), "state after the refused Save")
	require.Zero(t, f.failPins, "the refused step pins nothing")
	require.NoError(t, f.p.Err(), "a refused step is not sticky")
	f.mustSave(f.step(nil, req{h: 6, slots: slotRange(4, int32(f.cfg.Capacity))}))
	f.finish(5, 6)
	f.p.flushFinished()
	f.sync()
	f.check()
}
