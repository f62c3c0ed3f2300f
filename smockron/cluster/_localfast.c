/* LocalLimiter.check's common cases in C: a batch of RateLimitRequest in, a list of
 * RateLimitResponse out, over the limiter's OrderedDict cache of flat state tuples.
 *
 * Why: in Python most of a check's cost is object creation (LimitParams, the
 * state named tuple, Outcome, the response's dataclass __init__), attribute reads and
 * the cache bookkeeping; the arithmetic itself is a few integer operations. Here a
 * check reads the request's slots directly, does the arithmetic of core/algorithms.py
 * on int64 (same formulas, Python's floor division), writes the same cache entry
 * ``(expires, kind, *fields)`` a Python check would, and fills the response's slots.
 *
 * Only the common cases are done here: hits >= 0, duration >= 1, no
 * DURATION_IS_GREGORIAN / RESET_REMAINING / DRAIN_OVER_LIMIT, for the buckets a cached
 * state made with the same limit, duration and burst, for SMOCKRON_HISTORY limit >= 1,
 * and every number in ranges where no int64 operation can overflow. Anything else (and any
 * invalid item) is handed to ``slow(request, now)``, the Python check, so results stay
 * exactly those of core/algorithms.py; tests/cluster/test_local.py checks both paths
 * against each other on random sequences. Without a compiler the Python path is used.
 * Twin of smockron.core.algorithms.check (its SMOCKRON_HISTORY: of smockron.core.history).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>

#define BIG ((int64_t)1 << 30)   /* limit, burst, duration, |hits| stay below this */
#define NOW_MAX ((int64_t)1 << 50)  /* the clock of a request: 0 .. ~35,000 years */
#define TIME_MAX ((int64_t)1 << 52) /* times read back from a state */
#define NO_PLAIN_BEHAVIOR (4 | 8 | 32) /* GREGORIAN, RESET_REMAINING, DRAIN_OVER_LIMIT */

enum { R_NAME, R_KEY, R_HITS, R_LIMIT, R_DURATION, R_ALGORITHM, R_BEHAVIOR, R_BURST,
       R_CREATED, N_REQ };
static const char *req_fields[N_REQ] = {"name", "unique_key", "hits", "limit", "duration",
                                        "algorithm", "behavior", "burst", "created_at"};
enum { P_STATUS, P_LIMIT, P_REMAINING, P_RESET, P_ERROR, P_METADATA, N_RESP };
static const char *resp_fields[N_RESP] = {"status", "limit", "remaining", "reset_time",
                                          "error", "metadata"};

static PyTypeObject *req_type, *resp_type;
static Py_ssize_t req_off[N_REQ], resp_off[N_RESP];
static PyObject *under, *over, *empty, *kinds[4];

static int slot_offsets(PyTypeObject *type, const char **names, int n, Py_ssize_t *out) {
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString((PyObject *)type, names[i]);
        if (d == NULL) return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (ok) out[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, names[i]);
            return -1;
        }
    }
    return 0;
}

static PyObject *localfast_bind(PyObject *self, PyObject *args) {
    PyObject *rq, *rs, *u, *o;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyType_Type, &rq, &PyType_Type, &rs, &u, &o))
        return NULL;
    if (slot_offsets((PyTypeObject *)rq, req_fields, N_REQ, req_off) < 0) return NULL;
    if (slot_offsets((PyTypeObject *)rs, resp_fields, N_RESP, resp_off) < 0) return NULL;
    Py_INCREF(rq); Py_INCREF(rs); Py_INCREF(u); Py_INCREF(o);
    Py_XSETREF(req_type, (PyTypeObject *)rq);
    Py_XSETREF(resp_type, (PyTypeObject *)rs);
    Py_XSETREF(under, u);
    Py_XSETREF(over, o);
    Py_RETURN_NONE;
}

