// Package bench holds the data the engine replay and the benchmarks read
// (testdata/: the Mooncake-format traces). It exports nothing.
//
// The replay itself is `omnicache replay` (cmd/omnicache); its machinery is
// internal (internal/replay). The benchmarks sit beside the code they
// measure: `make bench` runs them, `make replay` runs the main job.
package bench
