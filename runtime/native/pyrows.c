/* The rows API's two calls per step, called from Python without libffi: a CPython extension
 * (built by native/pyrows.py where Python's headers are installed; CPool's pure-Python methods
 * otherwise) whose `submitter(args, submit)` and `finisher(pool, finish)` make builtin functions
 * bound to one pool's aicirt_rows_args struct and to rows.c's functions (their addresses, from
 * the hot path's library). They take CPool.submit_rows's and finish_rows's arguments as they are
 * and do what those do: an ABI-mode call converts every argument through libffi (0.3 µs a call)
 * and the Python that fills the struct cost 0.7 µs more, most of a one-row step's overhead.
 *
 * Buffers are read through the buffer protocol, each checked for its item size and its length
 * (a buffer too short for its rows is a ValueError, never a read past it); the GIL is released
 * around both calls, as cffi does. Prepended at build: rows.c's aicirt_rows_args (CDEF ROWS). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*submit_fn)(const aicirt_rows_args *a, int n, uint64_t stamp);
typedef int (*finish_fn)(struct aicirt_pool *p, uint8_t *scratch, int n, double timeout_us);

/* A buffer kept from one call to the next: the engine passes the same arrays every step (its
 * index and sampled arrays, filled in place; the registry's table; two mask arrays and two
 * scratch buffers in turn), and numpy's buffer export costs ~0.2 µs each. The view is held (so
 * its memory stays put, as cffi's from_buffer kept it) until another object takes the entry. */
typedef struct {
    PyObject *obj;   /* borrowed identity; the view holds the reference */
    Py_buffer view;
} kept_t;

enum { K_TABLE, K_INDEX, K_SAMPLED, K_MASKS, K_MASKS2, K_SCRATCH, K_SCRATCH2, N_KEPT };

/* A bound function's self: the struct (or pool), the C function, its kept buffers. */
typedef struct {
    PyObject_HEAD
    void *target;
    void *fn;
    kept_t kept[N_KEPT];
} bound_t;

static void bound_dealloc(PyObject *self) {
    bound_t *bd = (bound_t *)self;
    for (int k = 0; k < N_KEPT; k++)
        if (bd->kept[k].obj) PyBuffer_Release(&bd->kept[k].view);
    PyObject_Free(self);
}

static PyTypeObject bound_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aicirt_pyrows.bound",
    .tp_basicsize = sizeof(bound_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = bound_dealloc,
};

static PyObject *s_n, *s_buf, *s_edit[4];   /* attribute names, interned once */

/* A C-contiguous view of `o` (writable where the hot path writes into it) with items of
 * `itemsize` bytes, at least `min_items` of them. */
static int view(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t min_items, int writable,
                const char *name) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (b->itemsize != itemsize || b->len / itemsize < min_items) {
        PyErr_Format(PyExc_ValueError, "%s: %zd-byte items, %zd of them (expected %zd-byte items, at least %zd)",
                     name, b->itemsize, b->len / (b->itemsize ? b->itemsize : 1), itemsize, min_items);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* `o`'s memory through entry `k` of `bd` (or `k2`, where not -1: two entries used in turn),
 * checked as view() checks it: the kept view where `o` is the object kept there. */
static void *kept_view(bound_t *bd, int k, int k2, PyObject *o, Py_ssize_t itemsize, Py_ssize_t min_items,
                       int writable, const char *name) {
    kept_t *e = &bd->kept[k];
    if (e->obj != o && k2 >= 0) {
        if (bd->kept[k2].obj == o) {
            e = &bd->kept[k2];
        } else {   /* the older of the two goes: swap them so that entry k is the newest */
            kept_t t = bd->kept[k2];
            bd->kept[k2] = bd->kept[k], bd->kept[k] = t;
        }
    }
    if (e->obj == o) {
        if (e->view.len / itemsize >= min_items) return e->view.buf;
        PyErr_Format(PyExc_ValueError, "%s: %zd items (expected at least %zd)", name, e->view.len / itemsize,
                     min_items);
        return NULL;
    }
    Py_buffer b;
    if (view(o, &b, itemsize, min_items, writable, name) < 0) return NULL;
    if (e->obj) PyBuffer_Release(&e->view);
    e->view = b, e->obj = o;
    return b.buf;
}

#define MAX_VIEWS 5

/* submit_rows(table, index, sampled, edits, masks, words, stamp, scratch, expect_seen=None)
 * -> (rc, scratch.buf): see CPool.submit_rows. */
static PyObject *submit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    bound_t *bd = (bound_t *)self;
    if (nargs != 8 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "submit_rows takes 8 or 9 arguments");
        return NULL;
    }
    aicirt_rows_args *a = bd->target;
    PyObject *edits = args[3], *seen = nargs == 9 ? args[8] : Py_None, *buf = NULL, *result = NULL;
    Py_buffer v[MAX_VIEWS];
    int nv = 0;
    long words = PyLong_AsLong(args[5]);
    unsigned long long stamp = PyLong_AsUnsignedLongLong(args[6]);
    if ((words == -1 || stamp == (unsigned long long)-1) && PyErr_Occurred()) return NULL;
    PyObject *n_obj = PyObject_GetAttr(args[7], s_n);
    if (!n_obj) return NULL;
    long n = PyLong_AsLong(n_obj);
    Py_DECREF(n_obj);
    if (n < 0 || n > INT32_MAX || words < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad row count or mask width");
        return NULL;
    }
    if (!(buf = PyObject_GetAttr(args[7], s_buf))) return NULL;
    const void *table = kept_view(bd, K_TABLE, -1, args[0], 8, 0, 0, "table");
    if (!table) goto done;
    a->table = table, a->table_len = bd->kept[K_TABLE].view.len / 8;
    if (!(a->index = kept_view(bd, K_INDEX, -1, args[1], 8, n, 0, "index"))) goto done;
    if (!(a->sampled = kept_view(bd, K_SAMPLED, -1, args[2], 4, n, 0, "sampled"))) goto done;
    if (!(a->mask_base = kept_view(bd, K_MASKS, K_MASKS2, args[4], 4, (Py_ssize_t)n * words, 1, "masks"))) goto done;
    a->words = (uint32_t)words;
    if (!(a->scratch = kept_view(bd, K_SCRATCH, K_SCRATCH2, buf, 1, 8 + 22 * (Py_ssize_t)n, 1, "scratch"))) goto done;
    a->edit_of = NULL, a->edit_off = NULL, a->edit_tok = NULL, a->edit_unchanged = NULL, a->expect_seen = NULL;
    if (edits != Py_None) {   /* EditArrays: Python built it consistent; each array's own length is checked */
        static const Py_ssize_t sizes[4] = {4, 8, 4, 4};
        static const char *names[4] = {"edits.of_row", "edits.offsets", "edits.tokens", "edits.unchanged"};
        const void *ptrs[4];
        for (int k = 0; k < 4; k++) {
            PyObject *arr = PyObject_GetAttr(edits, s_edit[k]);
            if (!arr) goto done;
            int bad = view(arr, &v[nv], sizes[k], k == 0 ? n : 0, 0, names[k]);
            Py_DECREF(arr);   /* the view holds the array */
            if (bad < 0) goto done;
            ptrs[k] = v[nv].len ? v[nv].buf : NULL;
            nv++;
        }
        a->edit_of = ptrs[0], a->edit_off = ptrs[1], a->edit_tok = ptrs[2], a->edit_unchanged = ptrs[3];
    }
    if (seen != Py_None) {
        if (view(seen, &v[nv], 4, n, 0, "expect_seen") < 0) goto done;
        a->expect_seen = v[nv++].buf;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ((submit_fn)bd->fn)(a, (int)n, (uint64_t)stamp);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(iO)", rc, buf);
done:
    while (nv) PyBuffer_Release(&v[--nv]);
    Py_DECREF(buf);
    return result;
}

