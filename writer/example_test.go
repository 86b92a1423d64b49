package writer_test

import (
	"fmt"

	"github.com/omnicache/omnicache/writer"
)

// A step of three tokens with one 4-byte key, written to slots 5, 6 and 7,
// then read back once it landed.
func Example() {
	w, err := writer.New(writer.Config{NumBlocks: 4, BlockSize: 4, RowBytes: []int{4}})
	if err != nil {
		panic(err)
	}
	defer w.Close()
	rows := []byte("aaaabbbbcccc")
	if err := w.Write([]int32{5, 6, 7}, [][]byte{rows}, nil); err != nil {
		panic(err)
	}
	clear(rows) // staged: the caller's memory is free again
	if err := w.Sync(); err != nil {
		panic(err)
	}
	got := make([]byte, 8)
	if err := w.Read(0, []int32{7, 5}, got); err != nil {
		panic(err)
	}
	fmt.Printf("%s\n", got)
	// Output: ccccaaaa
}
