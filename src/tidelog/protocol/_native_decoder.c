/*
 * Native decoders for tidelog's generated Kafka message codecs.
 *
 * tools/gen_protocol.py emits, next to every generated pure-Python decoder, a compact
 * "program" describing the same (struct, version): the fields in wire order with their kinds,
 * the known tagged fields, and the defaults of the fields absent in that version. program()
 * compiles that description once, at import; a Program is then called like the Python decoder
 * it replaces, ``prog(buf, pos, n) -> (message, end)``, and entry() wraps a version table as
 * ``decode(version, buf, pos=0) -> (message, end)``, the generated modules' decode_request /
 * decode_response.
 *
 * Results equal the Python decoders' exactly: the same slotted dataclasses (built with tp_alloc
 * and filled through their member-descriptor offsets, without running __init__), the same field
 * types (records as memoryview slices of the input, strings as str, uuid.UUID, unknown tagged
 * fields as a list of (tag, bytes) or None), the same end position. Error contract, as the
 * Python decoders: any malformed input raises tidelog.protocol.errors.DecodeError; nothing is
 * read outside [pos, n); element counts are checked against the bytes left before anything is
 * allocated for them, with the same minimum element sizes the Python decoders use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* Field kinds; tools/gen_protocol.py (NATIVE_KINDS) uses the same numbers. */
enum {
    K_INT8 = 0,
    K_INT16 = 1,
    K_INT32 = 2,
    K_INT64 = 3,
    K_UINT16 = 4,
    K_UINT32 = 5,
    K_FLOAT64 = 6,
    K_BOOL = 7,
    K_UUID = 8,
    K_STRING = 9,
    K_BYTES = 10,
    K_RECORDS = 11,
    K_STRUCT = 12,
    K_ARRAY = 13,
    K_LAST = 13
};

#define F_NULLABLE 1
#define F_COMPACT 2

static PyObject *DecodeError; /* tidelog.protocol.errors.DecodeError */
static PyObject *ZeroUUID;    /* tidelog.protocol.primitives.ZERO_UUID */
static PyTypeObject *UUIDType;
static PyObject *SafeUnknown; /* uuid.SafeUUID.unknown */
static Py_ssize_t uuid_int_off = -1, uuid_safe_off = -1;

struct Program;

typedef struct Op {
    int kind;
    int flags;
    Py_ssize_t offset;      /* slot offset in the instance (fields only) */
    int64_t tag;            /* tagged fields only */
    Py_ssize_t min_size;    /* arrays: fewest bytes an element takes */
    struct Program *prog;   /* K_STRUCT, or arrays of structs (borrowed; refs keeps it) */
    struct Op *elem;        /* arrays: the element */
} Op;

typedef struct {
    Py_ssize_t offset;
    PyObject *value;
    int factory; /* 0: the value itself, 1: a fresh list, 2: value() */
} Default;

typedef struct Program {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    int flexible;
    Py_ssize_t unknown_off;
    Py_ssize_t nops, ntagged, ndefaults;
    Op *ops;     /* regular fields, in wire order */
    Op *tagged;  /* known tagged fields, ascending tags */
    Op *elems;   /* storage for array element ops */
    Py_ssize_t nelems;
    Default *defaults;
    PyObject *refs; /* keeps the spec (classes, sub-programs, default values) alive */
} Program;

typedef struct {
    const unsigned char *b;
    PyObject *src; /* the caller's buffer object */
    PyObject *mv;  /* a 'B' memoryview of src, made on the first records field */
    int own_mv;
    _PyManagedBufferObject *mb; /* bytes src: the managed buffer records are sliced from */
} Ctx;

static PyTypeObject ProgramType;

/* ---------------------------------------------------------------------------------------- */
/* errors */

static int fail(const char *msg) {
    PyErr_SetString(DecodeError, msg);
    return -1;
}

static PyObject *failp(const char *msg) {
    PyErr_SetString(DecodeError, msg);
    return NULL;
}

