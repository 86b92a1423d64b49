package gpu_test

import (
	"fmt"
	"log"

	"github.com/omnicache/omnicache/gpu"
)

// A round trip through the host device: rows go host→device, then a span
// of them device→host into staging memory, and a recorded event says when
// the copies are done (at once on the host device; on CUDA, Wait blocks
// until the stream reaches it).
func ExampleNewHost() {
	d := gpu.NewHost()
	defer d.Close()

	buf, err := d.Alloc(8) // device memory: two rows of 4 bytes
	if err != nil {
		log.Fatal(err)
	}
	defer d.Free(buf)
	if err := d.CopyHtoD(buf, 0, []byte("row0row1")); err != nil {
		log.Fatal(err)
	}

	stage, err := d.AllocHost(4) // staging memory (pinned on CUDA)
	if err != nil {
		log.Fatal(err)
	}
	defer d.FreeHost(stage)
	if err := d.CopyDtoH(stage, buf, 4); err != nil { // the second row
		log.Fatal(err)
	}
	ev, err := d.Record()
	if err != nil {
		log.Fatal(err)
	}
	if err := d.Wait(ev); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %s\n", d.Name(), stage)
	// Output: host: row1
}
