/*
 * omnicache._fast: the per-step calls of libomnicache.so from CPython
 * without ctypes.
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
 * OMNICACHE_LIB chooses the build) and omnicache._calls hands the entry
 * points' addresses to bind(). Importing this module therefore loads nothing.
 *
 * Every call into the library releases the GIL while it runs, as ctypes
 * does: a save waiting for a staging page lets other Python threads
 * run. Handles and step ids are ints; plans and outputs are the addresses
 * (ints, their ``_ref``) of the omnicache_plan / omnicache_outputs structs
 * the package keeps.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

typedef int (*discard_begin_fn)(uint64_t h, uint64_t discard, const void *plan);
typedef int (*save_fn)(uint64_t h, const void *outputs, uint64_t *step);
typedef int (*discard_fn)(uint64_t h, uint64_t step);
typedef int (*slots_fn)(const int32_t *table, int64_t table_len, int64_t stride, const int32_t *rows,
			const int32_t *start, const int32_t *count, int64_t n, int64_t block_size, int64_t *dst,
			int64_t cap, int64_t *written);

/* One library per process (omnicache._ffi loads one); set by bind(). */
static discard_begin_fn f_discard_begin;
static save_fn f_save;
static discard_fn f_discard;
static slots_fn f_slots;
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
	if (discard != NULL && discard != Py_None && u64(discard, &step) < 0) {
		PyErr_Clear(); /* not a step id: Cache._begin_py raises the package's typed error */
		goto slow;
	}
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
	     "bind(discard_begin, save, discard, slots, Plan, Outputs, raise_fn): the entry\n"
	     "points' addresses (omnicache_discard_begin, omnicache_save, omnicache_discard,\n"
	     "omnicache_slots), the classes Engine's fast paths take, and raise_fn(rc), which\n"
	     "raises rc's exception.");

static PyObject *fast_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
	const void *p[4];
	if (!nargs_is(nargs, 7, "bind")) return NULL;
	for (int i = 0; i < 4; i++) {
		if (addr(args[i], &p[i]) < 0) return NULL;
		if (p[i] == NULL) {
			PyErr_SetString(PyExc_ValueError, "omnicache._fast.bind: a NULL entry point");
			return NULL;
		}
	}
	if (!PyType_Check(args[4]) || !PyType_Check(args[5]) || !PyCallable_Check(args[6])) {
		PyErr_SetString(PyExc_TypeError, "omnicache._fast.bind: want Plan, Outputs (classes) and a raise function");
		return NULL;
	}
	Py_INCREF(args[4]);
	Py_XSETREF(plan_type, args[4]);
	Py_INCREF(args[5]);
	Py_XSETREF(outputs_type, args[5]);
	Py_INCREF(args[6]);
	Py_XSETREF(raise_fn, args[6]);
	f_discard_begin = (discard_begin_fn)p[0];
	f_save = (save_fn)p[1];
	f_discard = (discard_fn)p[2];
	f_slots = (slots_fn)p[3];
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

/* ---- the slot mapping of a group view (omnicache.slots) ---- */

/* int32_2d views obj (numpy int32, C-contiguous, through the buffer
 * protocol) as [rows][cols]; ndim 1 gives cols 1. */
static int int32_view(PyObject *obj, Py_buffer *b, int ndim, const char *what) {
	if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
	if (b->itemsize != 4 || b->format == NULL || (strcmp(b->format, "i") != 0 && strcmp(b->format, "=i") != 0 &&
						      strcmp(b->format, "<i") != 0 && strcmp(b->format, "l") != 0) ||
	    b->ndim != ndim) {
		PyErr_Format(PyExc_TypeError, "omnicache: %s: want a C-contiguous int32 array of %d dimensions (format %s, %d)",
			     what, ndim, b->format ? b->format : "?", b->ndim);
		PyBuffer_Release(b); /* sets b->obj to NULL */
		return -1;
	}
	return 0;
}