/* ``o`` as an int64 in [lo, hi]; 0 when it is not an int (or is a bool) or out of range. */
static int as_i64(PyObject *o, int64_t lo, int64_t hi, int64_t *out) {
    if (!PyLong_Check(o) || PyBool_Check(o)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return v >= lo && v <= hi;
}

static int64_t floordiv(int64_t a, int64_t b) { /* Python's //, b > 0 */
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

typedef struct {
    int64_t hits, limit, duration, burst, now;
    PyObject *limit_obj, *duration_obj;
} Params;

typedef struct {
    int over;
    int64_t remaining, reset;
    PyObject *entry; /* the new cache entry */
} Outcome;

/* Build a tuple from new references (NULL -> fail, releasing the others). */
static PyObject *entry_of(int n, PyObject **items) {
    PyObject *t = NULL;
    for (int i = 0; i < n; i++)
        if (items[i] == NULL) goto fail;
    t = PyTuple_New(n);
    if (t == NULL) goto fail;
    for (int i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, items[i]);
    PyObject_GC_UnTrack(t); /* numbers only: the collector never needs to see it */
    return t;
fail:
    for (int i = 0; i < n; i++) Py_XDECREF(items[i]);
    return NULL;
}

#define I(v) PyLong_FromLongLong(v)
#define REF(o) (Py_INCREF(o), (o))

/* Each algorithm: 1 done (o filled), 0 not a fast case, -1 error. ``s`` is the live
 * cached entry of the same kind, or NULL. */

static int token_bucket(PyObject *s, const Params *p, Outcome *o) {
    int64_t now = p->now, start, end, remaining;
    int64_t slimit, sdur;
    if (s == NULL) {
        start = now, end = now + p->duration, remaining = p->limit;
    } else {
        if (PyTuple_GET_SIZE(s) != 8 || PyTuple_GET_ITEM(s, 4) != Py_False) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 2), 0, BIG, &slimit) || slimit != p->limit) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 3), 1, BIG, &sdur) || sdur != p->duration) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 5), -TIME_MAX, TIME_MAX, &remaining)) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 6), 0, TIME_MAX, &start)) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 7), 0, TIME_MAX, &end)) return 0;
        if (now >= end) start = now, end = now + p->duration, remaining = p->limit;
    }
    o->over = p->hits > remaining;
    if (!o->over) remaining -= p->hits;
    o->remaining = remaining;
    o->reset = end;
    PyObject *items[8] = {I(max64(end, now + p->duration)), REF(kinds[0]), REF(p->limit_obj),
                          REF(p->duration_obj), REF(Py_False), I(remaining), I(start), I(end)};
    o->entry = entry_of(8, items);
    return o->entry ? 1 : -1;
}

static int leaky_bucket(PyObject *s, const Params *p, Outcome *o) {
    int64_t now = p->now, period = p->duration, level, updated = now;
    int64_t burst = p->burst ? p->burst : p->limit, full = burst * period;
    int64_t v;
    if (s == NULL) {
        level = full;
    } else {
        if (PyTuple_GET_SIZE(s) != 10 || PyTuple_GET_ITEM(s, 4) != Py_False ||
            PyTuple_GET_ITEM(s, 9) != Py_None)
            return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 2), 0, BIG, &v) || v != p->limit) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 3), 1, BIG, &v) || v != p->duration) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 5), 0, BIG, &v) || v != burst) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 6), 1, BIG, &v) || v != period) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 7), 0, full, &level)) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 8), 0, TIME_MAX, &updated)) return 0;
        if (now > updated) { /* min(full, level + elapsed * limit), without overflow */
            int64_t elapsed = now - updated;
            if (p->limit > 0 && elapsed > (full - level) / p->limit) level = full;
            else level += elapsed * p->limit;
        }
        updated = max64(now, updated);
    }
    o->over = p->hits > level / period;
    if (!o->over) level = min64(full, level - p->hits * period);
    o->remaining = level / period;
    int64_t missing = full - level, full_at;
    if (missing <= 0) full_at = updated;
    else if (p->limit > 0) full_at = updated - floordiv(-missing, p->limit);
    else full_at = updated + period;
    o->reset = full_at;
    PyObject *items[10] = {I(max64(full_at, now + p->duration)), REF(kinds[1]),
                           REF(p->limit_obj), REF(p->duration_obj), REF(Py_False), I(burst),
                           I(period), I(level), I(updated), REF(Py_None)};
    o->entry = entry_of(10, items);
    return o->entry ? 1 : -1;
}

static int sliding_window(PyObject *s, const Params *p, Outcome *o) {
    int64_t now = p->now, d = p->duration, previous = 0, current = 0;
    int64_t sdur, sstart, send, sprev, scur;
    if (s != NULL) {
        if (PyTuple_GET_SIZE(s) != 8 || PyTuple_GET_ITEM(s, 3) != Py_False) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 2), 1, BIG, &sdur)) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 4), 0, TIME_MAX, &sstart)) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 5), 0, TIME_MAX, &send)) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 6), 0, 2 * BIG, &sprev)) return 0;
        if (!as_i64(PyTuple_GET_ITEM(s, 7), 0, 2 * BIG, &scur)) return 0;
        now = max64(now, sstart);
    }
    int64_t start = now - now % d, end = start + d;
    if (s != NULL && sdur == d) {
        if (sstart == start) previous = sprev, current = scur;
        else if (send == start) previous = scur;
    }
    int64_t budget = p->limit * d - previous * (end - now) - current * d;
    o->over = p->hits > max64(0, floordiv(budget, d));
    if (!o->over && p->hits) current = max64(0, current + p->hits);
    budget = p->limit * d - previous * (end - now) - current * d;
    o->remaining = max64(0, floordiv(budget, d));
    int64_t full_at = current ? end + d : previous ? end : start;
    o->reset = max64(now, full_at);
    PyObject *items[8] = {I(max64(full_at, p->now + d)), REF(kinds[2]), REF(p->duration_obj),
                          REF(Py_False), I(start), I(end), I(previous), I(current)};
    o->entry = entry_of(8, items);
    return o->entry ? 1 : -1;
}

