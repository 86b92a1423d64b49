package writer

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/gputest"
	"github.com/omnicache/omnicache/soa"
)

// The Path tests drive a write path on the host device (gpu.NewHost),
// counted (countDev) and, for failures, wrapped in gputest.Faulty, and
// check what lands in the mirror against a row oracle: per key and slot the
// row the newest write put there, or that the slot is absent, stale or still
// in transit.

// Keys of the default fixture: two immediate keys, one of them optional,
// and a deferred one.
const (
	keyK   = 0 // immediate, required
	keyOpt = 1 // immediate, optional
	keyDef = 2 // deferred
)

func defaultConfig() Config {
	return Config{
		NumBlocks:    8,
		BlockSize:    4,
		Keys:         []KeySpec{{Name: "k", RowBytes: 16}, {Name: "opt", RowBytes: 8, Optional: true}, {Name: "def", RowBytes: 12, Deferred: true}},
		StagingDepth: 8,
		Capacity:     16,
		ClaimTimeout: NoWait,
		Budget:       1 << 20,
		ChunkBytes:   64, // a deferred run of more than 5 rows is copied in pieces
		WaitTimeout:  deadlockTimeout,
	}
}

// countDev counts the device and staging memory the path holds: every
// Alloc (or AllocHost) must be freed once, by Close at the latest.
type countDev struct {
	gpu.Device
	mu       sync.Mutex
	dev      map[*byte]int
	host     map[*byte]int
	badFrees int
}

func newCountDev() *countDev {
	return &countDev{Device: gpu.NewHost(), dev: map[*byte]int{}, host: map[*byte]int{}}
}

func (d *countDev) Alloc(n int) (gpu.Buffer, error) {
	b, err := d.Device.Alloc(n)
	if err == nil && n > 0 {
		d.mu.Lock()
		d.dev[&b.Host[0]] = n
		d.mu.Unlock()
	}
	return b, err
}

func (d *countDev) Free(b gpu.Buffer) {
	d.mu.Lock()
	if len(b.Host) == 0 || d.dev[&b.Host[0]] == 0 {
		d.badFrees++
	} else {
		delete(d.dev, &b.Host[0])
	}
	d.mu.Unlock()
	d.Device.Free(b)
}

func (d *countDev) AllocHost(n int) ([]byte, error) {
	b, err := d.Device.AllocHost(n)
	if err == nil && n > 0 {
		d.mu.Lock()
		d.host[&b[0]] = n
		d.mu.Unlock()
	}
	return b, err
}

func (d *countDev) FreeHost(b []byte) {
	d.mu.Lock()
	if len(b) == 0 || d.host[&b[0]] == 0 {
		d.badFrees++
	} else {
		delete(d.host, &b[0])
	}
	d.mu.Unlock()
	d.Device.FreeHost(b)
}

// live is the number of device buffers and staging allocations not freed,
// and the frees of memory the device never gave out (or gave twice).
func (d *countDev) live() (dev, host, bad int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.dev), len(d.host), d.badFrees
}

// Kinds of a step's output tensor for one key.
type kind uint8

const (
	kHost    kind = iota // host rows, borrowed (copied into the page)
	kDev                 // device rows, borrowed (cloned)
	kOwnHost             // host rows handed over (ReleaseHost gives them back)
	kOwnDev              // device rows handed over (the path frees them)
	kOmit                // not emitted (optional keys)
)

// req is one request of a step: its handle and the slots of its tokens.
type req struct {
	h     soa.Handle
	slots []int32
}

// want is the oracle's entry for one slot of one key; a slot without one
// was never written.
type want struct {
	row     []byte
	absent  bool // the newest write omitted the key (deferred: or rejected it)
	stale   bool // the newest write rejected the row (immediate keys)
	pending bool // deferred rows not written yet (in transit)
	tag     int  // pending: which step's row
}

type pendRow struct {
	k    int
	slot int32
	tag  int
	row  []byte
}