/* A request's count: an int in [0, 2^31). */
static int count_of(PyObject *o, PyObject *id, int32_t *out) {
	long v = PyLong_AsLong(o);
	if (v == -1 && PyErr_Occurred()) return -1;
	if (v < 0 || v > INT32_MAX) {
		PyErr_Format(PyExc_ValueError, "omnicache: request %R: %ld scheduled tokens", id, v);
		return -1;
	}
	*out = (int32_t)v;
	return 0;
}

#define SLOTS_STACK 128 /* requests whose rows, starts and counts fit on the stack */
#define SLOTS_NOGIL 4096 /* slots from which the GIL is released around the call */

PyDoc_STRVAR(slots_doc,
	     "slots(req_ids, num_scheduled, batch, index, table, computed, block_size, empty, dtype)\n--\n\n"
	     "FullAttentionGroupView.step_slots_cpu in C: per request of req_ids (a sequence)\n"
	     "its row (i when batch[i] is the same object, else index[id]; index None: the\n"
	     "ids' places in batch), its start (computed[row]) and count (num_scheduled[id]\n"
	     "of a dict, 0 when absent, or num_scheduled[i]),\n"
	     "then omnicache_slots over table (int32 [rows][blocks]) into empty(total, dtype).");

/* index_of builds {batch[i]: i} for the ids of batch that are not None. */
static PyObject *index_of(PyObject **bat, Py_ssize_t nbat) {
	PyObject *d = PyDict_New();
	if (d == NULL) return NULL;
	for (Py_ssize_t i = 0; i < nbat; i++) {
		if (bat[i] == Py_None) continue;
		PyObject *v = PyLong_FromSsize_t(i);
		if (v == NULL || PyDict_SetItem(d, bat[i], v) < 0) {
			Py_XDECREF(v);
			Py_DECREF(d);
			return NULL;
		}
		Py_DECREF(v);
	}
	return d;
}

