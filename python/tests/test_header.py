"""The package against the C header it binds (internal/capi/omnicache.h,
copied beside the library by make python): the calls, the structs' layouts,
the flags and versions, and the error codes, each named once in the package
(_ffi for the ABI's numbers, errors for the codes) and checked here."""

import ctypes
import os
import re

import omnicache as oc
from omnicache import _ffi


def header():
    """The header's text without its comments."""
    text = open(os.path.join(os.path.dirname(_ffi.lib_path()), "omnicache.h")).read()
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def test_calls_match_the_header():
    """The package binds exactly the calls the header declares, with as
    many arguments."""
    decl = {m.group(1): m.group(2) for m in re.finditer(r"\b(omnicache_\w+)\(([^)]*)\);", header())}
    sig = _ffi.signatures()
    assert sorted(decl) == sorted(sig)
    for name, args in decl.items():
        n = 0 if args.strip() in ("", "void") else args.count(",") + 1
        assert n == len(sig[name][1]), name


# The C types the header's structs use: (size, alignment) on the LP64 ABIs
# the library builds for (x86-64 and AArch64 Linux). A pointer is the
# platform's.
_PTR = ctypes.sizeof(ctypes.c_void_p)
_C_TYPES = {"int64_t": (8, 8), "uint64_t": (8, 8), "double": (8, 8), "int32_t": (4, 4), "uint32_t": (4, 4)}


def c_layout(body):
    """[(field, size, offset)] and the struct's size, as a C compiler lays
    out the declarations of a typedef'd struct's body: each field at the
    next multiple of its alignment, the size rounded up to the largest."""
    fields, off, align = [], 0, 1
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        m = re.fullmatch(r"(.*?)\s*(\w+)", decl, flags=re.S)
        assert m, decl
        ctype, name = m.group(1), m.group(2)
        if "*" in ctype:
            size = al = _PTR
        else:
            ctype = ctype.replace("const", "").strip()
            assert ctype in _C_TYPES, "a field of type %r: teach this test its size (%s)" % (ctype, decl)
            size, al = _C_TYPES[ctype]
        off = (off + al - 1) // al * al
        fields.append((name, size, off))
        off += size
        align = max(align, al)
    return fields, (off + align - 1) // align * align


def test_struct_layouts_match_the_header():
    """The package's ctypes structs have the header's layout: the same
    fields in order (from_ for C's from), each of the C type's size at its
    offset, and the same struct size."""
    structs = {m.group(2): m.group(1) for m in re.finditer(r"typedef struct \{(.*?)\} (\w+);", header(), flags=re.S)}
    pairs = {"omnicache_key": _ffi.Key, "omnicache_config": _ffi.Config, "omnicache_plan": _ffi.Plan,
             "omnicache_tensor": _ffi.Tensor, "omnicache_outputs": _ffi.Outputs, "omnicache_result": _ffi.Result}
    assert sorted(structs) == sorted(pairs)
    for cname, py in pairs.items():
        fields, size = c_layout(structs[cname])
        assert [f.rstrip("_") for f, _ in py._fields_] == [f for f, _, _ in fields], cname
        for (pf, ptype), (cf, csize, coff) in zip(py._fields_, fields):
            assert (ctypes.sizeof(ptype), getattr(py, pf).offset) == (csize, coff), (cname, cf)
        assert ctypes.sizeof(py) == size, cname


def test_c_layout_pads_as_a_compiler_does():
    """The layout rule itself: a 4-byte field before an 8-byte one is
    padded, and the size is rounded up to the largest alignment."""
    fields, size = c_layout("int32_t a; int64_t b; uint32_t c;")
    assert fields == [("a", 4, 0), ("b", 8, 8), ("c", 4, 16)] and size == 24
    fields, size = c_layout("const char *p; int32_t n;")
    assert fields == [("p", _PTR, 0), ("n", 4, _PTR)] and size == 2 * _PTR


def defines():
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define OMNICACHE_(\w+) (\d+)u?\b", header())}


def test_flags_and_versions_match_the_header():
    d = defines()
    for name in ("KEY_OPTIONAL", "KEY_DEFERRED", "DISABLE_DECODE_BUFFER", "DISABLE_PREFETCH", "ALLOC_STAGING_AT_NEW",
                 "ALLOC_STAGING_AHEAD", "DEVICE_CUDA", "TENSOR_CUDA", "TIER_PUBLISH_BARRIER", "MATERIALIZE_OWN", "ABI_VERSION"):
        assert getattr(_ffi, name) == d[name], name
    assert set(d) == {"KEY_OPTIONAL", "KEY_DEFERRED", "DISABLE_DECODE_BUFFER", "DISABLE_PREFETCH", "ALLOC_STAGING_AT_NEW",
                      "ALLOC_STAGING_AHEAD", "DEVICE_CUDA", "TENSOR_CUDA", "TIER_PUBLISH_BARRIER", "MATERIALIZE_OWN", "ABI_VERSION"}, "a flag the package lacks"
    version = re.search(r'#define OMNICACHE_VERSION_STRING "([^"]+)"', header()).group(1)
    assert oc.__version__ == version


def header_codes():
    """OMNICACHE_ERR_* name (without the prefix) -> code."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"OMNICACHE_ERR_(\w+) = (\d+)", header())}


def class_name(err):
    """The exception class named after a header code: UNALIGNED_HIT ->
    UnalignedHitError."""
    return "".join(w.capitalize() for w in err.split("_")) + "Error"


def test_error_codes_match_the_header():
    """Every header code has the exception class named after it, with its
    code, and the package maps no other code (errors.ERRORS)."""
    codes = header_codes()
    assert len(codes) >= 30
    for err, code in codes.items():
        cls = getattr(oc.errors, class_name(err), None)
        assert cls is not None, "OMNICACHE_ERR_%s has no class %s" % (err, class_name(err))
        assert cls.code == code and oc.ERRORS[code] is cls, (err, code, cls.code)
        e = oc.errors.error(code, "m")
        assert type(e) is cls and e.code == code and str(e) == "m"
    assert set(oc.ERRORS) == set(codes.values())


def test_error_codes_are_named_once():
    """No module but errors.py writes an error code as a number: they use
    the classes' codes (a bare 102 would drift from the header unseen)."""
    pkg = os.path.dirname(oc.__file__)
    bare = re.compile(r"\b(rc|code|_ERR_\w+)\s*(==|!=|=)\s*\d+|\bin \(\d+, \d+")
    for f in sorted(os.listdir(pkg)):
        if f.endswith(".py") and f != "errors.py":
            for n, line in enumerate(open(os.path.join(pkg, f)), 1):
                assert not bare.search(line), "%s:%d: %s" % (f, n, line.strip())