#define NEED(p, k, n)                                                                          \
    do {                                                                                       \
        if ((n) - (p) < (Py_ssize_t)(k))                                                       \
            return failp("field runs past the end of the buffer");                             \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* primitives */

static inline uint16_t be16(const unsigned char *s) { return (uint16_t)((s[0] << 8) | s[1]); }
static inline uint32_t be32(const unsigned char *s) {
    return ((uint32_t)s[0] << 24) | ((uint32_t)s[1] << 16) | ((uint32_t)s[2] << 8) | s[3];
}
static inline uint64_t be64(const unsigned char *s) {
    return ((uint64_t)be32(s) << 32) | be32(s + 4);
}

/* Kafka's unsigned varint, as primitives.read_uvarint: at most 5 bytes (the fifth may carry
 * 7 bits, so values up to 2**35 - 1 are read, as the Python reader does). */
static int read_uv(const unsigned char *b, Py_ssize_t *p, Py_ssize_t n, int64_t *out) {
    uint64_t v = 0;
    int shift = 0;
    Py_ssize_t q = *p;
    for (;;) {
        if (q >= n)
            return fail("varint runs past the end of the buffer");
        unsigned char c = b[q++];
        v |= (uint64_t)(c & 0x7F) << shift;
        if (c < 128)
            break;
        shift += 7;
        if (shift > 28)
            return fail("unsigned varint longer than 5 bytes");
    }
    *p = q;
    *out = (int64_t)v;
    return 0;
}

static PyObject *make_uuid(const unsigned char *s) {
    static const unsigned char zero[16] = {0};
    if (memcmp(s, zero, 16) == 0) {
        Py_INCREF(ZeroUUID);
        return ZeroUUID;
    }
    PyObject *i = _PyLong_FromByteArray(s, 16, 0, 0);
    if (i == NULL)
        return NULL;
    if (uuid_int_off < 0) { /* not the slotted UUID we know: UUID(int=...) */
        PyObject *kw = Py_BuildValue("{sN}", "int", i);
        if (kw == NULL)
            return NULL;
        PyObject *empty = PyTuple_New(0);
        PyObject *u = empty ? PyObject_Call((PyObject *)UUIDType, empty, kw) : NULL;
        Py_XDECREF(empty);
        Py_DECREF(kw);
        return u;
    }
    PyObject *u = UUIDType->tp_alloc(UUIDType, 0);
    if (u == NULL) {
        Py_DECREF(i);
        return NULL;
    }
    *(PyObject **)((char *)u + uuid_int_off) = i;
    Py_INCREF(SafeUnknown);
    *(PyObject **)((char *)u + uuid_safe_off) = SafeUnknown;
    return u;
}

static PyObject *ctx_mv(Ctx *c) {
    if (c->mv == NULL) {
        PyObject *m = PyMemoryView_FromObject(c->src);
        if (m == NULL)
            return NULL;
        const char *fmt = PyMemoryView_GET_BUFFER(m)->format;
        if (!(fmt == NULL || strcmp(fmt, "B") == 0)) {
            PyObject *cast = PyObject_CallMethod(m, "cast", "s", "B");
            Py_DECREF(m);
            if (cast == NULL)
                return NULL;
            m = cast;
        }
        c->mv = m;
        c->own_mv = 1;
    }
    return c->mv;
}

/* Record data is returned as memoryview slices of the input, which through
 * PySequence_GetSlice costs a slice object and two ints per record. fast_slice() builds the
 * slice the way memoryview's own memory_subscript does (a new view on the same managed buffer),
 * for the one layout used here: 1-D, unstrided, itemsize 1. It is enabled only if, at import,
 * its result matches memory_subscript's field for field (check_fast_slice), else every slice
 * goes through PySequence_GetSlice. */
static int fast_slice_ok = 0;

static int sliceable(PyObject *m) {
    if (Py_TYPE(m) != &PyMemoryView_Type)
        return 0;
    PyMemoryViewObject *v = (PyMemoryViewObject *)m;
    const Py_buffer *src = &v->view;
    return !(v->flags & _Py_MEMORYVIEW_RELEASED) && !(v->mbuf->flags & _Py_MANAGED_BUFFER_RELEASED) &&
           src->ndim == 1 && src->itemsize == 1 && src->shape != NULL && src->strides != NULL &&
           src->strides[0] == 1 && src->suboffsets == NULL;
}

/* A view of src[start:start + len] on the managed buffer mbuf, as mbuf_add_view + init_slice
 * make it. */
static PyObject *slice_from(_PyManagedBufferObject *mbuf, const Py_buffer *src,
                            Py_ssize_t start, Py_ssize_t len) {
    PyMemoryViewObject *mv = PyObject_GC_NewVar(PyMemoryViewObject, &PyMemoryView_Type, 3);
    if (mv == NULL)
        return NULL;
    Py_buffer *dest = &mv->view;
    mv->hash = -1;
    mv->exports = 0;
    mv->weakreflist = NULL;
    dest->obj = src->obj; /* not a reference: the managed buffer holds it */
    dest->buf = (char *)src->buf + start;
    dest->len = len;
    dest->itemsize = 1;
    dest->readonly = src->readonly;
    dest->format = src->format ? src->format : "B";
    dest->internal = src->internal;
    dest->ndim = 1;
    dest->shape = mv->ob_array;
    dest->strides = mv->ob_array + 1;
    dest->suboffsets = NULL;
    dest->shape[0] = len;
    dest->strides[0] = 1;
    mv->flags = _Py_MEMORYVIEW_C | _Py_MEMORYVIEW_FORTRAN;
    mv->mbuf = mbuf;
    Py_INCREF(mbuf);
    mbuf->exports++;
    PyObject_GC_Track((PyObject *)mv);
    return (PyObject *)mv;
}

static PyObject *fast_slice(PyObject *m, Py_ssize_t start, Py_ssize_t len) {
    PyMemoryViewObject *base = (PyMemoryViewObject *)m;
    return slice_from(base->mbuf, &base->view, start, len);
}

/* The type of memoryviews' managed buffers, read off a memoryview at import: CPython 3.13 no
 * longer exports _PyManagedBuffer_Type itself. */
static PyTypeObject *managed_buffer_type = NULL;

static int find_managed_buffer_type(void) {
    PyObject *data = PyBytes_FromString("x");
    PyObject *view = data ? PyMemoryView_FromObject(data) : NULL;
    if (view != NULL && Py_TYPE(view) == &PyMemoryView_Type)
        managed_buffer_type = Py_TYPE((PyObject *)((PyMemoryViewObject *)view)->mbuf);
    Py_XDECREF(view);
    Py_XDECREF(data);
    PyErr_Clear();
    return managed_buffer_type != NULL;
}

/* The managed buffer memoryview(src) would hold, as _PyManagedBuffer_FromObject makes it:
 * slicing records straight from it saves building memoryview(src) itself. */
static _PyManagedBufferObject *new_mbuf(PyObject *src) {
    _PyManagedBufferObject *mb = PyObject_GC_New(_PyManagedBufferObject, managed_buffer_type);
    if (mb == NULL)
        return NULL;
    mb->flags = 0;
    mb->exports = 0;
    mb->master.obj = NULL;
    PyObject_GC_Track((PyObject *)mb);
    if (PyObject_GetBuffer(src, &mb->master, PyBUF_FULL_RO) < 0) {
        mb->master.obj = NULL;
        Py_DECREF(mb);
        return NULL;
    }
    return mb;
}

static int fast_mbuf_ok = 0;

static PyObject *slice_of(PyObject *m, Py_ssize_t start, Py_ssize_t len) {
    if (fast_slice_ok && sliceable(m))
        return fast_slice(m, start, len);
    return PySequence_GetSlice(m, start, start + len);
}

static int same_view(PyObject *a, PyObject *b) {
    PyMemoryViewObject *x = (PyMemoryViewObject *)a, *y = (PyMemoryViewObject *)b;
    const Py_buffer *u = &x->view, *v = &y->view;
    return Py_TYPE(a) == Py_TYPE(b) && Py_SIZE(a) == Py_SIZE(b) && x->mbuf == y->mbuf &&
           x->hash == y->hash && x->flags == y->flags && x->exports == y->exports &&
           u->obj == v->obj && u->buf == v->buf && u->len == v->len &&
           u->itemsize == v->itemsize && u->readonly == v->readonly && u->ndim == v->ndim &&
           strcmp(u->format, v->format) == 0 && u->internal == v->internal &&
           u->shape == x->ob_array && v->shape == y->ob_array && u->shape[0] == v->shape[0] &&
           u->strides == x->ob_array + 1 && v->strides == y->ob_array + 1 &&
           u->strides[0] == v->strides[0] && u->suboffsets == NULL && v->suboffsets == NULL &&
           x->weakreflist == NULL && y->weakreflist == NULL;
}

/* Slices from new_mbuf(bytes) equal memoryview(bytes)[a:b] in every field but the (distinct)
 * managed buffer, whose master buffer must equal memoryview(bytes)'s. */
static int check_fast_mbuf(void) {
    PyObject *data = PyBytes_FromString("0123456789abcdef");
    PyObject *base = data ? PyMemoryView_FromObject(data) : NULL;
    PyObject *a = base ? PySequence_GetSlice(base, 3, 11) : NULL;
    _PyManagedBufferObject *mb = a ? new_mbuf(data) : NULL;
    PyObject *b = mb ? slice_from(mb, &mb->master, 3, 8) : NULL;
    int ok = 0;
    if (b != NULL && Py_TYPE(a) == &PyMemoryView_Type) {
        PyMemoryViewObject *x = (PyMemoryViewObject *)a, *y = (PyMemoryViewObject *)b;
        const Py_buffer *m1 = &x->mbuf->master, *m2 = &mb->master;
        /* compare with the mbuf pointers made equal */
        _PyManagedBufferObject *saved = y->mbuf;
        y->mbuf = x->mbuf;
        ok = same_view(a, b);
        y->mbuf = saved;
        ok = ok && m1->obj == m2->obj && m1->buf == m2->buf && m1->len == m2->len &&
             m1->readonly == m2->readonly && m1->itemsize == m2->itemsize &&
             m1->ndim == m2->ndim && m1->format && m2->format &&
             strcmp(m1->format, m2->format) == 0 && x->mbuf->flags == mb->flags &&
             mb->exports == 1 && PyObject_RichCompareBool(a, b, Py_EQ) == 1;
    }
    Py_XDECREF(b);
    /* the last view gone, the managed buffer releases its export */
    ok = ok && mb != NULL && mb->exports == 0 && (mb->flags & _Py_MANAGED_BUFFER_RELEASED);
    Py_XDECREF((PyObject *)mb);
    Py_XDECREF(a);
    Py_XDECREF(base);
    Py_XDECREF(data);
    PyErr_Clear();
    return ok;
}

static int check_fast_slice(void) {
    PyObject *data = PyBytes_FromString("0123456789abcdef");
    PyObject *base = data ? PyMemoryView_FromObject(data) : NULL;
    PyObject *a = NULL, *b = NULL;
    int ok = 0;
    if (base != NULL && sliceable(base)) {
        Py_ssize_t exports = ((PyMemoryViewObject *)base)->mbuf->exports;
        a = PySequence_GetSlice(base, 3, 11);
        b = a ? fast_slice(base, 3, 8) : NULL;
        ok = a && b && same_view(a, b) &&
             ((PyMemoryViewObject *)base)->mbuf->exports == exports + 2 &&
             PyObject_RichCompareBool(a, b, Py_EQ) == 1;
    }
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(base);
    Py_XDECREF(data);
    PyErr_Clear();
    return ok;
}

static PyObject *decode_utf8(const unsigned char *s, Py_ssize_t len) {
    PyObject *r = PyUnicode_DecodeUTF8((const char *)s, len, NULL);
    if (r == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        return failp("string is not valid UTF-8");
    }
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* decoding */

static PyObject *decode_struct(Ctx *c, Program *prog, Py_ssize_t *pp, Py_ssize_t n);
static PyObject *decode_array(Ctx *c, const Op *op, Py_ssize_t *pp, Py_ssize_t n);

/* A string, bytes or records value: compact (uvarint length + 1, 0 = null) or legacy
 * (int16 length for strings, int32 otherwise, -1 = null). */
static PyObject *decode_blob(Ctx *c, const Op *op, Py_ssize_t *pp, Py_ssize_t n) {
    const unsigned char *b = c->b;
    Py_ssize_t p = *pp;
    int64_t len;
    if (op->flags & F_COMPACT) {
        if (read_uv(b, &p, n, &len) < 0)
            return NULL;
        len -= 1;
    } else if (op->kind == K_STRING) {
        NEED(p, 2, n);
        len = (int16_t)be16(b + p);
        p += 2;
    } else {
        NEED(p, 4, n);
        len = (int32_t)be32(b + p);
        p += 4;
    }
    if (len < 0) {
        if (len == -1 && (op->flags & F_NULLABLE)) {
            *pp = p;
            Py_RETURN_NONE;
        }
        return failp("null or negative length in a non-nullable field");
    }
    if (len > n - p)
        return failp("field runs past the end of the buffer");
    PyObject *r;
    if (op->kind == K_STRING)
        r = decode_utf8(b + p, (Py_ssize_t)len);
    else if (op->kind == K_BYTES)
        r = PyBytes_FromStringAndSize((const char *)b + p, (Py_ssize_t)len);
    else {
        if (c->mv == NULL && fast_mbuf_ok && PyBytes_CheckExact(c->src)) {
            if (c->mb != NULL && (c->mb->flags & _Py_MANAGED_BUFFER_RELEASED))
                Py_CLEAR(c->mb); /* every slice of it died already: it let go of src */
            if (c->mb == NULL && (c->mb = new_mbuf(c->src)) == NULL)
                return NULL;
            r = slice_from(c->mb, &c->mb->master, p, (Py_ssize_t)len);
        } else {
            PyObject *mv = ctx_mv(c);
            r = mv ? slice_of(mv, p, (Py_ssize_t)len) : NULL;
        }
    }
    if (r != NULL)
        *pp = p + (Py_ssize_t)len;
    return r;
}

static PyObject *decode_value(Ctx *c, const Op *op, Py_ssize_t *pp, Py_ssize_t n);

static PyObject *decode_array(Ctx *c, const Op *op, Py_ssize_t *pp, Py_ssize_t n) {
    const unsigned char *b = c->b;
    Py_ssize_t p = *pp;
    int64_t cnt;
    if (op->flags & F_COMPACT) {
        if (read_uv(b, &p, n, &cnt) < 0)
            return NULL;
        cnt -= 1;
    } else {
        NEED(p, 4, n);
        cnt = (int32_t)be32(b + p);
        p += 4;
    }
    if (cnt < 0) {
        if (op->flags & F_NULLABLE) {
            if (cnt != -1)
                return failp("invalid array length");
            *pp = p;
            Py_RETURN_NONE;
        }
        return failp("null or negative length in a non-nullable array");
    }
    /* never allocate more elements than the bytes left could describe */
    if (cnt * (int64_t)op->min_size > (int64_t)(n - p))
        return failp("array length larger than the buffer");
    const Op *el = op->elem;
    /* the unrolled integer loops below read without further checks: make sure they can */
    static const int8_t fixed_size[] = {1, 2, 4, 8};
    if (el->kind <= K_INT64 && cnt * fixed_size[el->kind] > (int64_t)(n - p))
        return failp("array length larger than the buffer");
    PyObject *list = PyList_New((Py_ssize_t)cnt);
    if (list == NULL)
        return NULL;
    Py_ssize_t i;
    switch (el->kind) {
    case K_INT8:
        for (i = 0; i < cnt; i++) {
            PyObject *v = PyLong_FromLong((int8_t)b[p]);
            if (v == NULL)
                goto error;
            PyList_SET_ITEM(list, i, v);
            p += 1;
        }
        break;
    case K_INT16:
        for (i = 0; i < cnt; i++) {
            PyObject *v = PyLong_FromLong((int16_t)be16(b + p));
            if (v == NULL)
                goto error;
            PyList_SET_ITEM(list, i, v);
            p += 2;
        }
        break;
    case K_INT32:
        for (i = 0; i < cnt; i++) {
            PyObject *v = PyLong_FromLong((int32_t)be32(b + p));
            if (v == NULL)
                goto error;
            PyList_SET_ITEM(list, i, v);
            p += 4;
        }
        break;
    case K_INT64:
        for (i = 0; i < cnt; i++) {
            PyObject *v = PyLong_FromLongLong((int64_t)be64(b + p));
            if (v == NULL)
                goto error;
            PyList_SET_ITEM(list, i, v);
            p += 8;
        }
        break;
    case K_STRUCT:
        if (!(el->flags & F_NULLABLE)) { /* elements never are: straight to the struct */
            for (i = 0; i < cnt; i++) {
                PyObject *v = decode_struct(c, el->prog, &p, n);
                if (v == NULL)
                    goto error;
                PyList_SET_ITEM(list, i, v);
            }
            break;
        }
        /* fall through */
    default:
        for (i = 0; i < cnt; i++) {
            PyObject *v = decode_value(c, el, &p, n);
            if (v == NULL)
                goto error;
            PyList_SET_ITEM(list, i, v);
        }
    }
    *pp = p;
    return list;
error:
    Py_DECREF(list);
    return NULL;
}

static PyObject *decode_value(Ctx *c, const Op *op, Py_ssize_t *pp, Py_ssize_t n) {
    const unsigned char *b = c->b;
    Py_ssize_t p = *pp;
    PyObject *r;
    switch (op->kind) {
    case K_INT8:
        NEED(p, 1, n);
        r = PyLong_FromLong((int8_t)b[p]);
        p += 1;
        break;
    case K_INT16:
        NEED(p, 2, n);
        r = PyLong_FromLong((int16_t)be16(b + p));
        p += 2;
        break;
    case K_INT32:
        NEED(p, 4, n);
        r = PyLong_FromLong((int32_t)be32(b + p));
        p += 4;
        break;
    case K_INT64:
        NEED(p, 8, n);
        r = PyLong_FromLongLong((int64_t)be64(b + p));
        p += 8;
        break;
    case K_UINT16:
        NEED(p, 2, n);
        r = PyLong_FromLong(be16(b + p));
        p += 2;
        break;
    case K_UINT32:
        NEED(p, 4, n);
        r = PyLong_FromUnsignedLong(be32(b + p));
        p += 4;
        break;
    case K_FLOAT64: {
        NEED(p, 8, n);
        uint64_t u = be64(b + p);
        double d;
        memcpy(&d, &u, 8);
        r = PyFloat_FromDouble(d);
        p += 8;
        break;
    }
    case K_BOOL:
        NEED(p, 1, n);
        r = b[p] ? Py_True : Py_False;
        Py_INCREF(r);
        p += 1;
        break;
    case K_UUID:
        NEED(p, 16, n);
        r = make_uuid(b + p);
        p += 16;
        break;
    case K_STRING:
    case K_BYTES:
    case K_RECORDS:
        return decode_blob(c, op, pp, n);
    case K_ARRAY:
        return decode_array(c, op, pp, n);
    case K_STRUCT:
        if (op->flags & F_NULLABLE) {
            NEED(p, 1, n);
            int8_t marker = (int8_t)b[p];
            p += 1;
            if (marker < 0) {
                *pp = p;
                Py_RETURN_NONE;
            }
        }
        r = decode_struct(c, op->prog, &p, n);
        break;
    default:
        return failp("bad native decoder program");
    }
    if (r != NULL)
        *pp = p;
    return r;
}

static inline void set_slot(PyObject *obj, Py_ssize_t off, PyObject *v) {
    PyObject **slot = (PyObject **)((char *)obj + off);
    PyObject *old = *slot;
    *slot = v;
    Py_XDECREF(old);
}

/* A tagged-field section (the first byte already known to be non-zero). */
static int decode_tags(Ctx *c, Program *prog, PyObject *obj, Py_ssize_t *pp, Py_ssize_t n) {
    const unsigned char *b = c->b;
    Py_ssize_t p = *pp;
    int64_t count, last = -1;
    if (read_uv(b, &p, n, &count) < 0)
        return -1;
    if (count > n - p)
        return fail("tagged field count larger than the buffer");
    PyObject *unknown = NULL;
    Py_ssize_t k = 0; /* next known tag to look at (both ascending) */
    for (int64_t i = 0; i < count; i++) {
        int64_t tag, size;
        if (read_uv(b, &p, n, &tag) < 0 || read_uv(b, &p, n, &size) < 0)
            goto error;
        if (size > n - p) {
            fail("tagged field runs past the end of the buffer");
            goto error;
        }
        if (tag <= last) {
            fail("tagged fields out of order");
            goto error;
        }
        last = tag;
        Py_ssize_t end = p + (Py_ssize_t)size;
        while (k < prog->ntagged && prog->tagged[k].tag < tag)
            k++;
        if (k < prog->ntagged && prog->tagged[k].tag == tag) {
            const Op *op = &prog->tagged[k];
            Py_ssize_t q = p;
            PyObject *v = decode_value(c, op, &q, end);
            if (v == NULL)
                goto error;
            if (q != end) {
                Py_DECREF(v);
                fail("tagged field size mismatch");
                goto error;
            }
            set_slot(obj, op->offset, v);
        } else {
            if (unknown == NULL && (unknown = PyList_New(0)) == NULL)
                goto error;
            PyObject *item = Py_BuildValue("(Ly#)", (long long)tag, (const char *)b + p,
                                           (Py_ssize_t)size);
            if (item == NULL)
                goto error;
            int rc = PyList_Append(unknown, item);
            Py_DECREF(item);
            if (rc < 0)
                goto error;
        }
        p = end;
    }
    if (unknown != NULL)
        set_slot(obj, prog->unknown_off, unknown);
    *pp = p;
    return 0;
error:
    Py_XDECREF(unknown);
    return -1;
}

static PyObject *decode_struct(Ctx *c, Program *prog, Py_ssize_t *pp, Py_ssize_t n) {
    Py_ssize_t p = *pp;
    PyTypeObject *cls = prog->cls;
    PyObject *obj = cls->tp_alloc(cls, 0);
    if (obj == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < prog->ndefaults; i++) {
        const Default *d = &prog->defaults[i];
        PyObject *v;
        if (d->factory == 0) {
            v = d->value;
            Py_INCREF(v);
        } else if (d->factory == 1) {
            v = PyList_New(0);
        } else {
            v = PyObject_CallNoArgs(d->value);
        }
        if (v == NULL)
            goto error;
        *(PyObject **)((char *)obj + d->offset) = v;
    }
    Py_INCREF(Py_None);
    *(PyObject **)((char *)obj + prog->unknown_off) = Py_None;
    const unsigned char *b = c->b;
    for (Py_ssize_t i = 0; i < prog->nops; i++) {
        const Op *op = &prog->ops[i];
        PyObject *v;
        /* the most common fields inline, the rest through decode_value */
        if (op->kind == K_INT32 && n - p >= 4) {
            v = PyLong_FromLong((int32_t)be32(b + p));
            p += 4;
        } else if (op->kind == K_INT16 && n - p >= 2) {
            v = PyLong_FromLong((int16_t)be16(b + p));
            p += 2;
        } else if (op->kind == K_INT64 && n - p >= 8) {
            v = PyLong_FromLongLong((int64_t)be64(b + p));
            p += 8;
        } else if (op->kind >= K_STRING && op->kind <= K_RECORDS) {
            v = decode_blob(c, op, &p, n);
        } else if (op->kind == K_ARRAY) {
            v = decode_array(c, op, &p, n);
        } else {
            v = decode_value(c, op, &p, n);
        }
        if (v == NULL)
            goto error;
        *(PyObject **)((char *)obj + op->offset) = v;
    }
    if (prog->flexible) {
        if (p >= n) {
            fail("tagged fields run past the end of the buffer");
            goto error;
        }
        if (b[p] == 0)
            p += 1;
        else if (decode_tags(c, prog, obj, &p, n) < 0)
            goto error;
    }
    *pp = p;
    return obj;
error:
    Py_DECREF(obj);
    return NULL;
}

/* Acquire buf, decode one prog at pos, release. */
static PyObject *run(Program *prog, PyObject *src, Py_ssize_t pos, Py_ssize_t n) {
    Py_buffer view;
    if (PyBytes_CheckExact(src)) {
        /* immutable and held by the caller for the call: no buffer export needed */
        view.obj = NULL;
        view.buf = PyBytes_AS_STRING(src);
        view.len = PyBytes_GET_SIZE(src);
    } else if (PyObject_GetBuffer(src, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Ctx c = {(const unsigned char *)view.buf, src, NULL, 0, NULL};
    if (PyMemoryView_Check(src)) { /* records are sliced from it, as in Python */
        const Py_buffer *v = PyMemoryView_GET_BUFFER(src);
        if (v->ndim == 1 && v->format != NULL && strcmp(v->format, "B") == 0)
            c.mv = src;
    }
    PyObject *result = NULL;
    if (n < 0 || n > view.len)
        n = view.len;
    if (pos < 0 || pos > n) {
        fail("position outside the buffer");
    } else {
        Py_ssize_t p = pos;
        PyObject *obj = decode_struct(&c, prog, &p, n);
        if (obj != NULL) {
            result = PyTuple_New(2);
            PyObject *end = PyLong_FromSsize_t(p);
            if (result == NULL || end == NULL) {
                Py_XDECREF(result);
                Py_XDECREF(end);
                Py_DECREF(obj);
                result = NULL;
            } else {
                PyTuple_SET_ITEM(result, 0, obj);
                PyTuple_SET_ITEM(result, 1, end);
            }
        }
    }
    if (c.own_mv)
        Py_DECREF(c.mv);
    Py_XDECREF(c.mb);
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    return result;
}

/* ---------------------------------------------------------------------------------------- */
/* Program objects: prog(buf, pos, n) -> (message, end), like a generated _d_X_vN */

static PyObject *program_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_SetString(PyExc_TypeError, "a native decoder takes no keyword arguments");
        return NULL;
    }
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "a native decoder takes (buf, pos=0, n=len(buf))");
        return NULL;
    }
    Py_ssize_t pos = 0, n = -1;
    if (nargs >= 2 && (pos = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())
        return NULL;
    if (nargs >= 3 && (n = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred())
        return NULL;
    return run((Program *)self, args[0], pos, n);
}

static int program_traverse(Program *self, visitproc visit, void *arg) {
    Py_VISIT(self->refs);
    Py_VISIT(self->cls);
    return 0;
}

/* No tp_clear: a Program is never left half-cleared (callable with its class or sub-programs
 * gone); the reference cycles it sits in (class -> methods -> module globals -> Program) are
 * broken by clearing the dicts and functions in them. */
static void program_dealloc(Program *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->refs);
    Py_CLEAR(self->cls);
    PyMem_Free(self->ops);
    PyMem_Free(self->tagged);
    PyMem_Free(self->elems);
    PyMem_Free(self->defaults);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *program_repr(Program *self) {
    return PyUnicode_FromFormat("<native decoder of %s>", self->cls ? self->cls->tp_name : "?");
}

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tidelog.protocol._native_decoder.Program",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Program, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)program_traverse,
    .tp_dealloc = (destructor)program_dealloc,
    .tp_repr = (reprfunc)program_repr,
    .tp_doc = "A compiled decoder of one message struct version: prog(buf, pos=0, n=len(buf)).",
};

/* ---------------------------------------------------------------------------------------- */
/* compiling a program */

/* The offset of a writable object slot `name` of cls (a member descriptor). */
static Py_ssize_t slot_offset(PyTypeObject *cls, PyObject *name) {
    PyObject *descr = PyDict_GetItemWithError(cls->tp_dict, name);
    if (descr == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s has no slot %R", cls->tp_name, name);
        return -1;
    }
    if (Py_TYPE(descr) != &PyMemberDescr_Type) {
        PyErr_Format(PyExc_TypeError, "%s.%U is not a slot", cls->tp_name, name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%s.%U is not a writable object slot", cls->tp_name, name);
        return -1;
    }
    return m->offset;
}

/* Fill *op from a spec tuple (name, kind, flags, arg, min_size); name is None for elements.
 * Array element ops are taken from *elems (counted beforehand). */
static int compile_op(PyTypeObject *cls, PyObject *spec, Op *op, Op **elems, Op *elems_end,
                      PyObject *refs) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) {
        PyErr_SetString(PyExc_TypeError, "op spec must be (name, kind, flags, arg, min_size)");
        return -1;
    }
    PyObject *name = PyTuple_GET_ITEM(spec, 0);
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 1));
    long flags = PyLong_AsLong(PyTuple_GET_ITEM(spec, 2));
    PyObject *arg = PyTuple_GET_ITEM(spec, 3);
    Py_ssize_t min_size = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 4));
    if (PyErr_Occurred())
        return -1;
    if (kind < 0 || kind > K_LAST || min_size < 0) {
        PyErr_SetString(PyExc_ValueError, "bad op kind or size");
        return -1;
    }
    memset(op, 0, sizeof(*op));
    op->kind = (int)kind;
    op->flags = (int)flags;
    op->min_size = min_size;
    op->offset = -1;
    if (name != Py_None && (op->offset = slot_offset(cls, name)) < 0)
        return -1;
    if (kind == K_STRUCT) {
        if (!PyObject_TypeCheck(arg, &ProgramType)) {
            PyErr_SetString(PyExc_TypeError, "a struct op needs a Program");
            return -1;
        }
        op->prog = (Program *)arg;
        if (PyList_Append(refs, arg) < 0)
            return -1;
    } else if (kind == K_ARRAY) {
        /* as the Python decoders: a count never exceeds the bytes left, even if an element
         * could be empty */
        if (op->min_size < 1)
            op->min_size = 1;
        if (*elems >= elems_end) {
            PyErr_SetString(PyExc_ValueError, "too many nested arrays");
            return -1;
        }
        Op *el = (*elems)++;
        op->elem = el;
        if (compile_op(cls, arg, el, elems, elems_end, refs) < 0)
            return -1;
        if (el->kind == K_ARRAY || el->offset != -1) {
            PyErr_SetString(PyExc_ValueError, "array elements are unnamed non-arrays");
            return -1;
        }
    }
    return 0;
}

