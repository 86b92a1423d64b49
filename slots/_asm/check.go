// The request check pass (check<ISA>), generated before every map kernel.

package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// genCheck emits check<ISA>: the request pass described in the package doc.
// Whole vectors are loaded plainly, the last partial one with a mask; lanes
// past n read as zeros, which pass every test unless the table has no rows,
// and then the real requests fail anyway. The tests are arithmetic where
// they can be (a lane is bad when the sign bit of row | (nrows-1-row) |
// start | count is set), keeping port 5 free of mask compares and shuffles.
func genCheck(v isa) {
	TEXT("check"+v.name, NOSPLIT, "func(rows, start, count *int32, n, nrows, positions int) int")
	Doc(
		"check"+v.name+" validates n requests (n > 0) against a table of nrows rows",
		"whose rows hold positions positions each, and returns their token total,",
		"or -1 if a request is bad.",
	)
	rows := param("rows")
	start := param("start")
	count := param("count")
	n := param("n")
	rowMax, positions := param("nrows"), param("positions")
	DECQ(rowMax)
	vRowMax, vPos := v.broadcast(rowMax), v.broadcast(positions)
	zero, acc, sum := v.zero(), v.zero(), v.zero()
	Comment("low32: 0x00000000ffffffff in every 64-bit lane")
	low32 := v.vec()
	if v.lanes == 16 {
		VPTERNLOGD(U8(0xff), low32, low32, low32)
	} else {
		VPCMPEQD(low32, low32, low32)
	}
	VPSRLQ(U8(32), low32, low32)
	var kbad Op
	if v.lanes == 16 {
		kbad = K()
		KXORW(kbad, kbad, kbad)
	}
	var iota8 VecVirtual
	if v.lanes == 8 {
		iota8 = v.iota()
	}

	body := func(r, s, c VecVirtual) {
		Comment("bad if the sign of row | (nrows-1-row) | start | count is set")
		t := v.vec()
		VPSUBD(r, vRowMax, t)
		if v.lanes == 16 {
			VPTERNLOGD(U8(0xfe), r, t, acc)
			VPTERNLOGD(U8(0xfe), s, c, acc)
		} else {
			VPOR(r, t, t)
			VPOR(s, t, t)
			VPOR(c, t, t)
			VPOR(t, acc, acc)
		}
		Comment("bad if count > 0 and positions-start < count")
		room := v.vec()
		VPSUBD(s, vPos, room)
		if v.lanes == 16 {
			kc := K()
			VPTESTMD(c, c, kc)
			VPCMPD(U8(1), c, room, kc, kc)
			KORW(kc, kbad, kbad)
		} else {
			col, cz := YMM(), YMM()
			VPCMPGTD(room, c, col)
			VPCMPEQD(zero, c, cz)
			VPANDN(col, cz, col)
			VPOR(col, acc, acc)
		}
		Comment("sum the counts in 64-bit lanes: even lanes, then odd lanes")
		lo, hi := v.vec(), v.vec()
		if v.lanes == 16 {
			VPANDQ(low32, c, lo)
		} else {
			VPAND(low32, c, lo)
		}
		VPSRLQ(U8(32), c, hi)
		VPADDQ(lo, sum, sum)
		VPADDQ(hi, sum, sum)
	}

	i := GP64()
	XORQ(i, i)
	loop, tail, done, bad := label("loop"), label("tail"), label("done"), label("bad")
	rem := GP64()
	Label(loop)
	MOVQ(n, rem)
	SUBQ(i, rem)
	CMPQ(rem, U8(v.lanes))
	JB(LabelRef(tail))
	r, st, c := v.vec(), v.vec(), v.vec()
	if v.lanes == 16 {
		VMOVDQU32(at(rows, i), r)
		VMOVDQU32(at(start, i), st)
		VMOVDQU32(at(count, i), c)
	} else {
		VMOVDQU(at(rows, i), r)
		VMOVDQU(at(start, i), st)
		VMOVDQU(at(count, i), c)
	}
	body(r, st, c)
	ADDQ(U8(v.lanes), i)
	JMP(LabelRef(loop))

	Label(tail)
	TESTQ(rem, rem)
	JZ(LabelRef(done))
	r2, st2, c2 := v.vec(), v.vec(), v.vec()
	if v.lanes == 16 {
		valid := kmask(rem)
		VMOVDQU32_Z(at(rows, i), valid, r2)
		VMOVDQU32_Z(at(start, i), valid, st2)
		VMOVDQU32_Z(at(count, i), valid, c2)
	} else {
		valid := ymask(rem, iota8)
		VPMASKMOVD(at(rows, i), valid, r2)
		VPMASKMOVD(at(start, i), valid, st2)
		VPMASKMOVD(at(count, i), valid, c2)
	}
	body(r2, st2, c2)

	Label(done)
	if v.lanes == 16 {
		kneg := K()
		VPCMPD(U8(1), zero, acc, kneg)
		KORTESTW(kneg, kbad)
		JNZ(LabelRef(bad))
		h := YMM()
		VEXTRACTI64X4(U8(1), sum, h)
		VPADDQ(h, sum.AsY(), sum.AsY())
	} else {
		m := GP32()
		VMOVMSKPS(acc, m)
		TESTL(m, m)
		JNZ(LabelRef(bad))
	}
	x := XMM()
	VEXTRACTI128(U8(1), sum.AsY(), x)
	VPADDQ(x, sum.AsX(), x)
	x2 := XMM()
	VPSHUFD(U8(0x4e), x, x2)
	VPADDQ(x2, x, x)
	total := GP64()
	VMOVQ(x, total)
	Store(total, ReturnIndex(0))
	VZEROUPPER()
	RET()

	Label(bad)
	m1 := GP64()
	MOVQ(I32(-1), m1)
	Store(m1, ReturnIndex(0))
	VZEROUPPER()
	RET()
}
