package tier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stallBackend hangs every call until its context ends while stalled (a
// stopped server), counting the calls that reached it.
type stallBackend struct {
	Backend
	stalled atomic.Bool
	calls   atomic.Int64 // calls but the probe's
	probe   string       // the probe's key
}

func (s *stallBackend) wait(ctx context.Context, keys []string) []error {
	n := len(keys)
	if keys[0] != s.probe {
		s.calls.Add(1)
	}
	if !s.stalled.Load() {
		return nil
	}
	<-ctx.Done()
	errs := make([]error, n)
	for i := range errs {
		errs[i] = fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	}
	return errs
}

func (s *stallBackend) Get(ctx context.Context, keys []string) ([][]byte, []error) {
	if errs := s.wait(ctx, keys); errs != nil {
		return make([][]byte, len(keys)), errs
	}
	return s.Backend.Get(ctx, keys)
}

func (s *stallBackend) Set(ctx context.Context, keys []string, vals [][]byte) []error {
	if errs := s.wait(ctx, keys); errs != nil {
		return errs
	}
	return s.Backend.Set(ctx, keys, vals)
}

func (s *stallBackend) Exists(ctx context.Context, keys []string) ([]bool, []error) {
	if errs := s.wait(ctx, keys); errs != nil {
		return make([]bool, len(keys)), errs
	}
	return s.Backend.Exists(ctx, keys)
}

// syncBuffer is a log destination safe for the probe goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A batch that runs out of its time opens the circuit: later Get, Lookup
// and Put fail with ErrCircuitOpen without reaching the backend, a line
// is logged; once the backend answers again a probe closes the circuit
// and calls reach it again, served exactly.
func TestCircuitBreaker(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(0)
	sb := &stallBackend{Backend: e}
	var logs syncBuffer
	tr, err := New(sb, testNS, Options{Timeout: 20 * time.Millisecond, ProbeInterval: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	sb.probe = tr.Addr(0, 0)
	hs := hashes(0, 2)
	if _, err := tr.Put(ctx, []Block{block(testNS, hs[0]), block(testNS, hs[1])}); err != nil {
		t.Fatal(err)
	}
	sb.stalled.Store(true)
	if errs := tr.Get(ctx, hs, dstFor(tr, 2)); !errors.Is(errs[0], ErrUnavailable) || errors.Is(errs[0], ErrCircuitOpen) {
		t.Fatalf("the batch that times out: %v; want ErrUnavailable from the backend", errs[0])
	}
	if !tr.CircuitOpen() {
		t.Fatal("a timed-out batch left the circuit closed")
	}
	select {
	case <-tr.CircuitOpened():
	default:
		t.Fatal("CircuitOpened not closed while the circuit is open")
	}
	// The backend stays stalled (the probe's calls time out) while the
	// fast failures are checked.
	before := sb.calls.Load()
	errs := tr.Get(ctx, hs, dstFor(tr, 2))
	_, lerr := tr.Lookup(ctx, hs)
	_, perr := tr.Put(ctx, []Block{block(testNS, hs[0])})
	for what, err := range map[string]error{"Get": errs[0], "Lookup": lerr, "Put": perr} {
		if !errors.Is(err, ErrCircuitOpen) || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s while open: %v; want ErrCircuitOpen (ErrUnavailable)", what, err)
		}
	}
	if n := sb.calls.Load() - before; n != 0 {
		t.Fatalf("%d calls reached the backend while the circuit was open; want only probes", n)
	}
	st := tr.Stats()
	if st.CircuitOpens != 1 || !st.CircuitOpen {
		t.Fatalf("stats %+v: want 1 open, open now", st)
	}
	sb.stalled.Store(false)
	deadline := time.Now().Add(10 * time.Second) // a hang detector, not a speed
	for tr.CircuitOpen() {
		if time.Now().After(deadline) {
			t.Fatal("the circuit stayed open 10s after the backend answered again")
		}
		time.Sleep(time.Millisecond)
	}
	dst := dstFor(tr, 2)
	errs = tr.Get(ctx, hs, dst)
	if n := checkServed(t, tr, hs, dst, errs); n != 2 {
		t.Fatalf("after recovery %d of 2 blocks served: %v", n, errs)
	}
	out := logs.String()
	for _, want := range []string{"failing tier calls fast", "answers again"} {
		if !bytes.Contains([]byte(out), []byte(want)) {
			t.Fatalf("log %q lacks %q", out, want)
		}
	}
}

// A caller's own cancellation does not open the circuit: only deadlines.
func TestCircuitIgnoresCancel(t *testing.T) {
	e, _ := NewEmbedded(0)
	sb := &stallBackend{Backend: e}
	tr, _ := New(sb, testNS, Options{Timeout: time.Minute})
	defer tr.Close()
	sb.stalled.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tr.Get(ctx, hashes(0, 1), dstFor(tr, 1))
	if tr.CircuitOpen() {
		t.Fatal("a cancelled call opened the circuit")
	}
}