type fixture struct {
	t     *testing.T
	cfg   Config
	p     *Path
	cd    *countDev
	fault *gputest.Faulty // nil unless faulty
	tag   int
	want  []map[int32]want
	pend  map[soa.Handle][]pendRow
	live  map[*Refs]bool
	// failPins is how many writes the last failed Save left pinned.
	failPins int

	relMu    sync.Mutex
	released map[*byte]bool // owned host tensors handed back

	closed bool
}

// newFixture starts a path on a counted host device with the default
// config changed by mod (nil: none); faulty wraps the device in
// gputest.Faulty. The path is closed at the end of the test (and then
// must have freed everything).
func newFixture(t *testing.T, faulty bool, mod func(*Config)) *fixture {
	t.Helper()
	return newFixtureDev(t, faulty, mod, nil)
}

// newFixtureDev is newFixture with the device wrapped by wrap (nil: not),
// outside the counting and the faults.
func newFixtureDev(t *testing.T, faulty bool, mod func(*Config), wrap func(gpu.Device) gpu.Device) *fixture {
	t.Helper()
	f := &fixture{t: t, cfg: defaultConfig(), cd: newCountDev(), pend: map[soa.Handle][]pendRow{},
		live: map[*Refs]bool{}, released: map[*byte]bool{}}
	if mod != nil {
		mod(&f.cfg)
	}
	f.cfg.Dev = f.cd
	if faulty {
		f.fault = gputest.NewFaulty(f.cd)
		f.cfg.Dev = f.fault
	}
	if wrap != nil {
		f.cfg.Dev = wrap(f.cfg.Dev)
	}
	f.cfg.ReleaseHost = func(b []byte) {
		f.relMu.Lock()
		defer f.relMu.Unlock()
		if f.released[&b[0]] {
			t.Errorf("owned host tensor handed back twice")
		}
		f.released[&b[0]] = true
	}
	f.want = make([]map[int32]want, len(f.cfg.Keys))
	for k := range f.want {
		f.want[k] = map[int32]want{}
	}
	var err error
	if f.p, err = NewPath(f.cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f.fault != nil {
			f.fault.Heal()
		}
		if f.closed {
			return
		}
		if !f.p.mu.TryLock() { // a panic under the state lock: Close would deadlock
			t.Error("the state lock is held: the path is left open")
			return
		}
		f.p.mu.Unlock()
		f.close()
	})
	return f
}

// rowsOf is the content of n rows of rb (at least 2) bytes of key k for
// step tag: never a zero byte, and different for every step (of the first
// 255) and token (of the first 255).
func rowsOf(k, rb, tag, n int) []byte {
	b := make([]byte, n*rb)
	for j := 0; j < n; j++ {
		row := b[j*rb : (j+1)*rb]
		for i := range row {
			row[i] = byte(1 + (tag*131+k*61+j*17+i)%251)
		}
		row[0], row[1] = byte(1+tag%255), byte(1+j%255)
	}
	return b
}

// step builds a step over reqs whose output of key k is of kinds[k]
// (missing kinds: kHost), with fresh rows.
func (f *fixture) step(kinds []kind, reqs ...req) *Step {
	f.tag++
	s := &Step{}
	for _, r := range reqs {
		s.IDs = append(s.IDs, int64(r.h)+100)
		s.Handles = append(s.Handles, r.h)
		s.Count = append(s.Count, int32(len(r.slots)))
		s.TokOff = append(s.TokOff, int32(len(s.Slots)))
		s.Slots = append(s.Slots, r.slots...)
	}
	n := len(s.Slots)
	for k, ks := range f.cfg.Keys {
		kd := kHost
		if k < len(kinds) {
			kd = kinds[k]
		}
		rows := rowsOf(k, ks.RowBytes, f.tag, n)
		switch kd {
		case kHost:
			s.Out = append(s.Out, Src{Host: rows})
		case kDev:
			s.Out = append(s.Out, Src{Dev: gpu.HostBuffer(rows)})
		case kOwnHost:
			s.Out = append(s.Out, Src{Host: rows, Owned: true})
		case kOwnDev:
			b, err := f.cd.Alloc(len(rows))
			require.NoError(f.t, err)
			copy(b.Host, rows)
			s.Out = append(s.Out, Src{Dev: b, Owned: true})
		case kOmit:
			s.Out = append(s.Out, Src{})
		}
	}
	return s
}