#define MAX_HISTORY_BURST 10000 /* core/algorithms.py's: above it the item is invalid */

/* Timestamps of ``log[from:]`` after ``horizon``; -1 when ``log`` holds anything but
 * floats that are not NaN (then Python decides). */
static Py_ssize_t recent(PyObject *log, Py_ssize_t from, double horizon) {
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(log); i++) {
        PyObject *ts = PyTuple_GET_ITEM(log, i);
        if (!PyFloat_CheckExact(ts) || isnan(PyFloat_AS_DOUBLE(ts))) return -1;
        n += i >= from && PyFloat_AS_DOUBLE(ts) > horizon;
    }
    return n;
}

/* ``float(now)``, one object for every key stamped in the same millisecond: the keys'
 * histories then point to a few hot floats instead of one object per hit. */
static PyObject *stamp_of(double now) {
    static PyObject *last;
    if (last == NULL || PyFloat_AS_DOUBLE(last) != now) {
        PyObject *f = PyFloat_FromDouble(now);
        if (f == NULL) return NULL;
        Py_XSETREF(last, f);
    }
    return REF(last);
}

static int64_t ceil_ms(double x) { /* algorithms._ceil */
    int64_t n = (int64_t)x;
    return (double)n < x ? n + 1 : n;
}

/* The seed's history rule (algorithms._history) with limit >= 1: the last ``burst``
 * timestamps, each accepted hit recorded as ``float(now)``. */
static int history(PyObject *s, const Params *p, Outcome *o) {
    int64_t burst = p->burst ? p->burst : p->limit, now = p->now;
    if (p->limit < 1 || burst > MAX_HISTORY_BURST) return 0;
    PyObject *old = NULL;
    Py_ssize_t from = 0, kept = 0;
    if (s != NULL) {
        if (PyTuple_GET_SIZE(s) != 6 || !PyTuple_CheckExact(old = PyTuple_GET_ITEM(s, 5)))
            return 0;
        kept = PyTuple_GET_SIZE(old);
        if (kept > burst) from = kept - burst, kept = burst;
    }
    double rate = (double)p->limit * 1000.0 / (double)p->duration;
    double window = (double)burst * 1000.0 / rate, horizon = (double)now - window;
    Py_ssize_t before = old ? recent(old, from, horizon) : 0;
    if (before < 0) return 0;
    o->over = p->hits > burst - before;
    Py_ssize_t added = o->over ? 0 : (Py_ssize_t)min64(p->hits, burst);
    Py_ssize_t drop = kept + added > burst ? kept + added - burst : 0;
    /* One pass over what is kept: copied, its maximum taken; what is dropped is
     * subtracted from ``before``, what is added counted if recent. */
    double newest = -HUGE_VAL, stamp_at = (double)now;
    for (Py_ssize_t i = from; i < from + drop; i++)
        before -= PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(old, i)) > horizon;
    PyObject *log;
    Py_ssize_t size = kept - drop + added;
    if (old != NULL && from == 0 && added == 0) {
        log = REF(old);
        for (Py_ssize_t i = 0; i < size; i++)
            newest = fmax(newest, PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(old, i)));
    } else {
        PyObject *stamp = added ? stamp_of(stamp_at) : NULL;
        if ((log = PyTuple_New(size)) == NULL || (added && stamp == NULL)) {
            Py_XDECREF(log);
            Py_XDECREF(stamp);
            return -1;
        }
        for (Py_ssize_t i = 0; i < kept - drop; i++) {
            PyObject *ts = PyTuple_GET_ITEM(old, from + drop + i);
            newest = fmax(newest, PyFloat_AS_DOUBLE(ts));
            PyTuple_SET_ITEM(log, i, REF(ts));
        }
        for (Py_ssize_t i = kept - drop; i < size; i++) PyTuple_SET_ITEM(log, i, REF(stamp));
        Py_XDECREF(stamp);
        PyObject_GC_UnTrack(log);
        if (added) {
            newest = fmax(newest, stamp_at);
            before += stamp_at > horizon ? added : 0;
        }
    }
    o->remaining = burst - before;
    int64_t expires = 0;
    if (size) {
        if (!(newest + window < 9.0e15 && newest + window > -9.0e15)) {
            Py_DECREF(log);
            return 0;
        }
        expires = ceil_ms(newest + window);
    }
    o->reset = max64(now, size ? expires : now);
    PyObject *items[6] = {I(max64(expires, now + p->duration)), REF(kinds[3]),
                          REF(p->limit_obj), REF(p->duration_obj), I(burst), log};
    o->entry = entry_of(6, items);
    return o->entry ? 1 : -1;
}