static PyObject *fast_slots(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
	if (!nargs_is(nargs, 9, "slots")) return NULL;
	if (f_slots == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "omnicache._fast: bind() was not called");
		return NULL;
	}
	long bs = PyLong_AsLong(args[6]);
	if (bs == -1 && PyErr_Occurred()) return NULL;
	PyObject *req_ids = NULL, *sched = NULL, *batch = NULL, *index = args[3], *own_index = NULL;
	PyObject *out = NULL, *tot = NULL;
	Py_buffer tb = {0}, cb = {0};
	int32_t stack[3 * SLOTS_STACK], *buf = stack;
	int by_id = PyDict_Check(args[1]);
	if ((req_ids = PySequence_Fast(args[0], "omnicache: req_ids: want a sequence")) == NULL) goto done;
	if ((batch = PySequence_Fast(args[2], "omnicache: the batch's req_ids: want a sequence")) == NULL) goto done;
	if (by_id) {
		Py_INCREF(args[1]);
		sched = args[1];
	} else if ((sched = PySequence_Fast(args[1], "omnicache: num_scheduled: want a dict or a sequence")) == NULL) {
		goto done;
	}
	Py_ssize_t n = PySequence_Fast_GET_SIZE(req_ids);
	if (!by_id && PySequence_Fast_GET_SIZE(sched) != n) {
		PyErr_Format(PyExc_ValueError, "omnicache: %zd requests, %zd scheduled counts", n,
			     PySequence_Fast_GET_SIZE(sched));
		goto done;
	}
	PyObject **ids = PySequence_Fast_ITEMS(req_ids);
	PyObject **bat = PySequence_Fast_ITEMS(batch);
	Py_ssize_t nbat = PySequence_Fast_GET_SIZE(batch);
	if (int32_view(args[4], &tb, 2, "block table") < 0) goto done;
	if (int32_view(args[5], &cb, 1, "num_computed_tokens") < 0) goto done;
	const int32_t *computed = cb.buf;
	Py_ssize_t ncomp = cb.shape[0];
	if (n > SLOTS_STACK && (buf = PyMem_Malloc(3 * n * sizeof(int32_t))) == NULL) {
		buf = stack;
		PyErr_NoMemory();
		goto done;
	}
	int32_t *rows = buf, *start = buf + n, *count = buf + 2 * n;
	int64_t total = 0;
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *id = ids[i];
		Py_ssize_t row;
		if (i < nbat && bat[i] == id) {
			row = i; /* the batch's own order: the usual case, no lookup */
		} else {
			if (index == Py_None) {
				if ((own_index = index_of(bat, nbat)) == NULL) goto done;
				index = own_index;
			}
			PyObject *r = PyDict_GetItemWithError(index, id);
			if (r == NULL) {
				if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "omnicache: request %R is not in the batch", id);
				goto done;
			}
			row = PyLong_AsSsize_t(r);
			if (row == -1 && PyErr_Occurred()) goto done;
		}
		if (row < 0 || row >= ncomp || row > INT32_MAX) {
			PyErr_Format(PyExc_ValueError, "omnicache: request %R: row %zd, the batch has %zd rows", id, row, ncomp);
			goto done;
		}
		PyObject *c = by_id ? PyDict_GetItemWithError(sched, id) : PySequence_Fast_ITEMS(sched)[i];
		if (c == NULL && PyErr_Occurred()) goto done;
		if (c == NULL) {
			count[i] = 0; /* not in the dict: nothing scheduled */
		} else if (count_of(c, id, &count[i]) < 0) {
			goto done;
		}
		rows[i] = (int32_t)row;
		start[i] = computed[row];
		total += count[i];
	}
	if ((tot = PyLong_FromLongLong(total)) == NULL) goto done;
	PyObject *eargs[2] = {tot, args[8]};
	if ((out = PyObject_Vectorcall(args[7], eargs, 2, NULL)) == NULL) goto done;
	Py_buffer ob;
	if (PyObject_GetBuffer(out, &ob, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto fail;
	if (ob.len != total * 8) {
		PyBuffer_Release(&ob);
		PyErr_Format(PyExc_ValueError, "omnicache: empty(%lld) made %zd bytes", (long long)total, ob.len);
		goto fail;
	}
	int rc;
	int64_t written = 0;
	const int32_t *table = tb.buf;
	int64_t tlen = tb.shape[0] * tb.shape[1], stride = tb.shape[1];
	if (total >= SLOTS_NOGIL) {
		Py_BEGIN_ALLOW_THREADS
		rc = f_slots(table, tlen, stride, rows, start, count, n, bs, ob.buf, total, &written);
		Py_END_ALLOW_THREADS
	} else {
		rc = f_slots(table, tlen, stride, rows, start, count, n, bs, ob.buf, total, &written);
	}
	PyBuffer_Release(&ob);
	if (rc == 0 && written != total) {
		PyErr_Format(PyExc_RuntimeError, "omnicache: %lld slots written of %lld", (long long)written, (long long)total);
		goto fail;
	}
	if (rc != 0) {
		fail(rc);
		goto fail;
	}
	goto done;
fail:
	Py_CLEAR(out);
done:
	Py_XDECREF(tot);
	Py_XDECREF(own_index);
	if (buf != stack) PyMem_Free(buf);
	if (cb.obj != NULL) PyBuffer_Release(&cb);
	if (tb.obj != NULL) PyBuffer_Release(&tb);
	Py_XDECREF(sched);
	Py_XDECREF(batch);
	Py_XDECREF(req_ids);
	return out;
}

static PyMethodDef methods[] = {
	{"bind", (PyCFunction)(void (*)(void))fast_bind, METH_FASTCALL, bind_doc},
	{"discard_begin", (PyCFunction)(void (*)(void))fast_discard_begin, METH_FASTCALL, discard_begin_doc},
	{"save", (PyCFunction)(void (*)(void))fast_save, METH_FASTCALL, save_doc},
	{"discard", (PyCFunction)(void (*)(void))fast_discard, METH_FASTCALL, discard_doc},
	{"slots", (PyCFunction)(void (*)(void))fast_slots, METH_FASTCALL, slots_doc},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT,
	"omnicache._fast",
	"The per-step calls of libomnicache.so without ctypes (bound by omnicache._calls).",
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
