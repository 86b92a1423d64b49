package tier

import (
	"fmt"
	"testing"
)

// BenchmarkSeal is the cost of sealing a block's value when it is stored
// and checking it when it is read (what Options.Secret changes), per
// block, for a decode-sized and a wide row.
func BenchmarkSeal(b *testing.B) {
	const addr = "oc:{Qwen/Qwen3-Omni-30B-A3B/0123456789abcdef/b16/0123456789abcdef}:hidden"
	for _, rb := range []int{2048, 8192} {
		for _, kind := range []struct {
			name   string
			secret []byte
		}{{"crc32c", nil}, {"hmac-sha256", []byte("0123456789abcdef0123456789abcdef")}} {
			b.Run(fmt.Sprintf("seal=%s/block=16x%d", kind.name, rb), func(b *testing.B) {
				s := newSealer(kind.secret)
				v := s.encode(nil, addr, 7, 16, rb, make([]byte, 16*rb))
				b.SetBytes(int64(len(v)))
				b.ReportAllocs()
				for b.Loop() {
					s.seal(v)
					if _, err := s.decode(v, addr, 7, 16, rb); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