/* ``name + "_" + unique_key`` (RateLimitRequest.hash_key). */
static PyObject *hash_key(PyObject *name, PyObject *key) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(name), k = PyUnicode_GET_LENGTH(key);
    Py_UCS4 maxchar = PyUnicode_MAX_CHAR_VALUE(name);
    if (PyUnicode_MAX_CHAR_VALUE(key) > maxchar) maxchar = PyUnicode_MAX_CHAR_VALUE(key);
    PyObject *out = PyUnicode_New(n + 1 + k, maxchar);
    if (out == NULL) return NULL;
    if (PyUnicode_CopyCharacters(out, 0, name, 0, n) < 0 ||
        PyUnicode_WriteChar(out, n, '_') < 0 ||
        PyUnicode_CopyCharacters(out, n + 1, key, 0, k) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *response(PyObject *limit, const Outcome *o) {
    PyObject *r = resp_type->tp_alloc(resp_type, 0);
    if (r == NULL) return NULL;
    PyObject *values[N_RESP] = {REF(o->over ? over : under), REF(limit), I(o->remaining),
                                I(o->reset), REF(empty), PyDict_New()};
    int ok = 1;
    for (int i = 0; i < N_RESP; i++) {
        ok = ok && values[i] != NULL;
        *(PyObject **)((char *)r + resp_off[i]) = values[i];
    }
    if (!ok) Py_CLEAR(r);
    return r;
}

/* The limiter's counters (a bytearray of uint64, LocalLimiter's STATS order), read by
 * the node's /metrics when scraped: plain increments, no lock beyond the GIL. */
enum { S_OVER, S_HIT, S_MISS, S_EVICTED_LIVE, N_STATS_C };

/* Store ``entry`` as the most recently used; evict the least recently used beyond max,
 * counting those evicted before they expired (the cache is too small for the load). */
static int store(PyObject *cache, PyObject *key, int known, PyObject *entry, Py_ssize_t max,
                 int64_t now, uint64_t *stats) {
    if (known && PyODict_DelItem(cache, key) < 0) return -1;
    if (PyODict_SetItem(cache, key, entry) < 0) return -1;
    while (PyDict_GET_SIZE(cache) > max) {
        PyObject *r = PyObject_CallMethod(cache, "popitem", "O", Py_False);
        if (r == NULL) return -1;
        PyObject *old = PyTuple_CheckExact(r) && PyTuple_GET_SIZE(r) == 2 ? PyTuple_GET_ITEM(r, 1)
                                                                          : NULL;
        int64_t expires;
        if (old != NULL && PyTuple_CheckExact(old) && PyTuple_GET_SIZE(old) > 0 &&
            as_i64(PyTuple_GET_ITEM(old, 0), INT64_MIN, INT64_MAX, &expires) && now < expires)
            stats[S_EVICTED_LIVE]++;
        PyErr_Clear();
        Py_DECREF(r);
    }
    return 0;
}

/* One request: 1 answered (*out), 0 not a fast case, -1 error. */
static int check_one(PyObject *req, int64_t now, PyObject *cache, Py_ssize_t max,
                     PyObject **out, uint64_t *stats) {
    if (Py_TYPE(req) != req_type) return 0;
    PyObject *f[N_REQ];
    for (int i = 0; i < N_REQ; i++)
        if ((f[i] = *(PyObject **)((char *)req + req_off[i])) == NULL) return 0;
    if (!PyUnicode_CheckExact(f[R_NAME]) || !PyUnicode_CheckExact(f[R_KEY]) ||
        PyUnicode_GET_LENGTH(f[R_NAME]) == 0 || PyUnicode_GET_LENGTH(f[R_KEY]) == 0)
        return 0;
    Params p = {.limit_obj = f[R_LIMIT], .duration_obj = f[R_DURATION], .now = now};
    int64_t algorithm, behavior, created;
    if (!as_i64(f[R_HITS], 0, BIG, &p.hits) || !as_i64(f[R_LIMIT], 0, BIG, &p.limit) ||
        !as_i64(f[R_DURATION], 1, BIG, &p.duration) || !as_i64(f[R_BURST], 0, BIG, &p.burst) ||
        !as_i64(f[R_ALGORITHM], 0, 3, &algorithm) ||
        !as_i64(f[R_BEHAVIOR], 0, 0xffff, &behavior) || (behavior & NO_PLAIN_BEHAVIOR))
        return 0;
    if (f[R_CREATED] != Py_None) {
        if (!as_i64(f[R_CREATED], INT64_MIN, INT64_MAX, &created)) return 0;
        if (created) p.now = created;
    }
    if (p.now < 0 || p.now > NOW_MAX) return 0;

    PyObject *key = hash_key(f[R_NAME], f[R_KEY]);
    if (key == NULL) return -1;
    PyObject *entry = PyDict_GetItemWithError(cache, key), *live = NULL;
    int done = 0;
    if (entry == NULL && PyErr_Occurred()) goto error;
    if (entry != NULL) {
        int64_t expires, kind;
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) < 2 ||
            !as_i64(PyTuple_GET_ITEM(entry, 0), INT64_MIN, INT64_MAX, &expires))
            goto not_fast;
        if (p.now < expires) {
            if (!as_i64(PyTuple_GET_ITEM(entry, 1), 0, 3, &kind) || kind != algorithm)
                goto not_fast;
            live = entry;
        }
    }
    Outcome o;
    if (algorithm == 0) done = token_bucket(live, &p, &o);
    else if (algorithm == 1) done = leaky_bucket(live, &p, &o);
    else if (algorithm == 2) done = sliding_window(live, &p, &o);
    else done = history(live, &p, &o);
    if (done <= 0) goto finish;
    stats[live != NULL ? S_HIT : S_MISS]++;
    if (o.over) stats[S_OVER]++;
    if (store(cache, key, entry != NULL, o.entry, max, now, stats) < 0) done = -1;
    Py_DECREF(o.entry);
    if (done > 0 && (*out = response(f[R_LIMIT], &o)) == NULL) done = -1;
    goto finish;
