package tier_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/omnicache/omnicache/tier"
)

// An embedded store shared in one namespace: two full blocks of a prompt
// are stored by their chained hashes; Lookup finds how many leading
// blocks of a longer prompt are held, and Get copies their rows back.
func Example() {
	ctx := context.Background()
	store, err := tier.NewEmbedded(16 << 20)
	if err != nil {
		log.Fatal(err)
	}
	ns := tier.Namespace{Model: "example-model", BlockSize: 2, Keys: []tier.Key{{Name: "hidden", RowBytes: 4}}}
	t, err := tier.New(store, ns, tier.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close() // closes the store too

	hashes := []uint64{0xa1, 0xb2, 0xc3} // a prompt's block hashes; only two blocks are stored
	_, err = t.Put(ctx, []tier.Block{
		{Hash: 0xa1, Rows: [][]byte{[]byte("tok0tok1")}},
		{Hash: 0xb2, Rows: [][]byte{[]byte("tok2tok3")}},
	})
	if err != nil {
		log.Fatal(err)
	}

	n, err := t.Lookup(ctx, hashes)
	if err != nil {
		log.Fatal(err)
	}
	dst := [][]byte{make([]byte, t.BlockBytes(0)), make([]byte, t.BlockBytes(0)), make([]byte, t.BlockBytes(0))}
	errs := t.Get(ctx, hashes, dst)
	fmt.Println("held:", n)
	fmt.Printf("%s %s, third block missed: %v\n", dst[0], dst[1], errors.Is(errs[2], tier.ErrMiss))
	// Output:
	// held: 2
	// tok0tok1 tok2tok3, third block missed: true
}
