/*
 * Kafka v2 records -> Arrow column buffers, for the Spark connector's read path.
 *
 * The pure-Python twin is decoder.py's _decode_into (RecordColumns of Python objects); this
 * module parses the same records section with the same checks, but writes the columns straight
 * into the buffers of Arrow arrays (int64 offsets, timestamps in microseconds, binary key/value
 * columns as validity bitmap + int32 offsets + data, optionally the headers list), so that no
 * Python object exists per record. ColumnBuilder.take() hands the buffers over as bytes; the
 * caller wraps them with pyarrow.Array.from_buffers.
 *
 * Error contract (as the Python decoder): any malformed records section raises
 * CorruptRecordError and leaves the builder as it was before the call; nothing is read outside
 * the given buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *CorruptRecordError; /* tidelog.protocol.records.batch.CorruptRecordError */

/* The smallest record: length, attributes, timestampDelta, offsetDelta, key, value, headerCount. */
#define MIN_RECORD_SIZE 7
/* Arrow's binary/string/list arrays have int32 offsets. */
#define MAX_ARROW_BYTES ((int64_t)INT32_MAX)

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra)
        cap *= 2;
    char *p = PyMem_Realloc(b->data, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (n == 0)
        return 0; /* an empty value: nothing to copy, and b->data may still be NULL */
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* A binary (or string) Arrow column: validity bitmap, int32 offsets, data. */
typedef struct {
    Buf validity; /* one bit per row, LSB first; 1 = present */
    Buf offsets;  /* int32, rows + 1 entries (the first, 0, written at reset) */
    Buf data;
    int64_t nulls;
} BinaryColumn;

typedef struct {
    PyObject_HEAD
    int include_headers;
    int64_t rows;
    Buf offsets;         /* int64 */
    Buf timestamps;      /* int64 microseconds */
    Buf timestamp_types; /* int32 */
    BinaryColumn keys;
    BinaryColumn values;
    Buf header_lists;    /* int32 list offsets into the header entries, rows + 1 */
    int64_t header_count;
    BinaryColumn header_keys;   /* utf-8, never null */
    BinaryColumn header_values;
} ColumnBuilder;

/* Every growable buffer, so that a failed append can roll them all back. */
#define N_BUFS 16

static void all_bufs(ColumnBuilder *self, Buf **out) {
    Buf *list[N_BUFS] = {
        &self->offsets, &self->timestamps, &self->timestamp_types, &self->header_lists,
        &self->keys.validity, &self->keys.offsets, &self->keys.data,
        &self->values.validity, &self->values.offsets, &self->values.data,
        &self->header_keys.validity, &self->header_keys.offsets, &self->header_keys.data,
        &self->header_values.validity, &self->header_values.offsets, &self->header_values.data,
    };
    memcpy(out, list, sizeof(list));
}

typedef struct {
    int64_t rows, header_count, key_nulls, value_nulls, hkey_nulls, hvalue_nulls;
    size_t len[N_BUFS];
} Mark;

static void mark_take(ColumnBuilder *self, Mark *m) {
    Buf *bufs[N_BUFS];
    all_bufs(self, bufs);
    for (int i = 0; i < N_BUFS; i++)
        m->len[i] = bufs[i]->len;
    m->rows = self->rows;
    m->header_count = self->header_count;
    m->key_nulls = self->keys.nulls;
    m->value_nulls = self->values.nulls;
    m->hkey_nulls = self->header_keys.nulls;
    m->hvalue_nulls = self->header_values.nulls;
}

/* A bitmap's last byte may hold bits of rolled-back rows: clear the bits from `rows` on. */
static void bitmap_clear_from(Buf *validity, int64_t rows) {
    if (rows % 8 && validity->len)
        validity->data[validity->len - 1] &= (char)((1u << (rows % 8)) - 1);
}

static void mark_restore(ColumnBuilder *self, const Mark *m) {
    Buf *bufs[N_BUFS];
    all_bufs(self, bufs);
    for (int i = 0; i < N_BUFS; i++)
        bufs[i]->len = m->len[i];
    self->rows = m->rows;
    self->header_count = m->header_count;
    self->keys.nulls = m->key_nulls;
    self->values.nulls = m->value_nulls;
    self->header_keys.nulls = m->hkey_nulls;
    self->header_values.nulls = m->hvalue_nulls;
    bitmap_clear_from(&self->keys.validity, self->rows);
    bitmap_clear_from(&self->values.validity, self->rows);
    bitmap_clear_from(&self->header_keys.validity, self->header_count);
    bitmap_clear_from(&self->header_values.validity, self->header_count);
}

static int column_reset(BinaryColumn *c) {
    c->validity.len = 0;
    c->offsets.len = 0;
    c->data.len = 0;
    c->nulls = 0;
    int32_t zero = 0;
    return buf_put(&c->offsets, &zero, 4);
}

/* Row `row` of column `c` gets `n` bytes at `src` (or null when src is NULL). */
static inline int column_add(BinaryColumn *c, int64_t row, const char *src, int64_t n) {
    if (row % 8 == 0) {
        if (buf_reserve(&c->validity, 1) < 0)
            return -1;
        c->validity.data[c->validity.len++] = 0;
    }
    if (src == NULL) {
        c->nulls++;
    } else {
        c->validity.data[row / 8] |= (char)(1u << (row % 8));
        if ((int64_t)c->data.len + n > MAX_ARROW_BYTES) {
            PyErr_SetString(PyExc_OverflowError,
                            "more than 2 GiB of data in one Arrow column: take() more often");
            return -1;
        }
        if (buf_put(&c->data, src, (size_t)n) < 0)
            return -1;
    }
    int32_t end = (int32_t)c->data.len;
    return buf_put(&c->offsets, &end, 4);
}

static int builder_reset(ColumnBuilder *self) {
    self->rows = 0;
    self->header_count = 0;
    self->offsets.len = self->timestamps.len = self->timestamp_types.len = 0;
    self->header_lists.len = 0;
    int32_t zero = 0;
    if (column_reset(&self->keys) < 0 || column_reset(&self->values) < 0 ||
        column_reset(&self->header_keys) < 0 || column_reset(&self->header_values) < 0 ||
        buf_put(&self->header_lists, &zero, 4) < 0)
        return -1;
    return 0;
}

static void buf_free(Buf *b) {
    PyMem_Free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static void column_free(BinaryColumn *c) {
    buf_free(&c->validity);
    buf_free(&c->offsets);
    buf_free(&c->data);
}

static void ColumnBuilder_dealloc(ColumnBuilder *self) {
    buf_free(&self->offsets);
    buf_free(&self->timestamps);
    buf_free(&self->timestamp_types);
    column_free(&self->keys);
    column_free(&self->values);
    buf_free(&self->header_lists);
    column_free(&self->header_keys);
    column_free(&self->header_values);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ColumnBuilder_init(ColumnBuilder *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"include_headers", NULL};
    int include_headers = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p", kwlist, &include_headers))
        return -1;
    self->include_headers = include_headers;
    return builder_reset(self);
}

/* ---- parsing ------------------------------------------------------------------------------ */

typedef struct {
    const uint8_t *data;
    int64_t pos;
    int64_t end;
} Reader;

static int corrupt(const char *fmt, int64_t a, int64_t b) {
    PyErr_Format(CorruptRecordError, fmt, (long long)a, (long long)b);
    return -1;
}

static int corrupt1(const char *fmt, int64_t a) {
    PyErr_Format(CorruptRecordError, fmt, (long long)a);
    return -1;
}

static int truncated(int64_t record_end, int64_t end) {
    return corrupt("records section truncated: record ending at %lld runs past %lld",
                   record_end, end);
}

/* A zig-zag varint of at most 5 bytes (an int32), as Kafka's ByteUtils.readVarint. */
static inline int read_varint(Reader *r, int64_t record_end, int32_t *out) {
    uint64_t result = 0;
    for (int i = 0; i < 5; i++) {
        if (r->pos >= r->end)
            return truncated(record_end, r->end);
        uint8_t byte = r->data[r->pos++];
        result |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            if (result > 0xFFFFFFFFull)
                return corrupt1("varint overflows 32 bits before position %lld", r->pos);
            uint32_t u = (uint32_t)result;
            *out = (int32_t)((u >> 1) ^ (~(u & 1) + 1));
            return 0;
        }
    }
    return corrupt1("varint longer than 5 bytes before position %lld", r->pos);
}

/* A zig-zag varlong of at most 10 bytes. Java silently drops bits past 64; both tidelog
   decoders refuse them instead, so that they agree on every input. */
static inline int read_varlong(Reader *r, int64_t record_end, int64_t *out) {
    uint64_t result = 0;
    for (int i = 0; i < 10; i++) {
        if (r->pos >= r->end)
            return truncated(record_end, r->end);
        uint8_t byte = r->data[r->pos++];
        if (i == 9 && (byte & 0x7E))
            return corrupt1("varint overflows 64 bits before position %lld", r->pos);
        result |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            *out = (int64_t)((result >> 1) ^ (~(result & 1) + 1));
            return 0;
        }
    }
    return corrupt1("varint longer than 10 bytes before position %lld", r->pos);
}

