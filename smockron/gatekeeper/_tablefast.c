/* A gatekeeper's DELAY_UNTILs applied in C: the compiled twin of
 * smockron.gatekeeper._table.update_run_python (tests compare the two).
 *
 * Why: a resync brings up to a million DELAY_UNTILs, and the Python loop that
 * remembers them (a dict lookup and store per record, then the first line's hold,
 * then a count per domain) cost about 1 us each, 2.4 us with a first line: the
 * restarted gatekeeper, not the master, set how fast a resync could go. Here a record
 * costs one key tuple and a few dict operations. Deleting what a sweep forgets and
 * evicting from a full table stay in Python: the loop stops at the record that needs
 * room and is called again. passed() below finds what a sweep forgets (the twin of
 * passed_python), the scan of a whole table once a second.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Keep a first line's arrival time at least at ``floor`` (Decider._hold_many, one rule). */
static int hold(PyObject *local, PyObject *ident, double floor, Py_ssize_t cap) {
    PyObject *value = PyFloat_FromDouble(floor);
    if (value == NULL) return -1;
    PyObject *old; /* borrowed */
    if (PyDict_GET_SIZE(local) < cap) {
        old = PyDict_SetDefault(local, ident, value); /* one probe for a new identifier */
    } else {
        old = PyDict_GetItemWithError(local, ident);
        if (old == NULL) {
            Py_DECREF(value);
            return PyErr_Occurred() ? -1 : 0; /* full: a new identifier is not held */
        }
    }
    int rc = 0;
    if (old == NULL) {
        rc = -1;
    } else if (old != value) {
        double was = PyFloat_AsDouble(old);
        if (was == -1.0 && PyErr_Occurred()) rc = -1;
        else if (was < floor) rc = PyDict_SetItem(local, ident, value);
    }
    Py_DECREF(value);
    return rc;
}

/* Add one to counts[domain]; ``last``/``run`` batch runs of one domain (the usual case). */
static int tally(PyObject *counts, PyObject *domain, Py_ssize_t run) {
    if (counts == Py_None || run == 0) return 0;
    PyObject *old = PyDict_GetItemWithError(counts, domain);
    if (old == NULL && PyErr_Occurred()) return -1;
    Py_ssize_t was = old == NULL ? 0 : PyLong_AsSsize_t(old);
    if (was == -1 && PyErr_Occurred()) return -1;
    PyObject *value = PyLong_FromSsize_t(was + run);
    if (value == NULL) return -1;
    int rc = PyDict_SetItem(counts, domain, value);
    Py_DECREF(value);
    return rc;
}

/* update_run(entries, records, start, now_ms, max_ahead_ms, room, holds, counts)
 *   -> (stop, refused, moved, unheld)
 * See update_run_python for the contract. */
static PyObject *update_run(PyObject *self, PyObject *args) {
    PyObject *entries, *records, *holds, *counts;
    Py_ssize_t start, room;
    long long now, max_ahead;
    if (!PyArg_ParseTuple(args, "O!O!nLLnOO", &PyDict_Type, &entries, &PyList_Type, &records,
                          &start, &now, &max_ahead, &room, &holds, &counts))
        return NULL;
    if ((holds != Py_None && !PyDict_Check(holds)) || (counts != Py_None && !PyDict_Check(counts))) {
        PyErr_SetString(PyExc_TypeError, "holds and counts must be dicts or None");
        return NULL;
    }
    PyObject *unheld = PyList_New(0);
    if (unheld == NULL) return NULL;
    Py_ssize_t refused = 0, moved = 0, n = PyList_GET_SIZE(records), i = start, run = 0;
    PyObject *last = NULL; /* the domain of the current run (borrowed from a record) */
    PyObject *line = NULL; /* holds[last], borrowed; NULL: none */
    double offset = 0.0;   /* ...and, when it is a tuple, its parts */
    PyObject *local = NULL;
    Py_ssize_t cap = 0;
    for (; i < n; i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) != 3) {
            PyErr_SetString(PyExc_TypeError, "each record must be (domain, identifier, until_ms)");
            goto fail;
        }
        PyObject *domain = PyTuple_GET_ITEM(record, 0), *ident = PyTuple_GET_ITEM(record, 1);
        long long until = PyLong_AsLongLong(PyTuple_GET_ITEM(record, 2));
        if (until == -1 && PyErr_Occurred()) goto fail;
        if (domain != last) {
            if (last != NULL && tally(counts, last, run) < 0) goto fail;
            run = 0;
            last = domain;
            line = NULL;
            if (holds != Py_None) {
                line = PyDict_GetItemWithError(holds, domain);
                if (line == NULL && PyErr_Occurred()) goto fail;
                if (line != NULL && line != Py_None &&
                    !PyArg_ParseTuple(line, "dO!n", &offset, &PyDict_Type, &local, &cap))
                    goto fail;
            }
        }
        if (until <= now) {
            run++;
            continue;
        }
        if (until - now > max_ahead) {
            refused++;
            run++;
            continue;
        }
        PyObject *key = PyTuple_Pack(2, domain, ident);
        if (key == NULL) goto fail;
        PyObject *value = PyTuple_GET_ITEM(record, 2);
        PyObject *old; /* borrowed */
        Py_ssize_t size = PyDict_GET_SIZE(entries);
        if (size < room) {
            old = PyDict_SetDefault(entries, key, value); /* one probe for a new key */
        } else {
            old = PyDict_GetItemWithError(entries, key);
            if (old == NULL && !PyErr_Occurred()) {
                Py_DECREF(key);
                break; /* the caller sweeps (and evicts), then calls again from here */
            }
        }
        if (old == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        if (PyDict_GET_SIZE(entries) == size) { /* it was there: only ever moved on */
            long long was = PyLong_AsLongLong(old);
            int rc = was == -1 && PyErr_Occurred() ? -1 : 0;
            if (rc == 0 && until > was) rc = PyDict_SetItem(entries, key, value);
            if (rc < 0 || until <= was) {
                Py_DECREF(key);
                if (rc < 0) goto fail;
                run++;
                continue;
            }
        }
        Py_DECREF(key);
        run++;
        moved++;
        if (holds == Py_None || (line != NULL && line == Py_None)) {
            if (PyList_Append(unheld, record) < 0) goto fail;
        } else if (line != NULL) {
            if (hold(local, ident, (double)until + offset, cap) < 0) goto fail;
        }
    }
    if (last != NULL && tally(counts, last, run) < 0) goto fail;
    return Py_BuildValue("(nnnN)", i, refused, moved, unheld);
