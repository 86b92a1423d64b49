/*
 * omnicache._fast: the per-step calls of libomnicache.so from CPython
 * without ctypes or cffi.
 *
 * - Engine, the base class of omnicache.Cache: its begin and save run a
 *   plain step (a Plan; an Outputs of host tensors, nothing else to set)
 *   in C: one attribute read, one call into the library, no Python frame.
 *   Anything else (keywords other than discard, a dict of tensors, CUDA
 *   tensors, tokens=...) goes to the Python implementations
 *   Cache._begin_py and Cache._save_py. A failed call raises through the
 *   Python function bind() received, which reads the library's message.
 * - discard_begin, save, discard: the entry points as functions (the
 *   Python implementations call them).
 *
 * The module does not link libomnicache.so: omnicache._ffi loads the
 * library lazily (the Go runtime does not survive a fork, and
 * OMNICACHE_LIB chooses the build) and hands the entry points' addresses
 * to bind(). Importing this module therefore loads nothing.
 *
 * Every call into the library releases the GIL while it runs, as ctypes
 * and cffi do: a save waiting for a staging page lets other Python threads
 * run. Handles and step ids are ints; plans and outputs are the addresses
 * (ints, their ``_ref``) of the omnicache_plan / omnicache_outputs structs
 * the package keeps.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

typedef int (*discard_begin_fn)(uint64_t h, uint64_t discard, const void *plan);
typedef int (*save_fn)(uint64_t h, const void *outputs, uint64_t *step);
typedef int (*discard_fn)(uint64_t h, uint64_t step);

/* One library per process (omnicache._ffi loads one); set by bind(). */
static discard_begin_fn f_discard_begin;
static save_fn f_save;
static discard_fn f_discard;
static PyObject *plan_type, *outputs_type; /* omnicache.Plan, omnicache.Outputs */
static PyObject *raise_fn;                  /* raise_fn(rc) raises rc's exception */

static PyObject *s_ref, *s_on_cuda, *s_discard, *s_begin_py, *s_save_py; /* interned names */

static int bound(void) {
	if (f_discard_begin == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "omnicache._fast: bind() was not called");
		return 0;
	}
	return 1;
}

/* u64 and addr convert one argument (an int, or an object with __index__
 * such as a numpy integer); -1 with an exception set on failure. */
static int u64(PyObject *o, uint64_t *out) {
	unsigned long long v;
	if (PyLong_CheckExact(o)) {
		v = PyLong_AsUnsignedLongLong(o);
	} else {
		PyObject *i = PyNumber_Index(o);
		if (i == NULL) return -1;
		v = PyLong_AsUnsignedLongLong(i);
		Py_DECREF(i);
	}
	if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
	*out = (uint64_t)v;
	return 0;
}

static int addr(PyObject *o, const void **out) {
	void *p = PyLong_AsVoidPtr(o);
	if (p == NULL && PyErr_Occurred()) return -1;
	*out = p;
	return 0;
}

/* ref reads obj._ref, the address of its C struct. */
static int ref(PyObject *obj, const void **out) {
	PyObject *r = PyObject_GetAttr(obj, s_ref);
	if (r == NULL) return -1;
	int rc = addr(r, out);
	Py_DECREF(r);
	return rc;
}

/* fail raises rc's exception through raise_fn; returns NULL. */
static PyObject *fail(int rc) {
	PyObject *code = PyLong_FromLong(rc);
	if (code == NULL) return NULL;
	PyObject *r = PyObject_CallOneArg(raise_fn, code);
	Py_DECREF(code);
	if (r != NULL) {
		Py_DECREF(r);
		PyErr_Format(PyExc_RuntimeError, "omnicache._fast: the raise function returned for code %d", rc);
	}
	return NULL;
}

static int nargs_is(Py_ssize_t nargs, Py_ssize_t want, const char *name) {
	if (nargs == want) return 1;
	PyErr_Format(PyExc_TypeError, "omnicache._fast.%s takes %zd arguments (%zd given)", name, want, nargs);
	return 0;
}

/* ---- Engine ---- */

typedef struct {
	PyObject_HEAD
	unsigned long long h; /* the cache handle (Cache._h) */
	PyObject *plan;       /* the plan of the step begun last (Cache._plan) */
} Engine;