static Py_ssize_t count_arrays(PyObject *ops, int tagged) {
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ops); i++) {
        PyObject *spec = PyTuple_GET_ITEM(ops, i);
        if (tagged) {
            if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2)
                return -1;
            spec = PyTuple_GET_ITEM(spec, 1);
        }
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5)
            return -1;
        if (PyLong_Check(PyTuple_GET_ITEM(spec, 1)) &&
            PyLong_AsLong(PyTuple_GET_ITEM(spec, 1)) == K_ARRAY)
            total++;
    }
    return total;
}

PyDoc_STRVAR(program_doc,
             "program(cls, ops, tagged, defaults, flexible) -> Program\n\n"
             "ops: ((slot, kind, flags, arg, min_size), ...) in wire order; tagged: ((tag, op), "
             "...) ascending; defaults: ((slot, value, factory), ...) for every other field "
             "(factory 0: value, 1: a fresh list, 2: value()).");

static PyObject *program_new(PyObject *module, PyObject *args) {
    PyObject *cls, *ops, *tagged, *defaults;
    int flexible;
    if (!PyArg_ParseTuple(args, "O!O!O!O!p:program", &PyType_Type, &cls, &PyTuple_Type, &ops,
                          &PyTuple_Type, &tagged, &PyTuple_Type, &defaults, &flexible))
        return NULL;
    PyTypeObject *tp = (PyTypeObject *)cls;
    Py_ssize_t na = count_arrays(ops, 0), nt = count_arrays(tagged, 1);
    if (na < 0 || nt < 0) {
        PyErr_SetString(PyExc_TypeError, "malformed op specs");
        return NULL;
    }
    Program *prog = PyObject_GC_New(Program, &ProgramType);
    if (prog == NULL)
        return NULL;
    prog->vectorcall = program_vectorcall;
    Py_INCREF(tp);
    prog->cls = tp;
    prog->flexible = flexible;
    prog->nops = PyTuple_GET_SIZE(ops);
    prog->ntagged = PyTuple_GET_SIZE(tagged);
    prog->ndefaults = PyTuple_GET_SIZE(defaults);
    prog->nelems = na + nt;
    prog->ops = PyMem_Calloc(prog->nops + 1, sizeof(Op));
    prog->tagged = PyMem_Calloc(prog->ntagged + 1, sizeof(Op));
    prog->elems = PyMem_Calloc(prog->nelems + 1, sizeof(Op));
    prog->defaults = PyMem_Calloc(prog->ndefaults + 1, sizeof(Default));
    prog->refs = PyList_New(0);
    PyObject_GC_Track(prog);
    if (!prog->ops || !prog->tagged || !prog->elems || !prog->defaults || !prog->refs) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto error;
    }
    if (PyList_Append(prog->refs, ops) < 0 || PyList_Append(prog->refs, tagged) < 0 ||
        PyList_Append(prog->refs, defaults) < 0)
        goto error;
    Op *elems = prog->elems, *elems_end = prog->elems + prog->nelems;
    for (Py_ssize_t i = 0; i < prog->nops; i++) {
        if (compile_op(tp, PyTuple_GET_ITEM(ops, i), &prog->ops[i], &elems, elems_end,
                       prog->refs) < 0)
            goto error;
        if (prog->ops[i].offset < 0) {
            PyErr_SetString(PyExc_ValueError, "a field op needs a slot name");
            goto error;
        }
    }
    int64_t last = -1;
    for (Py_ssize_t i = 0; i < prog->ntagged; i++) {
        PyObject *t = PyTuple_GET_ITEM(tagged, i);
        long long tag = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
        if (tag == -1 && PyErr_Occurred())
            goto error;
        if (tag <= last) {
            PyErr_SetString(PyExc_ValueError, "tagged ops must have ascending tags");
            goto error;
        }
        last = tag;
        if (compile_op(tp, PyTuple_GET_ITEM(t, 1), &prog->tagged[i], &elems, elems_end,
                       prog->refs) < 0)
            goto error;
        if (prog->tagged[i].offset < 0) {
            PyErr_SetString(PyExc_ValueError, "a tagged op needs a slot name");
            goto error;
        }
        prog->tagged[i].tag = tag;
    }
    for (Py_ssize_t i = 0; i < prog->ndefaults; i++) {
        PyObject *d = PyTuple_GET_ITEM(defaults, i);
        if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 3) {
            PyErr_SetString(PyExc_TypeError, "default spec must be (slot, value, factory)");
            goto error;
        }
        Default *df = &prog->defaults[i];
        if ((df->offset = slot_offset(tp, PyTuple_GET_ITEM(d, 0))) < 0)
            goto error;
        df->value = PyTuple_GET_ITEM(d, 1); /* kept alive by refs (defaults) */
        long f = PyLong_AsLong(PyTuple_GET_ITEM(d, 2));
        if (f == -1 && PyErr_Occurred())
            goto error;
        if (f < 0 || f > 2 || (f == 2 && !PyCallable_Check(df->value))) {
            PyErr_SetString(PyExc_ValueError, "bad default factory");
            goto error;
        }
        df->factory = (int)f;
    }
    PyObject *uname = PyUnicode_FromString("unknown_tagged_fields");
    if (uname == NULL)
        goto error;
    prog->unknown_off = slot_offset(tp, uname);
    Py_DECREF(uname);
    if (prog->unknown_off < 0)
        goto error;
    /* every slot must be written exactly once per instance: check that the three lists cover
     * the slots of the class without overlap */
    Py_ssize_t nslots = prog->nops + prog->ndefaults + 1;
    Py_ssize_t member_slots = 0;
    for (PyMemberDef *m = tp->tp_members; m && m->name; m++)
        if (m->type == T_OBJECT_EX)
            member_slots++;
    if (nslots != member_slots) {
        PyErr_Format(PyExc_ValueError,
                     "program for %s covers %zd slots, the class has %zd", tp->tp_name, nslots,
                     member_slots);
        goto error;
    }
    Py_ssize_t *offs = PyMem_Calloc(nslots, sizeof(Py_ssize_t));
    if (offs == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < prog->nops; i++)
        offs[k++] = prog->ops[i].offset;
    for (Py_ssize_t i = 0; i < prog->ndefaults; i++)
        offs[k++] = prog->defaults[i].offset;
    offs[k++] = prog->unknown_off;
    int dup = 0;
    for (Py_ssize_t i = 0; i < k && !dup; i++)
        for (Py_ssize_t j = i + 1; j < k; j++)
            if (offs[i] == offs[j]) {
                dup = 1;
                break;
            }
    /* a tagged field's slot must hold its default until the tag is seen */
    for (Py_ssize_t i = 0; i < prog->ntagged && !dup; i++) {
        int found = 0;
        for (Py_ssize_t j = 0; j < prog->ndefaults; j++)
            if (prog->defaults[j].offset == prog->tagged[i].offset)
                found = 1;
        dup = !found;
    }
    PyMem_Free(offs);
    if (dup) {
        PyErr_Format(PyExc_ValueError, "program for %s writes a slot twice or a tagged field "
                                       "has no default", tp->tp_name);
        goto error;
    }
    return (PyObject *)prog;
