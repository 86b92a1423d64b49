package metrics_test

import (
	"fmt"
	"log"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/metrics"
)

// A Collector over a cache, registered in a Prometheus registry: every
// gather (a scrape) reads the cache's Stats once. The cache counts the
// hit tokens; the engine counts its prefix-cache queries in a
// QueryCounter; the hit rate is the one over the other.
func Example() {
	c, err := omnicache.New(omnicache.Config{
		NumBlocks: 16, BlockSize: 4,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: 8}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var queries metrics.QueryCounter
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.New(c, metrics.Options{Queries: &queries}))

	queries.AddQueries(96) // a prompt of 96 tokens arrives (before its step's Begin)

	fams, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range fams { // sorted by name
		switch f.GetName() {
		case "omnicache_prefix_cache_hits_total", "omnicache_prefix_cache_queries_total":
			fmt.Println(f.GetName(), f.GetMetric()[0].GetCounter().GetValue())
		}
	}
	// Output:
	// omnicache_prefix_cache_hits_total 0
	// omnicache_prefix_cache_queries_total 96
}
