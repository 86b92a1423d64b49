package mirror_test

import (
	"fmt"
	"log"

	"github.com/omnicache/omnicache/mirror"
)

// The mirror of one key, a row of 4 bytes per KV slot: a step's rows are
// scattered to their slots, then a hit's slots gathered back. A slot never
// written reads as zeros, and only the chunk written to is allocated.
func Example() {
	m, err := mirror.New(1024, 4)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Free()

	m.Write([]int32{17, 3}, []byte("abcdwxyz")) // the committer's scatter

	dst := make([]byte, 3*m.RowBytes())
	m.Read(dst, []int32{3, 17, 500}) // a reader's gather: slot 500 was never written
	fmt.Printf("%q\n", dst)
	fmt.Println("resident bytes:", m.ResidentBytes())
	// Output:
	// "wxyzabcd\x00\x00\x00\x00"
	// resident bytes: 4096
}