// decode is a pure-decode step of one token per request, request i
// (handle i) writing slot slots[i], every key from host rows.
func (f *fixture) decode(slots ...int32) *Step {
	var reqs []req
	for i, s := range slots {
		reqs = append(reqs, req{h: soa.Handle(i), slots: []int32{s}})
	}
	st := f.step(nil, reqs...)
	st.Pure = true
	return st
}

// save saves s and, when it succeeds, records what it writes in the
// oracle and overwrites the tensors the step only lent (the path must have
// taken their rows by the time Save returns). When it fails, the step's
// refs are unpinned and its owned device tensors freed, as the root
// package does.
func (f *fixture) save(s *Step) (*Refs, error) {
	r := &Refs{}
	r.Reset(len(f.cfg.Keys))
	if err := f.p.Save(s, r); err != nil {
		for k := range s.Out {
			if src := &s.Out[k]; src.Owned && src.Host == nil && !src.Dev.IsZero() {
				f.cd.Free(src.Dev) // a failed Save hands owned tensors back
			}
		}
		// The caller drops what the failed step pinned (the root does).
		f.failPins = len(r.Pins)
		f.p.Unpin(r)
		return r, err
	}
	f.live[r] = true
	rej := func(tok int) bool { return false }
	if s.Accepted != nil {
		rejected := rejectRows(nil, s)
		rej = func(tok int) bool { return len(rejected) > 0 && rejected[tok] }
	}
	for k, ks := range f.cfg.Keys {
		rb, src := ks.RowBytes, &s.Out[k]
		rows := src.Host
		if rows == nil && !src.Omitted() {
			rows = src.Dev.Host
		}
		rows = bytes.Clone(rows) // the tensor may be overwritten below or reused
		for tok, sl := range s.Slots {
			var row []byte
			if rows != nil {
				row = rows[tok*rb : (tok+1)*rb]
			}
			switch {
			case ks.Deferred && (src.Omitted() || rej(tok)):
				f.want[k][sl] = want{absent: true}
			case ks.Deferred:
				f.want[k][sl] = want{pending: true, tag: f.tag}
			case rej(tok):
				f.want[k][sl] = want{stale: true}
			case src.Omitted():
				f.want[k][sl] = want{absent: true}
			default:
				f.want[k][sl] = want{row: row}
			}
		}
		if ks.Deferred && !src.Omitted() {
			for i, h := range s.Handles {
				for tok := s.TokOff[i]; tok < s.TokOff[i]+s.Count[i]; tok++ {
					if !rej(int(tok)) {
						f.pend[h] = append(f.pend[h], pendRow{k: k, slot: s.Slots[tok], tag: f.tag, row: rows[int(tok)*rb : int(tok+1)*rb]})
					}
				}
			}
		}
		if !src.Owned && rows != nil {
			lent := src.Host
			if lent == nil {
				lent = src.Dev.Host
			}
			for i := range lent {
				lent[i] = 0xEE
			}
		}
	}
	return r, nil
}

// mustSave saves s, failing the test on an error.
func (f *fixture) mustSave(s *Step) *Refs {
	f.t.Helper()
	r, err := f.save(s)
	require.NoError(f.t, err, "Save")
	return r
}

// land records in the oracle that h's pending deferred rows are written
// (those no newer step claimed since).
func (f *fixture) land(h soa.Handle) {
	for _, pr := range f.pend[h] {
		if w := f.want[pr.k][pr.slot]; w.pending && w.tag == pr.tag {
			f.want[pr.k][pr.slot] = want{row: pr.row}
		}
	}
	delete(f.pend, h)
}

// finish finishes request h: its deferred rows land once handed over
// (FlushFinished) and the committer ran.
func (f *fixture) finish(hs ...soa.Handle) {
	for _, h := range hs {
		f.p.finish(h)
		f.land(h)
	}
}

