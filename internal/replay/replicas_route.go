// The replay with replicas' router, shared KV store and table.

package replay

import (
	"container/list"
	"fmt"
	"math"
	"strings"

	"github.com/omnicache/omnicache/internal/replay/sim"
)

// sharedKV is the simulated shared KV store: the chained hashes of the
// blocks any replica computed, least recently stored or loaded out first
// past its capacity (as an LRU store: LMCache, Mooncake).
type sharedKV struct {
	cap int
	idx map[uint64]*list.Element
	lru *list.List // front: most recent; values are uint64 hashes
}

func newSharedKV(capBlocks int) *sharedKV {
	return &sharedKV{cap: capBlocks, idx: make(map[uint64]*list.Element, capBlocks), lru: list.New()}
}

// add stores blocks (a replica computed them).
func (kv *sharedKV) add(hashes []uint64) {
	for _, h := range hashes {
		if el, ok := kv.idx[h]; ok {
			kv.lru.MoveToFront(el)
			continue
		}
		if kv.lru.Len() >= kv.cap {
			old := kv.lru.Back()
			delete(kv.idx, old.Value.(uint64))
			kv.lru.Remove(old)
		}
		kv.idx[h] = kv.lru.PushFront(h)
	}
}

// leading is how many leading blocks of hashes the store holds.
func (kv *sharedKV) leading(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := kv.idx[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// touch marks blocks loaded (most recently used).
func (kv *sharedKV) touch(hashes []uint64) {
	for _, h := range hashes {
		if el, ok := kv.idx[h]; ok {
			kv.lru.MoveToFront(el)
		}
	}
}

// router hands a shared source's requests to the replicas' sources: round
// robin, or by session (the hash of the prompt's first block).
type router struct {
	src   sim.Source
	n     int
	route string
	bs    int
	k     int
	queue [][]sim.Request
	done  bool
	err   error
}

func newRouter(src sim.Source, n int, route string, bs int) *router {
	return &router{src: src, n: n, route: route, bs: bs, queue: make([][]sim.Request, n)}
}

func (rt *router) source(i int) sim.Source { return routed{rt, i} }

type routed struct {
	rt *router
	i  int
}

// Next pulls from the shared source until a request for replica i comes
// (the others wait in their replicas' queues).
func (s routed) Next() (sim.Request, bool, error) {
	rt := s.rt
	for len(rt.queue[s.i]) == 0 {
		if rt.done {
			return sim.Request{}, false, rt.err
		}
		q, ok, err := rt.src.Next()
		if err != nil || !ok {
			rt.done, rt.err = true, err
			continue
		}
		to := rt.k % rt.n
		if rt.route == RouteSession {
			h := sim.RootHash
			for _, t := range q.Prompt[:min(len(q.Prompt), rt.bs)] {
				h = sim.Mix(h, t)
			}
			to = int(h % uint64(rt.n))
		}
		rt.k++
		rt.queue[to] = append(rt.queue[to], q)
	}
	q := rt.queue[s.i][0]
	rt.queue[s.i] = rt.queue[s.i][1:]
	return q, true, nil
}

// WriteReplicaTable writes the per-replica and total lines of reps.
func WriteReplicaTable(w interface{ Write([]byte) (int, error) }, reps []*ReplicasReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%-22s %-9s %-28s %8s %8s %10s %10s %9s %9s %9s %10s %10s %10s %15s %8s\n", "workload", "replica", "tier",
		"hit", "local", "local tok", "tier tok", "publ", "impt", "imp p50", "imp p99", "eng/step", "mat/step", "steps/s p50/min", "verify")
	for _, r := range reps {
		line := func(name string, x ReplicaReport) {
			fmt.Fprintf(&b, "%-22s %-9s %-28s %8s %8s %10d %10d %9s %9s %9s %10s %10s %10s %15s %8s\n", shortName(r.Name), name, shortTier(r.Tier),
				pct(x.HitRate, 1), pct(float64(x.LocalHitTokens)/math.Max(1, float64(x.QueriedTokens)), 1),
				x.LocalHitTokens, x.TierHitTokens, shortBytes(x.TierBytesPublished), shortBytes(x.TierBytesImported),
				dur(float64(x.ImportP50Ns)), dur(float64(x.ImportP99Ns)), dur(x.EngineNsPerStep),
				dur(float64(x.MaterializeNs)/math.Max(1, float64(x.Steps))),
				fmt.Sprintf("%.0f/%.0f", x.StepsPerSecP50, x.StepsPerSecMin), verifyCol(r.Verify, x.VerifyFailures))
		}
		for _, pr := range r.PerReplica {
			line(fmt.Sprint(pr.Replica), pr)
		}
		line(fmt.Sprintf("all %d", r.Replicas), r.ReplicaReport)
		fmt.Fprintf(&b, "%-22s one engine with the whole pool: hit %s; these %d replicas without a tier: hit %s\n",
			"", pct(r.SingleHitRate, 1), r.Replicas, pct(r.LocalOnlyHitRate, 1))
		if r.TierBoundBytes > 0 || r.AdmitAfter > 1 {
			policy := r.TierPolicy
			if policy == "" {
				policy = "the server's"
			}
			fmt.Fprintf(&b, "%-22s tier: policy %s, admit after %d sightings: holds %s of %s, %d values evicted, %d blocks not admitted\n",
				"", policy, max(1, r.AdmitAfter), shortBytes(r.TierStoredBytes), shortBytes(r.TierBoundBytes), r.TierEvicted, r.TierPublishUnadmitted)
		}
		if r.Note != "" {
			fmt.Fprintf(&b, "%-22s note: %s\n", "", r.Note)
		}
	}
	_, err := w.Write([]byte(b.String()))
	return err
}

func shortTier(s string) string {
	if len(s) > 28 {
		return s[:25] + "..."
	}
	return s
}

func verifyCol(on bool, failures int64) string {
	if !on {
		return "-"
	}
	if failures == 0 {
		return "ok"
	}
	return fmt.Sprint(failures)
}