/* finish_rows(scratch, held, timeout_s, closed) -> int: see CPool.finish_rows. */
static PyObject *finish(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    bound_t *bd = (bound_t *)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "finish_rows takes 4 arguments");
        return NULL;
    }
    PyObject *n_obj = PyObject_GetAttr(args[0], s_n);
    if (!n_obj) return NULL;
    long n = PyLong_AsLong(n_obj);
    Py_DECREF(n_obj);
    double timeout_us = PyFloat_AsDouble(args[2]) * 1e6;
    int closed = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || closed < 0) return NULL;
    if (n < 0 || n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "bad row count");
        return NULL;
    }
    uint8_t *scratch = kept_view(bd, K_SCRATCH, K_SCRATCH2, args[1], 1, 8 + 22 * (Py_ssize_t)n, 1, "scratch");
    if (!scratch) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ((finish_fn)bd->fn)(closed ? NULL : bd->target, scratch, (int)n, timeout_us);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyMethodDef submit_def = {"submit_rows", (PyCFunction)(void (*)(void))submit, METH_FASTCALL,
                                 "CPool.submit_rows, in C"};
static PyMethodDef finish_def = {"finish_rows", (PyCFunction)(void (*)(void))finish, METH_FASTCALL,
                                 "CPool.finish_rows, in C"};

static PyObject *make_bound(PyObject *const *args, Py_ssize_t nargs, PyMethodDef *def) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "takes two addresses");
        return NULL;
    }
    void *target = PyLong_AsVoidPtr(args[0]), *fn = PyLong_AsVoidPtr(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (!target || !fn) {
        PyErr_SetString(PyExc_ValueError, "a NULL address");
        return NULL;
    }
    bound_t *bd = PyObject_New(bound_t, &bound_type);
    if (!bd) return NULL;
    bd->target = target, bd->fn = fn;
    memset(bd->kept, 0, sizeof bd->kept);
    PyObject *f = PyCFunction_New(def, (PyObject *)bd);
    Py_DECREF(bd);   /* the function holds it */
    return f;
}

/* submitter(args struct address, aicirt_rows_submit's address) -> submit_rows */
static PyObject *submitter(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    return make_bound(args, nargs, &submit_def);
}

/* finisher(pool address, aicirt_rows_finish's address) -> finish_rows */
static PyObject *finisher(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    return make_bound(args, nargs, &finish_def);
}

static PyMethodDef methods[] = {
    {"submitter", (PyCFunction)(void (*)(void))submitter, METH_FASTCALL, "submit_rows bound to a pool's args"},
    {"finisher", (PyCFunction)(void (*)(void))finisher, METH_FASTCALL, "finish_rows bound to a pool"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "aicirt_pyrows", NULL, -1, methods};

PyMODINIT_FUNC PyInit_aicirt_pyrows(void) {
    if (PyType_Ready(&bound_type) < 0) return NULL;
    static const char *edit_names[4] = {"of_row", "offsets", "tokens", "unchanged"};
    if (!(s_n = PyUnicode_InternFromString("n")) || !(s_buf = PyUnicode_InternFromString("buf"))) return NULL;
    for (int k = 0; k < 4; k++)
        if (!(s_edit[k] = PyUnicode_InternFromString(edit_names[k]))) return NULL;
    return PyModule_Create(&module);
}
