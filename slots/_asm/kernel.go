// The kernel skeleton shared by the map and expand generators: the
// registers kept across loops and the loops' building blocks.

package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// kernel holds the registers a map or expand kernel keeps across its loops.
type kernel struct {
	v     isa
	div   bool       // bs need not be a power of two
	o     GPVirtual  // next slot to write
	bs    GPVirtual  // block size
	shift GPVirtual  // log2(bs) (power-of-two kernels)
	xbs   VecVirtual // bs in every lane
	iota  VecVirtual // 0, 1, 2, ... lanes-1
	step  VecVirtual // lanes in every lane
	one   VecVirtual // 1 in every lane
	vsh   VecVirtual // shift, as a shift count (power-of-two kernels)
	mask  VecVirtual // bs-1 in every lane (power-of-two kernels)
	rcp   VecVirtual // 1/bs as float64 in every lane (other kernels)
	xrcp  VecVirtual // 1/bs as a scalar float64 (other kernels)
}

func newKernel(v isa, div bool, o, bs GPVirtual) *kernel {
	k := &kernel{v: v, div: div, o: o, bs: bs}
	k.xbs = v.broadcast(bs)
	k.iota = v.iota()
	k.step = v.broadcastImm(uint32(v.lanes))
	return k
}

// decodeSetup loads what the vector decode path needs.
func (k *kernel) decodeSetup() {
	k.one = k.v.broadcastImm(1)
	if k.div {
		k.xrcp = XMM()
		Comment("VMOVSD, not Load's MOVSD: a legacy SSE instruction here costs ~200ns")
		Comment("a call (measured; an SSE/AVX state transition, presumably)")
		recip, err := Param("recip").Resolve()
		if err != nil {
			panic(err)
		}
		VMOVSD(recip.Addr, k.xrcp)
		k.rcp = k.v.vec()
		VBROADCASTSD(k.xrcp, k.rcp)
		return
	}
	k.shift = GP64()
	TZCNTQ(k.bs, k.shift)
	k.vsh = XMM()
	VMOVQ(k.shift, k.vsh)
	k.mask = k.v.vec()
	VPSUBD(k.one, k.xbs, k.mask)
}

// divmod splits the starts in s into block columns and offsets.
func (k *kernel) divmod(s VecVirtual) (col, off VecVirtual) {
	col, off = k.v.vec(), k.v.vec()
	if !k.div {
		VPSRLD(k.vsh, s, col)
		k.v.and(k.mask, s, off)
		return col, off
	}
	Comment("column = trunc(start * (1/bs)), then one correction: exact for 0 <= start < 2^31")
	if k.v.lanes == 16 {
		d0, d1 := ZMM(), ZMM()
		VCVTDQ2PD(s.AsY(), d0)
		VEXTRACTI64X4(U8(1), s, d1.AsY())
		VCVTDQ2PD(d1.AsY(), d1)
		VMULPD(k.rcp, d0, d0)
		VMULPD(k.rcp, d1, d1)
		VCVTTPD2DQ(d0, col.AsY())
		VCVTTPD2DQ(d1, d1.AsY())
		VINSERTI64X4(U8(1), d1.AsY(), col, col)
		VPMULLD(k.xbs, col, off)
		VPSUBD(off, s, off)
		ge := K()
		VPCMPUD(U8(5), k.xbs, off, ge)
		VPADDD(k.one, col, ge, col)
		VPSUBD(k.xbs, off, ge, off)
		return col, off
	}
	d0, d1 := YMM(), YMM()
	VCVTDQ2PD(s.AsX(), d0)
	VEXTRACTI128(U8(1), s, d1.AsX())
	VCVTDQ2PD(d1.AsX(), d1)
	VMULPD(k.rcp, d0, d0)
	VMULPD(k.rcp, d1, d1)
	VCVTTPD2DQY(d0, col.AsX())
	VCVTTPD2DQY(d1, d1.AsX())
	VINSERTI128(U8(1), d1.AsX(), col, col)
	VPMULLD(k.xbs, col, off)
	VPSUBD(off, s, off)
	Comment("offset >= bs (unsigned) where max(offset, bs) == offset")
	ge := YMM()
	VPMAXUD(k.xbs, off, ge)
	VPCMPEQD(off, ge, ge)
	VPSUBD(ge, col, col)
	VPAND(k.xbs, ge, ge)
	VPSUBD(ge, off, off)
	return col, off
}

// and is the bitwise and of the ISA's width.
func (v isa) and(a, b, dst Op) {
	if v.lanes == 16 {
		VPANDD(a, b, dst)
	} else {
		VPAND(a, b, dst)
	}
}

// slots turns gathered block ids g into slots g*bs + off, in place.
func (k *kernel) slots(g, off VecVirtual) {
	if k.div {
		VPMULLD(k.xbs, g, g)
		VPADDD(off, g, g)
		return
	}
	VPSLLD(k.vsh, g, g)
	if k.v.lanes == 16 {
		VPORD(off, g, g)
	} else {
		VPOR(off, g, g)
	}
}

