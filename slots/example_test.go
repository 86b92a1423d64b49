package slots_test

import (
	"fmt"
	"log"

	"github.com/omnicache/omnicache/slots"
)

// One step of two requests through the engine's block table (4 block ids
// a row, blocks of 4 tokens): the request on row 1 decodes positions 5
// and 6, in its second block (id 4); the one on row 0 prefills positions
// 0 to 2, in its first block (id 7).
func ExampleMap() {
	const blockSize = 4
	b := slots.Batch{
		Rows:  []int32{1, 0},
		Start: []int32{5, 0},
		Count: []int32{2, 3},
		Table: []int32{
			7, 2, 9, 0, // row 0
			3, 4, 0, 0, // row 1
		},
		Stride: 4,
	}
	total, err := slots.Total(b, blockSize) // the length dst needs
	if err != nil {
		log.Fatal(err)
	}
	dst := make([]int32, total)
	n, err := slots.Map(dst, b, blockSize)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(dst[:n])
	// Output: [17 18 28 29 30]
}