not_fast:
    done = 0;
    goto finish;
error:
    done = -1;
finish:
    Py_DECREF(key);
    return done;
}

static PyObject *localfast_check(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "check(requests, now, cache, max_keys, slow, stats)");
        return NULL;
    }
    if (req_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() was not called");
        return NULL;
    }
    PyObject *cache = args[2], *slow = args[4], *now_obj = args[1];
    if (!PyODict_CheckExact(cache)) {
        PyErr_SetString(PyExc_TypeError, "cache must be an OrderedDict");
        return NULL;
    }
    if (!PyByteArray_CheckExact(args[5]) ||
        PyByteArray_GET_SIZE(args[5]) < (Py_ssize_t)(N_STATS_C * sizeof(uint64_t))) {
        PyErr_SetString(PyExc_TypeError, "stats must be a bytearray of the limiter's counters");
        return NULL;
    }
    uint64_t *stats = (uint64_t *)PyByteArray_AS_STRING(args[5]);
    long long now = PyLong_AsLongLong(now_obj);
    Py_ssize_t max = PyLong_AsSsize_t(args[3]);
    if ((now == -1 || max == -1) && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[0], "requests must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = PyList_New(n);
    if (result == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *req = PySequence_Fast_GET_ITEM(seq, i), *r = NULL;
        int done = check_one(req, now, cache, max, &r, stats);
        if (done < 0) goto fail;
        if (done == 0 && (r = PyObject_CallFunctionObjArgs(slow, req, now_obj, NULL)) == NULL)
            goto fail;
        PyList_SET_ITEM(result, i, r);
    }
    Py_DECREF(seq);
    return result;
fail:
    Py_XDECREF(result);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef methods[] = {
    {"bind", localfast_bind, METH_VARARGS,
     "bind(RateLimitRequest, RateLimitResponse, UNDER_LIMIT, OVER_LIMIT)"},
    {"check", (PyCFunction)(void (*)(void))localfast_check, METH_FASTCALL,
     "check(requests, now, cache, max_keys, slow, stats) -> list of responses"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_localfast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__localfast(void) {
    empty = PyUnicode_FromString("");
    for (int i = 0; i < 4; i++) kinds[i] = PyLong_FromLong(i);
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "STATS", N_STATS_C) < 0) Py_CLEAR(m);
    return m;
}