error:
    Py_DECREF(prog);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Entry objects: decode(version, buf, pos=0) -> (message, end), a module's decode_request */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *name;     /* e.g. 'FetchRequest' */
    PyObject *programs; /* tuple indexed by version; None below the first version */
    Py_ssize_t lo, hi;
} Entry;

static PyObject *entry_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    Entry *e = (Entry *)self;
    static const char *const names[3] = {"version", "buf", "pos"};
    PyObject *a[3] = {NULL, NULL, NULL}; /* version, buf, pos: as the Python twin's signature */
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 3)
        goto usage;
    for (Py_ssize_t i = 0; i < nargs; i++)
        a[i] = args[i];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int j = 0;
        while (j < 3 && PyUnicode_CompareWithASCIIString(key, names[j]) != 0)
            j++;
        if (j == 3 || a[j] != NULL)
            goto usage;
        a[j] = args[nargs + k];
    }
    if (a[0] == NULL || a[1] == NULL)
        goto usage;
    if (!PyLong_Check(a[0])) {
        PyErr_SetString(PyExc_TypeError, "version must be an int");
        return NULL;
    }
    int overflow;
    long long version = PyLong_AsLongLongAndOverflow(a[0], &overflow);
    if (version == -1 && PyErr_Occurred())
        return NULL;
    if (overflow || version < e->lo || version > e->hi) {
        PyErr_Format(DecodeError, "%U version %S is not defined", e->name, a[0]);
        return NULL;
    }
    Py_ssize_t pos = 0;
    if (a[2] != NULL && (pos = PyLong_AsSsize_t(a[2])) == -1 && PyErr_Occurred())
        return NULL;
    PyObject *prog = PyTuple_GET_ITEM(e->programs, (Py_ssize_t)version);
    return run((Program *)prog, a[1], pos, -1);