/* slow calls self.<name>(*args, **kwargs) with vectorcall's arguments. */
static PyObject *slow(PyObject *self, PyObject *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
	Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
	PyObject *small[8];
	PyObject **all = small;
	if (1 + nargs + nkw > 8) {
		all = PyMem_Malloc((1 + nargs + nkw) * sizeof(PyObject *));
		if (all == NULL) return PyErr_NoMemory();
	}
	all[0] = self;
	for (Py_ssize_t i = 0; i < nargs + nkw; i++) all[1 + i] = args[i];
	PyObject *r = PyObject_VectorcallMethod(name, all, (1 + nargs) | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
	if (all != small) PyMem_Free(all);
	return r;
}

PyDoc_STRVAR(engine_begin_doc,
	     "begin(plan=None, discard=0, **fields)\n--\n\n"
	     "Cache.begin: a Plan (and the step id to discard first) in C, anything else\n"
	     "through Cache._begin_py (see its documentation).");

static PyObject *engine_begin(Engine *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
	Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
	PyObject *plan, *discard = NULL;
	uint64_t step = 0;
	const void *p;
	int rc;
	if (f_discard_begin == NULL || nargs < 1 || nargs > 2 || Py_TYPE(args[0]) != (PyTypeObject *)plan_type)
		goto slow;
	plan = args[0];
	if (kwnames != NULL) {
		/* only discard=, by keyword */
		if (nargs != 1 || PyTuple_GET_SIZE(kwnames) != 1 ||
		    PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), s_discard) != 0)
			goto slow;
		discard = args[1];
	} else if (nargs == 2) {
		discard = args[1];
	}
	if (discard != NULL && discard != Py_None && u64(discard, &step) < 0) return NULL;
	if (ref(plan, &p) < 0) return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = f_discard_begin((uint64_t)self->h, step, p);
	Py_END_ALLOW_THREADS
	if (rc != 0) return fail(rc);
	Py_INCREF(plan);
	Py_XSETREF(self->plan, plan);
	Py_RETURN_NONE;
slow:
	return slow((PyObject *)self, s_begin_py, args, nargs, kwnames);
}

PyDoc_STRVAR(engine_save_doc,
	     "save(outputs, tokens=None, padded=None, accepted=None)\n--\n\n"
	     "Cache.save: an Outputs of host tensors in C, anything else through\n"
	     "Cache._save_py (see its documentation). Returns the step id.");

static PyObject *engine_save(Engine *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
	Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
	uint64_t step = 0;
	const void *o;
	int rc;
	if (f_save == NULL || nargs != 1 || kwnames != NULL || Py_TYPE(args[0]) != (PyTypeObject *)outputs_type)
		goto slow;
	PyObject *on_cuda = PyObject_GetAttr(args[0], s_on_cuda);
	if (on_cuda == NULL) return NULL;
	int cuda = PyObject_IsTrue(on_cuda);
	Py_DECREF(on_cuda);
	if (cuda < 0) return NULL;
	if (cuda) goto slow; /* the event is recorded in Python */
	if (ref(args[0], &o) < 0) return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = f_save((uint64_t)self->h, o, &step);
	Py_END_ALLOW_THREADS
	if (rc != 0) return fail(rc);
	return PyLong_FromUnsignedLongLong(step);
slow:
	return slow((PyObject *)self, s_save_py, args, nargs, kwnames);
}

static int engine_traverse(Engine *self, visitproc visit, void *arg) {
	Py_VISIT(Py_TYPE(self));
	Py_VISIT(self->plan);
	return 0;
}

static int engine_clear(Engine *self) {
	Py_CLEAR(self->plan);
	return 0;
}

static void engine_dealloc(Engine *self) {
	PyTypeObject *tp = Py_TYPE(self);
	PyObject_GC_UnTrack(self);
	engine_clear(self);
	tp->tp_free((PyObject *)self);
	Py_DECREF(tp);
}

static PyMethodDef engine_methods[] = {
	{"begin", (PyCFunction)(void (*)(void))engine_begin, METH_FASTCALL | METH_KEYWORDS, engine_begin_doc},
	{"save", (PyCFunction)(void (*)(void))engine_save, METH_FASTCALL | METH_KEYWORDS, engine_save_doc},
	{NULL, NULL, 0, NULL},
};

static PyMemberDef engine_members[] = {
	{"_h", T_ULONGLONG, offsetof(Engine, h), 0, "the cache handle"},
	{"_plan", T_OBJECT, offsetof(Engine, plan), 0, "the plan of the step begun last"},
	{NULL, 0, 0, 0, NULL},
};

static PyType_Slot engine_slots[] = {
	{Py_tp_doc, "The base of omnicache.Cache: begin and save of a plain step in C."},
	{Py_tp_methods, engine_methods},
	{Py_tp_members, engine_members},
	{Py_tp_traverse, engine_traverse},
	{Py_tp_clear, engine_clear},
	{Py_tp_dealloc, engine_dealloc},
	{Py_tp_new, PyType_GenericNew},
	{0, NULL},
};

