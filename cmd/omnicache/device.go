package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/replay"
)

// defaultCUDAHoldMax is --hold auto's cap on the held forward with
// --device cuda: longer than any step's device→host copy (a full 8192-token
// Qwen3-Omni step, 96 MiB, takes about 2 ms at PCIe 5 speed), so a step's
// copies overlap the next forward as in an engine, without running the
// table for its modelled hours.
const defaultCUDAHoldMax = 5 * time.Millisecond

// deviceSpec is a parsed --device: "host", or "cuda" with an ordinal.
type deviceSpec struct {
	cuda    bool
	ordinal int
}

func (d deviceSpec) String() string {
	if d.cuda {
		return fmt.Sprintf("cuda:%d", d.ordinal)
	}
	return "host"
}

// parseDevice parses --device: host, cuda or cuda:N.
func parseDevice(s string) (deviceSpec, error) {
	switch {
	case s == "host":
		return deviceSpec{}, nil
	case s == "cuda":
		return deviceSpec{cuda: true}, nil
	case strings.HasPrefix(s, "cuda:"):
		n, err := strconv.Atoi(s[len("cuda:"):])
		if err != nil || n < 0 || n > 1024 {
			return deviceSpec{}, fmt.Errorf("--device %q: want cuda:N with N an ordinal 0..1024", s)
		}
		return deviceSpec{cuda: true, ordinal: n}, nil
	}
	return deviceSpec{}, fmt.Errorf("--device %q: want host, cuda or cuda:N", s)
}

// holdSpec is a parsed --hold: whether the forward is held, and its cap
// (0: the whole model step time).
type holdSpec struct {
	on   bool
	max  time.Duration
	spin bool // --hold-wait spin
}

func (h holdSpec) String() string {
	wait := " (sleeping)"
	if h.spin {
		wait = " (spinning)"
	}
	switch {
	case !h.on:
		return "off"
	case h.max == 0:
		return "the model step time" + wait
	}
	return "the model step time, at most " + h.max.String() + wait
}

// parseHold parses --hold: auto (off on the host device, capped at
// defaultCUDAHoldMax on cuda), off, model (the whole model step time) or a
// positive duration (the model step time, capped).
func parseHold(s string, dev deviceSpec) (holdSpec, error) {
	switch s {
	case "auto":
		if dev.cuda {
			return holdSpec{on: true, max: defaultCUDAHoldMax}, nil
		}
		return holdSpec{}, nil
	case "off":
		return holdSpec{}, nil
	case "model":
		return holdSpec{on: true}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > maxStepTime {
		return holdSpec{}, fmt.Errorf("--hold %q: want auto, off, model or a duration in (0, %v]", s, maxStepTime)
	}
	return holdSpec{on: true, max: d}, nil
}

// errNoCUDA is --device cuda in a binary built without the cuda tag (exit
// status 2, before anything runs).
var errNoCUDA = errors.New("omnicache was built without the cuda tag: CUDA is not compiled in; build with make gpu-replay")

// errDevice marks a device that could not be opened.
var errDevice = errors.New("device")

// openDevice opens the device of --device and sets the options that go
// with it: the cache's device, outputs in its memory unless it is the host
// device, and the hold. The caller closes the device (nil for host).
func openDevice(dev deviceSpec, hold holdSpec, opt *replay.Options) (gpu.Device, error) {
	opt.Hold, opt.HoldMax, opt.HoldSpin = hold.on, hold.max, hold.spin
	if !dev.cuda {
		return nil, nil
	}
	d, err := openCUDA(dev.ordinal)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", errDevice, dev, err)
	}
	opt.Device, opt.DeviceOutputs = d, true
	return d, nil
}

// deviceNote describes an opened device for the summary ("" for host).
func deviceNote(d gpu.Device) string {
	if m, ok := d.(interface{ AllocMode() string }); ok {
		return " (device memory from " + m.AllocMode() + ")"
	}
	return ""
}
