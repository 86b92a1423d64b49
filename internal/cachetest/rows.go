package cachetest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
)

// Tag names one row: key, request, position and content version. 0 means
// "absent" (never written, or omitted): such rows read as zeros.
type Tag uint64

// RejectedVer is the content version of a rejected draft's rows.
const RejectedVer = 0xfe

// MkTag is the tag of key k's row at position pos of request id, content
// version ver.
func MkTag(k int, id int64, pos, ver int) Tag {
	return Tag(uint64(k+1)<<60 | uint64(ver&0xff)<<52 | uint64(id&0xfffffff)<<24 | uint64(pos&0xffffff))
}

// String names the row: "k0/req2/pos5/v0", or "zeros".
func (g Tag) String() string {
	if g == 0 {
		return "zeros"
	}
	return fmt.Sprintf("k%d/req%d/pos%d/v%d", int(g>>60)-1, int64(g>>24&0xfffffff), int(g&0xffffff), int(g>>52&0xff))
}

func splitmix64(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// FillRow writes the content of row g into dst (zeros for g == 0).
func FillRow(dst []byte, g Tag) {
	if g == 0 {
		clear(dst)
		return
	}
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], uint64(g))
	n := copy(dst, w[:])
	s := uint64(g)
	for n < len(dst) {
		binary.LittleEndian.PutUint64(w[:], splitmix64(&s))
		n += copy(dst[n:], w[:])
	}
}

// RowOf returns the content of row g, rowBytes long.
func RowOf(g Tag, rowBytes int) []byte {
	b := make([]byte, rowBytes)
	FillRow(b, g)
	return b
}

// Describe names what a row holds, for failure messages: its tag, "zeros",
// or "garbage[...]".
func Describe(b []byte) string {
	zero := true
	for _, x := range b {
		if x != 0 {
			zero = false
			break
		}
	}
	if zero {
		return "zeros"
	}
	if len(b) >= 8 {
		g := Tag(binary.LittleEndian.Uint64(b))
		if bytes.Equal(RowOf(g, len(b)), b) {
			return g.String()
		}
	}
	n := min(len(b), 8)
	return fmt.Sprintf("garbage[% x...]", b[:n])
}

// Tags are key k's tags of request id's n rows from position pos0, content
// version ver.
func Tags(k int, id int64, pos0, n, ver int) []Tag {
	out := make([]Tag, n)
	for j := range out {
		out[j] = MkTag(k, id, pos0+j, ver)
	}
	return out
}

// Zeros are n absent rows.
func Zeros(n int) []Tag { return make([]Tag, n) }

// WantRows checks result i's rows of key k (rb bytes each) against tags
// (0: zeros), row by row: an explicit check next to the harness's model.
func WantRows(t testing.TB, res *omnicache.Result, i, k, rb int, tags ...Tag) {
	t.Helper()
	rows := res.Rows(i, k)
	require.Len(t, rows, len(tags)*rb, "request %d key %d: bytes", res.ID(i), k)
	for j, g := range tags {
		got := rows[j*rb : (j+1)*rb]
		require.True(t, bytes.Equal(got, RowOf(g, rb)), "request %d key %d row %d: got %s, want %s", res.ID(i), k, j, Describe(got), g)
	}
}

// EmptyOutputs are the outputs of a step of no tokens, every one of nkeys
// keys present.
func EmptyOutputs(nkeys int) *omnicache.Outputs {
	o := &omnicache.Outputs{}
	for range nkeys {
		o.Tensors = append(o.Tensors, omnicache.Tensor{Host: []byte{}})
	}
	return o
}