// scalarDivmod splits start s (0 <= s < 2^31) into column and offset.
func (k *kernel) scalarDivmod(s GPVirtual) (col, off GPVirtual) {
	col, off = GP64(), GP64()
	if !k.div {
		SHRXL(k.shift.As32(), s.As32(), col.As32())
		MOVL(k.bs.As32(), off.As32())
		DECL(off.As32())
		ANDL(s.As32(), off.As32())
		return col, off
	}
	x := XMM()
	VCVTSI2SDL(s.As32(), k.xrcp, x)
	VMULSD(k.xrcp, x, x)
	VCVTTSD2SI(x, col.As32())
	MOVL(col.As32(), off.As32())
	IMULL(k.bs.As32(), off.As32())
	NEGL(off.As32())
	ADDL(s.As32(), off.As32())
	Comment("if offset >= bs: column++, offset -= bs")
	t := GP32()
	MOVL(off.As32(), t)
	SUBL(k.bs.As32(), t)
	CMOVLCC(t, off.As32())
	SBBL(I8(-1), col.As32())
	return col, off
}

// fill writes m (>= 0) consecutive slots first, first+1, ... at o and
// advances o.
func (k *kernel) fill(first GP, m GPVirtual) {
	lanes := k.v.lanes
	loop, tail, end := label("fill"), label("filltail"), label("fillend")
	x := k.v.broadcast(first)
	VPADDD(k.iota, x, x)
	CMPQ(m, U8(lanes))
	JB(LabelRef(tail))
	Label(loop)
	k.store(x)
	ADDQ(U8(4*lanes), k.o)
	VPADDD(k.step, x, x)
	SUBQ(U8(lanes), m)
	CMPQ(m, U8(lanes))
	JAE(LabelRef(loop))
	Label(tail)
	TESTQ(m, m)
	JZ(LabelRef(end))
	k.storeN(x, m)
	LEAQ(at(k.o, m), k.o)
	Label(end)
}

func (k *kernel) store(x VecVirtual) {
	if k.v.lanes == 16 {
		VMOVDQU32(x, Mem{Base: k.o})
	} else {
		VMOVDQU(x, Mem{Base: k.o})
	}
}

// storeN stores the low n lanes of x at o (0 < n < lanes).
func (k *kernel) storeN(x VecVirtual, n GPVirtual) {
	if k.v.lanes == 16 {
		VMOVDQU32(x, kmask(n), Mem{Base: k.o})
	} else {
		VPMASKMOVD(x, ymask(n, k.iota), Mem{Base: k.o})
	}
}

// blocks writes c (> 0) slots of consecutive positions starting at offset
// off of block *tp, then of tp[1], tp[2], ... and advances o.
func (k *kernel) blocks(tp, off, c GPVirtual) {
	lanes := k.v.lanes
	fast, slow, tail, end := label("fast"), label("slow"), label("tail"), label("blocksend")
	Comment("first block, from the offset")
	m := GP64()
	MOVQ(k.bs, m)
	SUBQ(off, m)
	CMPQ(m, c)
	CMOVQGT(c, m)
	first := GP32()
	MOVL(Mem{Base: tp}, first)
	IMULL(k.bs.As32(), first)
	ADDL(off.As32(), first)
	SUBQ(m, c)
	k.fill(first, m)
	TESTQ(c, c)
	JZ(LabelRef(end))
	ADDQ(U8(4), tp)
	CMPQ(c, k.bs)
	JB(LabelRef(tail))
	var unrolled []string
	for u := 1; u <= 2; u++ {
		unrolled = append(unrolled, label(fmt.Sprintf("bs%d", u*lanes)))
		CMPQ(k.bs, U8(u*lanes))
		JE(LabelRef(unrolled[u-1]))
	}
	TESTQ(U32(lanes-1), k.bs)
	JNZ(LabelRef(slow))

	Comment("whole blocks, bs a multiple of the lanes: full stores only")
	Label(fast)
	x := k.v.vec()
	VPBROADCASTD(Mem{Base: tp}, x)
	VPMULLD(k.xbs, x, x)
	VPADDD(k.iota, x, x)
	j := GP64()
	MOVQ(k.bs, j)
	inner := label("inner")
	Label(inner)
	k.store(x)
	ADDQ(U8(4*lanes), k.o)
	VPADDD(k.step, x, x)
	SUBQ(U8(lanes), j)
	JNZ(LabelRef(inner))
	ADDQ(U8(4), tp)
	SUBQ(k.bs, c)
	CMPQ(c, k.bs)
	JAE(LabelRef(fast))
	JMP(LabelRef(tail))

	for u := 1; u <= 2; u++ {
		k.wholeBlocks(unrolled[u-1], u, tp, c, tail)
	}

	Comment("whole blocks, any bs")
	Label(slow)
	b := GP32()
	MOVL(Mem{Base: tp}, b)
	IMULL(k.bs.As32(), b)
	mm := GP64()
	MOVQ(k.bs, mm)
	k.fill(b, mm)
	ADDQ(U8(4), tp)
	SUBQ(k.bs, c)
	CMPQ(c, k.bs)
	JAE(LabelRef(slow))

	Comment("last block, partial")
	Label(tail)
	TESTQ(c, c)
	JZ(LabelRef(end))
	b2 := GP32()
	MOVL(Mem{Base: tp}, b2)
	IMULL(k.bs.As32(), b2)
	k.fill(b2, c)
	Label(end)
}
