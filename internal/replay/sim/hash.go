package sim

// SplitMix64 is the splitmix64 finalizer: a bijection on uint64 with full
// avalanche. It drives the token hashes, the sampled tokens and the --verify
// oracle rows.
func SplitMix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// RootHash is the rolling hash of the empty prefix.
const RootHash uint64 = 0x6f6d6e6963616368 // "omnicach"

// Mix extends a rolling prefix hash by one token: h[p] = Mix(h[p-1], t[p]).
// For a fixed token it is a bijection of h, so two different prefixes of the
// same length collide only by a 64-bit accident.
func Mix(h uint64, token int32) uint64 {
	return SplitMix64(h*0x100000001b3 ^ uint64(uint32(token)))
}

// BlockHash is the chained hash of a full KV block: the rolling hash of the
// parent block's end extended by the block's tokens. It equals the rolling
// hash of the whole prefix at the block's last token, so equal hashes mean
// equal prefixes (up to a 64-bit accident) and a block's hash fixes every row
// the oracle expects in it.
func BlockHash(parent uint64, tokens []int32) uint64 {
	h := parent
	for _, t := range tokens {
		h = Mix(h, t)
	}
	return h
}