usage:
    PyErr_SetString(PyExc_TypeError, "decode() takes (version, buf, pos=0)");
    return NULL;
}

static int entry_traverse(Entry *self, visitproc visit, void *arg) {
    Py_VISIT(self->programs);
    return 0;
}

static void entry_dealloc(Entry *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->programs);
    Py_CLEAR(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *entry_repr(Entry *self) {
    return PyUnicode_FromFormat("<native decoder of %U v%zd-%zd>", self->name, self->lo,
                                self->hi);
}

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tidelog.protocol._native_decoder.Entry",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Entry, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)entry_traverse,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_repr = (reprfunc)entry_repr,
    .tp_doc = "decode(version, buf, pos=0) -> (message, end) over a table of native decoders.",
};

PyDoc_STRVAR(entry_doc, "entry(name, programs) -> decode(version, buf, pos=0)\n\n"
                        "programs: a tuple indexed by version, None below the first version.");

static PyObject *entry_new(PyObject *module, PyObject *args) {
    PyObject *name, *programs;
    if (!PyArg_ParseTuple(args, "UO!:entry", &name, &PyTuple_Type, &programs))
        return NULL;
    Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(programs) - 1;
    while (lo <= hi && PyTuple_GET_ITEM(programs, lo) == Py_None)
        lo++;
    if (lo > hi) {
        PyErr_SetString(PyExc_ValueError, "no programs");
        return NULL;
    }
    for (Py_ssize_t i = lo; i <= hi; i++)
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(programs, i), &ProgramType)) {
            PyErr_SetString(PyExc_TypeError, "programs must be Programs after the first");
            return NULL;
        }
    Entry *e = PyObject_GC_New(Entry, &EntryType);
    if (e == NULL)
        return NULL;
    e->vectorcall = entry_vectorcall;
    Py_INCREF(name);
    e->name = name;
    Py_INCREF(programs);
    e->programs = programs;
    e->lo = lo;
    e->hi = hi;
    PyObject_GC_Track(e);
    return (PyObject *)e;
}

