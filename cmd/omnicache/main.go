// Command omnicache runs the project's main job.
//
//	omnicache replay [flags]   replay workloads through the engine simulator
//	                           and the cache (cache off vs on); see -h
//	omnicache fit              fit the step-cost model to the reference's
//	                           cache-off throughputs; see -h
package main

import (
	"fmt"
	"os"
)

const usage = `usage: omnicache <command> [flags]

commands:
  replay   replay the reference workloads (or a trace) through the engine
           simulator with the cache off and on, and report the cost
           (omnicache replay -h for its flags)
  fit      fit the step-cost model of the projection to the reference's
           cache-off throughputs and print it (omnicache fit -h)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "replay":
		os.Exit(replayMain(os.Args[2:], os.Stdout, os.Stderr))
	case "fit":
		os.Exit(fitMain(os.Args[2:], os.Stdout, os.Stderr))
	case busyCommand: // replay --busy's children
		os.Exit(busyMain())
	case "help", "-h", "-help", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "omnicache: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
}
