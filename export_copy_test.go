package omnicache

// SetSplitBytes sets the smallest copy split across the copy workers for
// caches made afterwards (0: the default) and returns a func that restores
// it. Tests only: it forces the split path on small steps.
func SetSplitBytes(n int) (restore func()) {
	old := splitBytes
	splitBytes = n
	return func() { splitBytes = old }
}

// CopySplits is the number of copies c split across its copy workers.
func CopySplits(c *Cache) int64 { return c.path.Committer().Workers().Splits() }