/* ---------------------------------------------------------------------------------------- */
/* module */

static PyMethodDef methods[] = {
    {"program", program_new, METH_VARARGS, program_doc},
    {"entry", entry_new, METH_VARARGS, entry_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tidelog.protocol._native_decoder",
    .m_doc = "C interpreter of the generated protocol decoders' programs (see gen_protocol.py).",
    .m_size = -1,
    .m_methods = methods,
};

static PyObject *import_attr(const char *module, const char *attr) {
    PyObject *m = PyImport_ImportModule(module);
    if (m == NULL)
        return NULL;
    PyObject *a = PyObject_GetAttrString(m, attr);
    Py_DECREF(m);
    return a;
}

/* uuid.UUID is slotted ('int', 'is_safe'): build instances as UUID(bytes=...) would, without
 * running its __init__. Falls back to calling UUID(int=...) if the class is not as expected. */
static int setup_uuid(void) {
    UUIDType = (PyTypeObject *)import_attr("uuid", "UUID");
    if (UUIDType == NULL)
        return -1;
    if (!PyType_Check(UUIDType)) {
        PyErr_SetString(PyExc_TypeError, "uuid.UUID is not a class");
        return -1;
    }
    PyObject *safe = import_attr("uuid", "SafeUUID");
    if (safe == NULL)
        return -1;
    SafeUnknown = PyObject_GetAttrString(safe, "unknown");
    Py_DECREF(safe);
    if (SafeUnknown == NULL)
        return -1;
    PyObject *iname = PyUnicode_FromString("int"), *sname = PyUnicode_FromString("is_safe");
    if (iname == NULL || sname == NULL) {
        Py_XDECREF(iname);
        Py_XDECREF(sname);
        return -1;
    }
    Py_ssize_t io = slot_offset(UUIDType, iname), so = slot_offset(UUIDType, sname);
    Py_DECREF(iname);
    Py_DECREF(sname);
    if (io < 0 || so < 0) {
        PyErr_Clear();
        return 0;
    }
    uuid_int_off = io;
    uuid_safe_off = so;
    return 0;
}

PyMODINIT_FUNC PyInit__native_decoder(void) {
    if (PyType_Ready(&ProgramType) < 0 || PyType_Ready(&EntryType) < 0)
        return NULL;
    DecodeError = import_attr("tidelog.protocol.errors", "DecodeError");
    if (DecodeError == NULL)
        return NULL;
    ZeroUUID = import_attr("tidelog.protocol.primitives", "ZERO_UUID");
    if (ZeroUUID == NULL)
        return NULL;
    if (setup_uuid() < 0)
        return NULL;
    fast_slice_ok = check_fast_slice();
    fast_mbuf_ok = fast_slice_ok && find_managed_buffer_type() && check_fast_mbuf();
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "FAST_SLICE", fast_slice_ok) < 0 ||
        PyModule_AddIntConstant(m, "FAST_MBUF", fast_mbuf_ok) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ProgramType);
    if (PyModule_AddObject(m, "Program", (PyObject *)&ProgramType) < 0) {
        Py_DECREF(&ProgramType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