static PyType_Spec engine_spec = {
	"omnicache._fast.Engine",
	sizeof(Engine),
	0,
	Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
	engine_slots,
};

/* ---- module functions ---- */

PyDoc_STRVAR(bind_doc,
	     "bind(discard_begin, save, discard, Plan, Outputs, raise_fn): the entry points'\n"
	     "addresses (omnicache_discard_begin, omnicache_save, omnicache_discard), the\n"
	     "classes Engine's fast paths take, and raise_fn(rc), which raises rc's exception.");

static PyObject *fast_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
	const void *p[3];
	if (!nargs_is(nargs, 6, "bind")) return NULL;
	for (int i = 0; i < 3; i++) {
		if (addr(args[i], &p[i]) < 0) return NULL;
		if (p[i] == NULL) {
			PyErr_SetString(PyExc_ValueError, "omnicache._fast.bind: a NULL entry point");
			return NULL;
		}
	}
	if (!PyType_Check(args[3]) || !PyType_Check(args[4]) || !PyCallable_Check(args[5])) {
		PyErr_SetString(PyExc_TypeError, "omnicache._fast.bind: want Plan, Outputs (classes) and a raise function");
		return NULL;
	}
	Py_INCREF(args[3]);
	Py_XSETREF(plan_type, args[3]);
	Py_INCREF(args[4]);
	Py_XSETREF(outputs_type, args[4]);
	Py_INCREF(args[5]);
	Py_XSETREF(raise_fn, args[5]);
	f_discard_begin = (discard_begin_fn)p[0];
	f_save = (save_fn)p[1];
	f_discard = (discard_fn)p[2];
	Py_RETURN_NONE;
}

PyDoc_STRVAR(discard_begin_doc,
	     "discard_begin(handle, step, plan_address) -> rc (omnicache_discard_begin; step 0: none).");

static PyObject *fast_discard_begin(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
	uint64_t h, step;
	const void *plan;
	int rc;
	if (!nargs_is(nargs, 3, "discard_begin") || !bound() || u64(args[0], &h) < 0 || u64(args[1], &step) < 0 ||
	    addr(args[2], &plan) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = f_discard_begin(h, step, plan);
	Py_END_ALLOW_THREADS
	return PyLong_FromLong(rc);
}

PyDoc_STRVAR(save_doc, "save(handle, outputs_address) -> the step id (> 0), or -rc when the call failed\n"
		       "(omnicache_save; step ids start at 1).");

static PyObject *fast_save(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
	uint64_t h, step = 0;
	const void *outs;
	int rc;
	if (!nargs_is(nargs, 2, "save") || !bound() || u64(args[0], &h) < 0 || addr(args[1], &outs) < 0) return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = f_save(h, outs, &step);
	Py_END_ALLOW_THREADS
	if (rc != 0) return PyLong_FromLong(-(long)rc);
	return PyLong_FromUnsignedLongLong(step);
}

PyDoc_STRVAR(discard_doc, "discard(handle, step) -> rc (omnicache_discard).");

static PyObject *fast_discard(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
	uint64_t h, step;
	int rc;
	if (!nargs_is(nargs, 2, "discard") || !bound() || u64(args[0], &h) < 0 || u64(args[1], &step) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = f_discard(h, step);
	Py_END_ALLOW_THREADS
	return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {
	{"bind", (PyCFunction)(void (*)(void))fast_bind, METH_FASTCALL, bind_doc},
	{"discard_begin", (PyCFunction)(void (*)(void))fast_discard_begin, METH_FASTCALL, discard_begin_doc},
	{"save", (PyCFunction)(void (*)(void))fast_save, METH_FASTCALL, save_doc},
	{"discard", (PyCFunction)(void (*)(void))fast_discard, METH_FASTCALL, discard_doc},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT,
	"omnicache._fast",
	"The per-step calls of libomnicache.so without ctypes or cffi (bound by omnicache._ffi).",
	-1,
	methods,
};

PyMODINIT_FUNC PyInit__fast(void) {
	if ((s_ref = PyUnicode_InternFromString("_ref")) == NULL ||
	    (s_on_cuda = PyUnicode_InternFromString("_on_cuda")) == NULL ||
	    (s_discard = PyUnicode_InternFromString("discard")) == NULL ||
	    (s_begin_py = PyUnicode_InternFromString("_begin_py")) == NULL ||
	    (s_save_py = PyUnicode_InternFromString("_save_py")) == NULL)
		return NULL;
	PyObject *m = PyModule_Create(&module);
	if (m == NULL) return NULL;
	PyObject *engine = PyType_FromSpec(&engine_spec);
	if (engine == NULL || PyModule_AddObject(m, "Engine", engine) < 0) {
		Py_XDECREF(engine);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
