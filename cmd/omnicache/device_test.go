package main

import (
	"strings"
	"testing"
	"time"
)

func TestReplayDeviceFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--device", "tpu"}, "--device"},
		{[]string{"--device", "cuda:x"}, "--device"},
		{[]string{"--device", "cuda:-1"}, "--device"},
		{[]string{"--hold", "sometimes"}, "--hold"},
		{[]string{"--hold", "-5ms"}, "--hold"},
		{[]string{"--hold", "0s"}, "--hold"},
	} {
		oneLine(t, 2, c.args, c.flag)
	}
	if !cudaCompiled {
		// Said at once, before anything runs, with exit status 2.
		for _, d := range []string{"cuda", "cuda:1"} {
			oneLine(t, 2, []string{"--device", d, "--workloads", "DEC100_c32$"},
				"built without the cuda tag: CUDA is not compiled in; build with make gpu-replay")
		}
	}
}

func TestParseDeviceAndHold(t *testing.T) {
	for s, want := range map[string]deviceSpec{"host": {}, "cuda": {cuda: true}, "cuda:3": {cuda: true, ordinal: 3}} {
		if got, err := parseDevice(s); err != nil || got != want {
			t.Errorf("parseDevice(%q) = %+v, %v; want %+v", s, got, err, want)
		}
	}
	cuda := deviceSpec{cuda: true}
	for _, c := range []struct {
		s    string
		dev  deviceSpec
		want holdSpec
	}{
		{"auto", deviceSpec{}, holdSpec{}},
		{"auto", cuda, holdSpec{on: true, max: defaultCUDAHoldMax}},
		{"off", cuda, holdSpec{}},
		{"model", deviceSpec{}, holdSpec{on: true}},
		{"2ms", deviceSpec{}, holdSpec{on: true, max: 2 * time.Millisecond}},
	} {
		if got, err := parseHold(c.s, c.dev); err != nil || got != c.want {
			t.Errorf("parseHold(%q, %v) = %+v, %v; want %+v", c.s, c.dev, got, err, c.want)
		}
	}
}

// TestReplayHoldOnHost: --hold on the host device holds every forward and
// says so.
func TestReplayHoldOnHost(t *testing.T) {
	code, out, errs := run(t, "--workloads", "MiniCPM-o/DEC100_c32$", "--cache", "on", "--repeat", "1", "--hold", "20us", "--progress", "off")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "device: host; forward held: the model step time, at most 20µs") {
		t.Fatalf("summary:\n%s", out)
	}
}
