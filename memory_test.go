package omnicache_test

// Host memory the OS refuses (an address-space limit such as ulimit -v):
// New fails with ErrConfig, holding nothing; a mirror chunk refused at run
// time fails the cache with the sticky ErrWriteFailed. Neither is a fatal
// error of the Go runtime.

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/hostmem"
	"github.com/omnicache/omnicache/mirror"
)

// TestNewRefusedMapping: when the OS refuses the per-slot tables' memory,
// New returns ErrConfig naming the refusal, starts no goroutine, and a
// cache of the same config is made once the memory is there.
func TestNewRefusedMapping(t *testing.T) {
	keys := []omnicache.Key{{Name: "h", RowBytes: 16}, {Name: "codes", RowBytes: 8, Deferred: true}, {Name: "x", RowBytes: 4, Optional: true}}
	cfg := omnicache.Config{NumBlocks: 1 << 14, BlockSize: 16, Keys: keys} // 2 MiB per 8-byte slot column
	base := runtime.NumGoroutine()
	for _, from := range []int{hostmem.Threshold, 1 << 21} {
		undo := hostmem.RefuseFrom(from)
		c, err := omnicache.New(cfg)
		undo()
		require.Nil(t, c, "New with the tables refused from %d bytes", from)
		require.ErrorIs(t, err, omnicache.ErrConfig, "New with the tables refused from %d bytes", from)
		require.ErrorIs(t, err, hostmem.ErrNoMemory)
		require.Contains(t, err.Error(), "refused")
		cachetest.WaitGoroutines(t, base)
	}
	c, err := omnicache.New(cfg)
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// TestMirrorRefusedMapping: a mirror chunk the OS refuses while the
// committer writes a step fails the cache with ErrWriteFailed wrapping
// mirror.ErrNoMemory (no row is served from memory that does not exist),
// and Close releases every page and budget byte.
func TestMirrorRefusedMapping(t *testing.T) {
	c, err := omnicache.New(omnicache.Config{NumBlocks: 64, BlockSize: 4, Keys: []omnicache.Key{{Name: "h", RowBytes: 8}}})
	require.NoError(t, err)
	table := make([]int32, 16)
	for i := range table {
		table[i] = int32(i)
	}
	p := &omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{8}, Table: table, Stride: 16,
		Arrivals: []int64{1}, HitTokens: []int32{0}}
	undo := hostmem.RefuseFrom(1) // every mapping: the mirror's chunks; the small staging page comes from make
	defer undo()
	require.NoError(t, c.Begin(p))
	id, err := c.Save(&omnicache.Outputs{Tokens: 8, Tensors: []omnicache.Tensor{{Host: make([]byte, 64), Rows: 8}}})
	require.NoError(t, err)
	err = c.Sync()
	require.ErrorIs(t, err, omnicache.ErrWriteFailed)
	require.ErrorIs(t, err, mirror.ErrNoMemory)
	var res omnicache.Result
	require.ErrorIs(t, c.Materialize(id, nil, &res), omnicache.ErrWriteFailed)
	undo()
	if err := c.Close(); err != nil {
		require.ErrorIs(t, err, omnicache.ErrWriteFailed)
	}
	st := c.Stats()
	require.Zero(t, st.PagesInUse)
	require.Zero(t, st.BudgetCharged)
}

// addressLimitEnv makes the test binary run TestNewUnderAddressLimit's
// child: it lowers its own address-space limit, then calls New.
const addressLimitEnv = "OMNICACHE_TEST_ADDRESS_LIMIT"

// TestNewUnderAddressLimit: in a process whose address space is limited
// (setrlimit(RLIMIT_AS), as ulimit -v sets it) to what it uses plus 256
// MiB, New of a config whose tables need 2 GiB returns ErrConfig, and a
// small one still works. Before, the tables fell back to the Go heap and
// the runtime died with "fatal error: out of memory".
func TestNewUnderAddressLimit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("RLIMIT_AS and /proc/self/status: Linux")
	}
	if os.Getenv(addressLimitEnv) != "" {
		addressLimitChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNewUnderAddressLimit$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), addressLimitEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child under an address-space limit:\n%s", out)
	require.Contains(t, string(out), "New under the limit: ", "the child ran:\n%s", out)
	t.Logf("%s", grepLine(string(out), "New under the limit: "))
}

func addressLimitChild(t *testing.T) {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	vm := grepLine(string(b), "VmSize:") // "VmSize:   123456 kB"
	f := strings.Fields(vm)
	require.Len(t, f, 3, "VmSize line %q", vm)
	kb, err := strconv.ParseUint(f[1], 10, 64)
	require.NoError(t, err)
	lim := kb<<10 + 256<<20
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: lim, Max: lim}))
	keys := []omnicache.Key{{Name: "h", RowBytes: 16}}
	c, err := omnicache.New(omnicache.Config{NumBlocks: 1 << 24, BlockSize: 16, Keys: keys}) // 2 GiB of per-slot table
	if err == nil {
		// Then the first write must fail, not the process.
		p := &omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{1}, Table: []int32{0}, Stride: 1}
		require.NoError(t, c.Begin(p))
		_, err = c.Save(&omnicache.Outputs{Tokens: 1, Tensors: []omnicache.Tensor{{Host: make([]byte, 16), Rows: 1}}})
		if err == nil {
			err = c.Sync()
		}
		c.Close()
		t.Fatalf("New under the limit returned a cache; its first step: %v", err)
	}
	require.Nil(t, c)
	require.ErrorIs(t, err, omnicache.ErrConfig)
	require.True(t, errors.Is(err, syscall.ENOMEM), "the system's error: %v", err)
	t.Logf("New under the limit: %v", err)
	c, err = omnicache.New(omnicache.Config{NumBlocks: 1024, BlockSize: 16, Keys: keys})
	require.NoError(t, err, "a small cache under the limit")
	require.NoError(t, c.Close())
}

// grepLine returns the first line of s holding sub ("" if none).
func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