/* ---- one parser, two sinks ----------------------------------------------------------------
 * parse_records checks every record exactly as decoder.py's _decode_into does and hands what
 * it found to a Sink: ArrowSink appends to a ColumnBuilder's buffers, ListSink to the Python
 * lists of a RecordColumns. */

typedef struct {
    int32_t offset_delta;
    int64_t timestamp_delta;
    const char *key; /* NULL: a null key */
    int64_t key_len;
    const char *value; /* NULL: a null value */
    int64_t value_len;
} Rec;

typedef struct Sink Sink;
struct Sink {
    /* Whether the record at this offset delta is kept (its headers are then passed on). */
    int (*want)(Sink *, int32_t offset_delta);
    /* One header of a kept record: the key decoded (borrowed), the value NULL when null. */
    int (*header)(Sink *, PyObject *key, const char *raw_key, int64_t key_len, const char *value,
                  int64_t value_len);
    /* A kept record, after its headers. */
    int (*record)(Sink *, const Rec *);
};

static int parse_headers(Sink *sink, Reader *r, int32_t count, int64_t record_end, int keep) {
    if (count < 0 || count > (record_end - r->pos) / 2)
        return corrupt("invalid header count %lld in record ending at %lld", count, record_end);
    for (int32_t i = 0; i < count; i++) {
        int32_t n;
        if (read_varint(r, record_end, &n) < 0)
            return -1;
        if (n < 0 || r->pos + n > record_end)
            return corrupt("invalid header key length %lld at position %lld", n, r->pos);
        const char *raw_key = (const char *)r->data + r->pos;
        /* Header keys are strings: utf-8 or the record is corrupt (kept or not, as in Python). */
        PyObject *key = PyUnicode_DecodeUTF8(raw_key, n, "strict");
        if (key == NULL) {
            PyErr_Clear();
            return corrupt1("header key is not utf-8 at position %lld", r->pos);
        }
        int64_t key_len = n;
        r->pos += n;
        const char *value = NULL;
        int rc = read_varint(r, record_end, &n);
        if (rc == 0 && n < 0) {
            if (n != -1)
                rc = corrupt("invalid header value length %lld at position %lld", n, r->pos);
        } else if (rc == 0) {
            if (r->pos + n > record_end) {
                rc = corrupt1("header value overruns its record at position %lld", r->pos);
            } else {
                value = (const char *)r->data + r->pos;
                r->pos += n;
            }
        }
        if (rc == 0 && keep)
            rc = sink->header(sink, key, raw_key, key_len, value, n < 0 ? 0 : n);
        Py_DECREF(key);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* A length-prefixed key or value: NULL for length -1. */
static inline int read_bytes(Reader *r, int64_t record_end, const char *what, const char **out,
                             int64_t *len) {
    int32_t n;
    if (read_varint(r, record_end, &n) < 0)
        return -1;
    *len = n;
    *out = NULL;
    if (n >= 0) {
        if (r->pos + n > record_end)
            return corrupt("record ending at %lld was read to %lld: its length is wrong",
                           record_end, r->pos + n);
        *out = (const char *)r->data + r->pos;
        r->pos += n;
    } else if (n != -1) {
        PyErr_Format(CorruptRecordError, "invalid %s length %lld at position %lld", what,
                     (long long)n, (long long)r->pos);
        return -1;
    }
    return 0;
}

static int parse_records(Sink *sink, Reader *r, int64_t count) {
    if (count < 0 || count > r->end / MIN_RECORD_SIZE)
        return corrupt("record count %lld does not fit a records section of %lld bytes", count,
                       r->end);
    int64_t record_end = 0;
    for (int64_t i = 0; i < count; i++) {
        int32_t length;
        if (read_varint(r, record_end, &length) < 0)
            return -1;
        record_end = r->pos + length;
        if (length < MIN_RECORD_SIZE - 1 || record_end > r->end)
            return corrupt("invalid record length %lld at position %lld", length, r->pos);
        r->pos += 1; /* record attributes: unused */
        Rec rec;
        int32_t header_count;
        if (read_varlong(r, record_end, &rec.timestamp_delta) < 0 ||
            read_varint(r, record_end, &rec.offset_delta) < 0 ||
            read_bytes(r, record_end, "key", &rec.key, &rec.key_len) < 0 ||
            read_bytes(r, record_end, "value", &rec.value, &rec.value_len) < 0 ||
            read_varint(r, record_end, &header_count) < 0)
            return -1;
        int keep = sink->want(sink, rec.offset_delta);
        if (header_count != 0 && parse_headers(sink, r, header_count, record_end, keep) < 0)
            return -1;
        if (r->pos != record_end)
            return corrupt("record ending at %lld was read to %lld: its length is wrong",
                           record_end, r->pos);
        if (keep && sink->record(sink, &rec) < 0)
            return -1;
    }
    if (r->pos != r->end)
        return corrupt("%lld bytes remain after the batch's %lld records", r->end - r->pos, count);
    return 0;
}

/* ---- ArrowSink: into a ColumnBuilder ---------------------------------------------------- */

typedef struct {
    Sink sink;
    ColumnBuilder *self;
    int64_t base_offset, base_timestamp, fixed_timestamp, start, stop, added;
    int has_fixed;
    int32_t timestamp_type;
} ArrowSink;

/* Wrapping arithmetic, as Java's: no undefined behaviour on garbage. */
static inline int64_t wrapping_add(int64_t a, int64_t b) {
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

static int arrow_want(Sink *sink, int32_t offset_delta) {
    ArrowSink *s = (ArrowSink *)sink;
    int64_t offset = wrapping_add(s->base_offset, offset_delta);
    return offset >= s->start && offset < s->stop;
}

static int arrow_header(Sink *sink, PyObject *key, const char *raw_key, int64_t key_len,
                        const char *value, int64_t value_len) {
    ColumnBuilder *self = ((ArrowSink *)sink)->self;
    if (!self->include_headers)
        return 0;
    int64_t h = self->header_count++;
    if (column_add(&self->header_keys, h, raw_key, key_len) < 0 ||
        column_add(&self->header_values, h, value, value_len) < 0)
        return -1;
    return 0;
}

static int arrow_record(Sink *sink, const Rec *rec) {
    ArrowSink *s = (ArrowSink *)sink;
    ColumnBuilder *self = s->self;
    int64_t offset = wrapping_add(s->base_offset, rec->offset_delta);
    /* As Kafka's DefaultRecord.readFrom: base + delta even when base is NO_TIMESTAMP. */
    int64_t millis =
        s->has_fixed ? s->fixed_timestamp : wrapping_add(s->base_timestamp, rec->timestamp_delta);
    int64_t micros = (int64_t)((uint64_t)millis * 1000u);
    int64_t row = self->rows;
    if (buf_put(&self->offsets, &offset, 8) < 0 || buf_put(&self->timestamps, &micros, 8) < 0 ||
        buf_put(&self->timestamp_types, &s->timestamp_type, 4) < 0 ||
        column_add(&self->keys, row, rec->key, rec->key_len < 0 ? 0 : rec->key_len) < 0 ||
        column_add(&self->values, row, rec->value, rec->value_len < 0 ? 0 : rec->value_len) < 0)
        return -1;
    if (self->include_headers) {
        if (self->header_count > MAX_ARROW_BYTES) {
            PyErr_SetString(PyExc_OverflowError, "too many headers in one Arrow batch");
            return -1;
        }
        int32_t list_end = (int32_t)self->header_count;
        if (buf_put(&self->header_lists, &list_end, 4) < 0)
            return -1;
    }
    self->rows++;
    s->added++;
    return 0;
}

/* ---- ListSink: into Python lists (decode_columns) ------------------------------------- */

typedef struct {
    Sink sink;
    PyObject *base_offset, *base_timestamp, *fixed_timestamp; /* ints; fixed may be None */
    int64_t base_offset_c, base_timestamp_c;
    PyObject *offsets, *timestamps, *keys, *values, *headers; /* lists */
    PyObject *pending;                                        /* this record's headers */
} ListSink;

static int list_want(Sink *sink, int32_t offset_delta) {
    return 1;
}

static int list_header(Sink *sink, PyObject *key, const char *raw_key, int64_t key_len,
                       const char *value, int64_t value_len) {
    ListSink *s = (ListSink *)sink;
    if (s->pending == NULL && (s->pending = PyList_New(0)) == NULL)
        return -1;
    PyObject *v;
    if (value == NULL) {
        v = Py_None;
        Py_INCREF(v);
    } else if ((v = PyBytes_FromStringAndSize(value, value_len)) == NULL) {
        return -1;
    }
    PyObject *pair = PyTuple_Pack(2, key, v);
    Py_DECREF(v);
    if (pair == NULL)
        return -1;
    int rc = PyList_Append(s->pending, pair);
    Py_DECREF(pair);
    return rc;
}

/* base + delta as a Python int: exact, as Python's arithmetic (no wrapping). */
static PyObject *exact_sum(int64_t base_c, PyObject *base, int64_t delta) {
    int64_t sum;
    if (!__builtin_add_overflow(base_c, delta, &sum))
        return PyLong_FromLongLong(sum);
    PyObject *d = PyLong_FromLongLong(delta);
    if (d == NULL)
        return NULL;
    PyObject *result = PyNumber_Add(base, d);
    Py_DECREF(d);
    return result;
}

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

static PyObject *bytes_or_none(const char *p, int64_t n) {
    if (p == NULL)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(p, n);
}

static int list_record(Sink *sink, const Rec *rec) {
    ListSink *s = (ListSink *)sink;
    PyObject *timestamp;
    if (s->fixed_timestamp != Py_None) {
        timestamp = s->fixed_timestamp;
        Py_INCREF(timestamp);
    } else {
        timestamp = exact_sum(s->base_timestamp_c, s->base_timestamp, rec->timestamp_delta);
    }
    PyObject *headers;
    if (s->pending == NULL) {
        headers = PyTuple_New(0);
    } else {
        headers = PyList_AsTuple(s->pending);
        Py_CLEAR(s->pending);
    }
    if (append_new(s->offsets, exact_sum(s->base_offset_c, s->base_offset, rec->offset_delta)) < 0 ||
        append_new(s->timestamps, timestamp) < 0 ||
        append_new(s->keys, bytes_or_none(rec->key, rec->key_len)) < 0 ||
        append_new(s->values, bytes_or_none(rec->value, rec->value_len)) < 0 ||
        append_new(s->headers, headers) < 0)
        return -1;
    return 0;
}

PyDoc_STRVAR(decode_columns_doc,
"decode_columns(records, count, base_offset, base_timestamp, fixed_timestamp)\n"
"--\n\n"
"Decode a (decompressed) records section into five lists: offsets, timestamps, keys,\n"
"values, headers, equal to what decoder._decode_into builds. Raises CorruptRecordError.");

static PyObject *columnar_decode_columns(PyObject *module, PyObject *args) {
    Py_buffer view;
    long long count;
    ListSink s = {{list_want, list_header, list_record}};
    if (!PyArg_ParseTuple(args, "y*LOOO", &view, &count, &s.base_offset, &s.base_timestamp,
                          &s.fixed_timestamp))
        return NULL;
    PyObject *result = NULL;
    s.base_offset_c = PyLong_AsLongLong(s.base_offset);
    s.base_timestamp_c = PyLong_AsLongLong(s.base_timestamp);
    if (PyErr_Occurred())
        goto done;
    s.offsets = PyList_New(0);
    s.timestamps = PyList_New(0);
    s.keys = PyList_New(0);
    s.values = PyList_New(0);
    s.headers = PyList_New(0);
    if (s.offsets && s.timestamps && s.keys && s.values && s.headers) {
        Reader r = {(const uint8_t *)view.buf, 0, (int64_t)view.len};
        if (parse_records(&s.sink, &r, count) == 0)
            result = PyTuple_Pack(5, s.offsets, s.timestamps, s.keys, s.values, s.headers);
    }
    Py_XDECREF(s.offsets);
    Py_XDECREF(s.timestamps);
    Py_XDECREF(s.keys);
    Py_XDECREF(s.values);
    Py_XDECREF(s.headers);
    Py_XDECREF(s.pending);
done:
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(append_doc,
"append(records, count, base_offset, base_timestamp, fixed_timestamp, timestamp_type, start, stop)\n"
"--\n\n"
"Parse the (decompressed) records section of one batch; keep the records whose offsets are\n"
"in [start, stop). fixed_timestamp is the batch's max timestamp for LogAppendTime batches,\n"
"else None. Returns how many rows were added. Raises CorruptRecordError on malformed\n"
"records, leaving the builder unchanged.");

static PyObject *ColumnBuilder_append(ColumnBuilder *self, PyObject *args) {
    Py_buffer view;
    long long count, base_offset, base_timestamp, start, stop;
    PyObject *fixed;
    int timestamp_type;
    if (!PyArg_ParseTuple(args, "y*LLLOiLL", &view, &count, &base_offset, &base_timestamp,
                          &fixed, &timestamp_type, &start, &stop))
        return NULL;
    int has_fixed = fixed != Py_None;
    long long fixed_timestamp = 0;
    if (has_fixed) {
        fixed_timestamp = PyLong_AsLongLong(fixed);
        if (fixed_timestamp == -1 && PyErr_Occurred()) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    Mark mark;
    mark_take(self, &mark);
    ArrowSink sink = {{arrow_want, arrow_header, arrow_record}, self, base_offset, base_timestamp,
                      fixed_timestamp, start, stop, 0, has_fixed, timestamp_type};
    Reader r = {(const uint8_t *)view.buf, 0, (int64_t)view.len};
    int rc = parse_records(&sink.sink, &r, count);
    PyBuffer_Release(&view);
    if (rc < 0) {
        mark_restore(self, &mark);
        return NULL;
    }
    return PyLong_FromLongLong(sink.added);
}

static PyObject *bytes_of(Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
}

static PyObject *column_tuple(BinaryColumn *c) {
    PyObject *validity;
    if (c->nulls) {
        validity = bytes_of(&c->validity);
    } else {
        validity = Py_None;
        Py_INCREF(validity);
    }
    if (validity == NULL)
        return NULL;
    return Py_BuildValue("(NNNL)", validity, bytes_of(&c->offsets), bytes_of(&c->data),
                         (long long)c->nulls);
}

PyDoc_STRVAR(take_doc,
"take() -> (rows, offsets, timestamps, timestamp_types, keys, values, headers)\n"
"--\n\n"
"The buffered rows as Arrow buffers (bytes), and empty the builder. offsets and timestamps\n"
"(microseconds) are int64, timestamp_types int32; keys and values are (validity or None,\n"
"int32 offsets, data, null count); headers is None unless include_headers, else\n"
"(int32 list offsets, header keys, header values) with keys and values as above.");

static PyObject *ColumnBuilder_take(ColumnBuilder *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *headers;
    if (self->include_headers) {
        headers = Py_BuildValue("(NNN)", bytes_of(&self->header_lists),
                                column_tuple(&self->header_keys),
                                column_tuple(&self->header_values));
    } else {
        headers = Py_None;
        Py_INCREF(headers);
    }
    if (headers == NULL)
        return NULL;
    PyObject *result = Py_BuildValue("(LNNNNNN)", (long long)self->rows, bytes_of(&self->offsets),
                                     bytes_of(&self->timestamps),
                                     bytes_of(&self->timestamp_types), column_tuple(&self->keys),
                                     column_tuple(&self->values), headers);
    if (result == NULL)
        return NULL;
    if (builder_reset(self) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static Py_ssize_t ColumnBuilder_len(ColumnBuilder *self) {
    return (Py_ssize_t)self->rows;
}

static PyObject *ColumnBuilder_data_bytes(ColumnBuilder *self, void *closure) {
    size_t most = self->keys.data.len;
    if (self->values.data.len > most)
        most = self->values.data.len;
    if (self->header_values.data.len > most)
        most = self->header_values.data.len;
    return PyLong_FromSize_t(most);
}

static PyMethodDef ColumnBuilder_methods[] = {
    {"append", (PyCFunction)ColumnBuilder_append, METH_VARARGS, append_doc},
    {"take", (PyCFunction)ColumnBuilder_take, METH_NOARGS, take_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ColumnBuilder_getset[] = {
    {"data_bytes", (getter)ColumnBuilder_data_bytes, NULL,
     "bytes held by the largest binary column (Arrow caps one at 2 GiB)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods ColumnBuilder_as_sequence = {
    .sq_length = (lenfunc)ColumnBuilder_len,
};

static PyTypeObject ColumnBuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidelog.protocol.records._columnar.ColumnBuilder",
    .tp_doc = PyDoc_STR("ColumnBuilder(include_headers=False): records of many batches as "
                        "Arrow column buffers."),
    .tp_basicsize = sizeof(ColumnBuilder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ColumnBuilder_init,
    .tp_dealloc = (destructor)ColumnBuilder_dealloc,
    .tp_methods = ColumnBuilder_methods,
    .tp_getset = ColumnBuilder_getset,
    .tp_as_sequence = &ColumnBuilder_as_sequence,
};

static PyMethodDef columnar_functions[] = {
    {"decode_columns", columnar_decode_columns, METH_VARARGS, decode_columns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef columnar_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tidelog.protocol.records._columnar",
    .m_doc = "Kafka v2 records parsed straight into Arrow column buffers, or into the Python "
             "lists of decode_columns.",
    .m_size = -1,
    .m_methods = columnar_functions,
};

PyMODINIT_FUNC PyInit__columnar(void) {
    PyObject *batch = PyImport_ImportModule("tidelog.protocol.records.batch");
    if (batch == NULL)
        return NULL;
    CorruptRecordError = PyObject_GetAttrString(batch, "CorruptRecordError");
    Py_DECREF(batch);
    if (CorruptRecordError == NULL)
        return NULL;
    if (PyType_Ready(&ColumnBuilderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&columnar_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ColumnBuilderType);
    if (PyModule_AddObject(m, "ColumnBuilder", (PyObject *)&ColumnBuilderType) < 0) {
        Py_DECREF(&ColumnBuilderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
