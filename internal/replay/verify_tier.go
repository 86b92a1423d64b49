package replay

import "github.com/omnicache/omnicache/internal/replay/sim"

// eachTierBlock calls f for every block of the step's arrivals that the
// cache imports from the tier: the request, its id, the local block and the
// block's index among the request's blocks.
func eachTierBlock(st *sim.Step, bs int, f func(r *sim.Req, id int64, block int32, idx int)) {
	p := &st.Plan
	if len(p.TierBlocks) == 0 {
		return
	}
	used := 0
	for i, id := range p.Arrivals {
		nb := int(p.HitTokens[i]) / bs
		hit := p.HitBlocks[used : used+nb]
		used += nb
		ext := int(p.TierBlocks[i])
		if ext == 0 {
			continue
		}
		var r *sim.Req
		for j, q := range st.Reqs {
			if p.IDs[j] == id {
				r = q
				break
			}
		}
		for j := nb - ext; j < nb; j++ {
			f(r, id, hit[j], j)
		}
	}
}

// imported records the rows the step's tier imports put into the mirror
// (the cache writes them ahead of the step's own rows).
func (v *verifier) imported(st *sim.Step) {
	eachTierBlock(st, v.bs, func(r *sim.Req, id int64, block int32, idx int) {
		for t := 0; t < v.bs; t++ {
			pos := idx*v.bs + t
			slot := int(block)*v.bs + t
			v.slotH[slot], v.slotReq[slot], v.slotPos[slot], v.set[slot] = r.H[pos], id, int32(pos), true
		}
	})
}

// forget stops verifying the slots of request id's tier blocks in the step
// (its import failed: the cache refuses to serve them, whatever they hold)
// and returns how many blocks it imported. A nil verifier only counts.
func (v *verifier) forget(st *sim.Step, bs int, id int64) int {
	n := 0
	eachTierBlock(st, bs, func(_ *sim.Req, rid int64, block int32, _ int) {
		if rid != id {
			return
		}
		n++
		if v != nil {
			for t := 0; t < bs; t++ {
				v.set[int(block)*bs+t] = false
			}
		}
	})
	return n
}