fail:
    Py_DECREF(unheld);
    return NULL;
}

/* Whether one time (an int or a float of milliseconds) is at most now_ms: 1, 0, or -1
 * with an exception. ``exact``: now_ms is exact as a double (|now| <= 2**53). */
static int at_most(PyObject *value, long long now, int exact, double now_d, PyObject **now_obj) {
    if (PyLong_CheckExact(value)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow) return overflow < 0;
        if (v == -1 && PyErr_Occurred()) return -1;
        return v <= now;
    }
    if (PyFloat_CheckExact(value) && exact) return PyFloat_AS_DOUBLE(value) <= now_d; /* NaN: 0 */
    if (*now_obj == NULL && (*now_obj = PyLong_FromLongLong(now)) == NULL) return -1;
    Py_INCREF(value);
    int le = PyObject_RichCompareBool(value, *now_obj, Py_LE);
    Py_DECREF(value);
    return le;
}

/* max(times) <= now_ms for a tuple of times, with max() as Python computes it (the first
 * of equal ones; a NaN kept only where max() keeps it). */
static int latest_at_most(PyObject *times, long long now, int exact, double now_d,
                          PyObject **now_obj) {
    Py_ssize_t n = PyTuple_GET_SIZE(times);
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "max() arg is an empty sequence");
        return -1;
    }
    PyObject *best = PyTuple_GET_ITEM(times, 0);
    int floats = PyFloat_CheckExact(best);
    for (Py_ssize_t i = 1; i < n && floats; i++) floats = PyFloat_CheckExact(PyTuple_GET_ITEM(times, i));
    if (floats) { /* the usual case: a first line's arrival times */
        Py_ssize_t at = 0;
        double top = PyFloat_AS_DOUBLE(best);
        for (Py_ssize_t i = 1; i < n; i++) {
            double x = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(times, i));
            if (x > top) top = x, at = i;
        }
        best = PyTuple_GET_ITEM(times, at);
    } else {
        Py_INCREF(times); /* a comparison may run Python code */
        for (Py_ssize_t i = 1; i < n; i++) {
            PyObject *item = PyTuple_GET_ITEM(times, i);
            int gt = PyObject_RichCompareBool(item, best, Py_GT);
            if (gt < 0) {
                Py_DECREF(times);
                return -1;
            }
            if (gt) best = item;
        }
        Py_DECREF(times);
    }
    return at_most(best, now, exact, now_d, now_obj);
}

/* passed(table, now_ms) -> [key, ...]: the keys whose value, a time (an int or a float
 * of milliseconds) or a tuple of times (its latest), is at most now_ms, in the table's
 * order. The compiled twin of smockron.gatekeeper._table.passed_python: a sweep of a
 * million live entries, once a second, took 20 ms (ints) to 130 ms (tuples) of a
 * gatekeeper's loop in Python. */
static PyObject *passed(PyObject *self, PyObject *args) {
    PyObject *table;
    long long now;
    if (!PyArg_ParseTuple(args, "O!L", &PyDict_Type, &table, &now)) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    /* a double holds every integer up to 2**53 exactly: beyond, compare as Python does */
    const int exact = now <= (1LL << 53) && now >= -(1LL << 53);
    const double now_d = (double)now;
    PyObject *now_obj = NULL, *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(table, &pos, &key, &value)) {
        int le = PyTuple_Check(value) ? latest_at_most(value, now, exact, now_d, &now_obj)
                                           : at_most(value, now, exact, now_d, &now_obj);
        if (le < 0) goto fail;
        if (le && PyList_Append(out, key) < 0) goto fail;
    }
    Py_XDECREF(now_obj);
    return out;
fail:
    Py_XDECREF(now_obj);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"passed", passed, METH_VARARGS,
     "passed(table, now_ms) -> the keys whose value is at most now_ms."},
    {"update_run", update_run, METH_VARARGS,
     "update_run(entries, records, start, now_ms, max_ahead_ms, room, holds, counts) -> "
     "(stop, refused, moved, unheld)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tablefast", "A gatekeeper's DELAY_UNTILs applied, and its sweeps' scans, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__tablefast(void) { return PyModule_Create(&module); }
