// --busy: processes that keep cores busy beside the engine, as a colocated
// stage sharing the machine would.

package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"time"
)

// busyCommand is the hidden command a --busy child runs.
const busyCommand = "busy-child"

// maxBusy bounds --busy.
const maxBusy = 256

// busyMain spins one core until its stdin closes (the parent ended, however
// it ended), then exits.
func busyMain() int {
	runtime.GOMAXPROCS(2)
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	x := uint64(1)
	for {
		for range 1 << 16 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		select {
		case <-done:
			if x == 0 {
				fmt.Println(x) // keep the loop
			}
			return 0
		default:
		}
	}
}

// busyProcs are the running --busy children.
type busyProcs struct {
	cmds []*exec.Cmd
	w    *os.File
}

// startBusy starts n children spinning a core each (this binary's hidden
// busy command). They exit when stop closes their stdin, or when this
// process ends.
func startBusy(n int) (*busyProcs, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b := &busyProcs{w: w}
	for range n {
		c := exec.Command(exe, busyCommand)
		c.Stdin, c.Stdout, c.Stderr = r, nil, os.Stderr
		if err := c.Start(); err != nil {
			b.stop()
			return nil, fmt.Errorf("--busy: %w", err)
		}
		b.cmds = append(b.cmds, c)
	}
	return b, nil
}

// stop ends the children: EOF on their stdin, then, after a second, a kill
// of each one still running (by its own process).
func (b *busyProcs) stop() {
	b.w.Close()
	for _, c := range b.cmds {
		done := make(chan struct{})
		go func() { c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Second):
			c.Process.Kill()
			<-done
		}
	}
	b.cmds = nil
}