func (f *fixture) unpin(rs ...*Refs) {
	for _, r := range rs {
		f.p.Unpin(r)
		delete(f.live, r)
	}
}

func (f *fixture) sync() {
	f.t.Helper()
	require.NoError(f.t, f.p.Sync(), "Sync")
}

func (f *fixture) charged() int64 {
	c := f.p.Usage().BudgetCharged
	return c
}

// unconsumed is a Close's quiesce that hands over rs, the refs of steps
// not consumed.
func unconsumed(rs ...*Refs) func() ([]*Refs, error) {
	return func() ([]*Refs, error) { return rs, nil }
}

// close closes the path with the refs still live (unconsumed steps) and
// checks that it freed every page, budget charge, device buffer and owned
// tensor.
func (f *fixture) close() {
	f.t.Helper()
	var refs []*Refs
	for r := range f.live {
		refs = append(refs, r)
	}
	f.closed = true
	require.NoError(f.t, f.p.Close(time.Now().Add(deadlockTimeout), unconsumed(refs...)), "Close")
	require.Zero(f.t, f.p.pages.InUse(), "pages in use after Close")
	require.Zero(f.t, f.charged(), "budget charged after Close")
	dev, host, bad := f.cd.live()
	require.Zero(f.t, dev, "device buffers left after Close")
	require.Zero(f.t, host, "staging allocations left after Close")
	require.Zero(f.t, bad, "frees of memory not (or no longer) allocated")
}

// check compares every slot of every key with the oracle: call it once
// the writes landed (Sync).
func (f *fixture) check() {
	f.t.Helper()
	require.NoError(f.t, f.checkErr())
}

func (f *fixture) checkErr() error {
	p := f.p
	lay := (&p.lay)
	ten := p.ten
	for k, ks := range f.cfg.Keys {
		m := p.mirrors.Get(k)
		got := make([]byte, ks.RowBytes)
		read := func(s int32) []byte {
			clear(got)
			if m != nil {
				m.ReadRow(got, s)
			}
			return got
		}
		for s := int32(0); s < int32(lay.NumSlots); s++ {
			w, ok := f.want[k][s]
			where := fmt.Sprintf("key %s slot %d", ks.Name, s)
			if ks.Deferred {
				st, _ := p.occ[k].Load(s)
				switch {
				case !ok || w.absent:
					if st != soa.Absent {
						return fmt.Errorf("%s: state %d, want absent", where, st)
					}
				case w.pending:
					if st != soa.InTransit {
						return fmt.Errorf("%s: state %d, want in transit", where, st)
					}
				default:
					if st != soa.Committed {
						return fmt.Errorf("%s: state %d, want committed", where, st)
					}
					if !bytes.Equal(read(s), w.row) {
						return fmt.Errorf("%s: row %x, want %x", where, got, w.row)
					}
				}
				continue
			}
			ki := lay.ImmIdx[k]
			switch {
			case !ok:
				if ten.Written(s) {
					return fmt.Errorf("%s: written, want never written", where)
				}
			case w.stale:
				if !ten.Stale(s) {
					return fmt.Errorf("%s: not stale, want stale (rejected)", where)
				}
			default:
				if !ten.Written(s) || ten.Stale(s) {
					return fmt.Errorf("%s: written %v stale %v, want written", where, ten.Written(s), ten.Stale(s))
				}
				if ten.Absent(ki, s) != w.absent {
					return fmt.Errorf("%s: absent %v, want %v", where, ten.Absent(ki, s), w.absent)
				}
				if !w.absent && !bytes.Equal(read(s), w.row) {
					return fmt.Errorf("%s: row %x, want %x", where, got, w.row)
				}
			}
		}
	}
	return nil
}

// handedBack reports whether the owned host tensor b was handed back.
func (f *fixture) handedBack(b []byte) bool {
	f.relMu.Lock()
	defer f.relMu.Unlock()
	return f.released[&b[0]]
}

// slotRange is the slots [from, from+n).
func slotRange(from, n int32) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = from + int32(i)
	}
	return s
}
