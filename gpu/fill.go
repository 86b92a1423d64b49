package gpu

// Filler is implemented by devices that can set device memory to a byte
// value (a memset), ordered on the device's stream like its copies. Engines
// and the replay use it to produce a step's outputs on the device without a
// host→device copy; the cache itself does not need it, so it is an optional
// interface rather than a Device method.
type Filler interface {
	// Fill sets bytes [off, off+n) of b to v, asynchronously on the stream
	// (the host device completes it before returning).
	Fill(b Buffer, off, n int, v byte) error
}

// Fill sets bytes [off, off+n) of b to v.
func (*Host) Fill(b Buffer, off, n int, v byte) error {
	if err := span(b, off, n); err != nil {
		return err
	}
	s := b.Host[off : off+n]
	if v == 0 {
		clear(s)
		return nil
	}
	for i := range s {
		s[i] = v
	}
	return nil
}
