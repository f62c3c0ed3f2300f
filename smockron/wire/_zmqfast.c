/* ZeroMQ batch receive and send in C, for the master's receive loop and RESYNC answers,
 * and the gatekeepers' accounting and control reader: whole messages to and from a
 * pyzmq socket.
 *
 * Why: in Python each frame costs a method call, a Frame object and, with
 * recv_multipart, a getsockopt(RCVMORE) round through pyzmq. Here a batch of
 * messages costs one call: zmq_msg_recv + zmq_msg_more per frame, bytes built directly.
 *
 * libzmq is not linked at build time: pyzmq wheels ship their own libzmq without
 * zmq.h, and a second copy of libzmq must never touch pyzmq's sockets. bind() is given
 * the path of the libzmq pyzmq already loaded and takes the few symbols needed from
 * that very copy (dlopen RTLD_NOLOAD). The declarations below follow zmq.h (4.x ABI).
 * Without a compiler smockron uses the pure-Python twins in batchio.py and accounting.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

typedef struct { unsigned char _[64]; } __attribute__((aligned(8))) zmq_msg_t;

#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2
#define MAX_FRAMES 68  /* codec.MAX_FRAMES: a RULES offer of 64 rules; checked at import */

static int (*p_msg_init)(zmq_msg_t *);
static int (*p_msg_recv)(zmq_msg_t *, void *, int);
static void *(*p_msg_data)(zmq_msg_t *);
static size_t (*p_msg_size)(const zmq_msg_t *);
static int (*p_msg_more)(const zmq_msg_t *);
static int (*p_msg_close)(zmq_msg_t *);
static int (*p_send)(void *, const void *, size_t, int);
static int (*p_errno)(void);
static const char *(*p_strerror)(int);

static PyObject *ZMQError;  /* set by bind(): the exception class to raise */
static PyObject *Oversized; /* set by bind(): codec.Oversized, for longer messages */

static PyObject *zmqfast_bind(PyObject *self, PyObject *args) {
    const char *path;
    PyObject *error_class, *oversized_class;
    if (!PyArg_ParseTuple(args, "sOO", &path, &error_class, &oversized_class)) return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "libzmq %s is not loaded: %s", path, dlerror());
        return NULL;
    }
#define SYM(var, name)                                                          \
    *(void **)(&var) = dlsym(lib, name);                                        \
    if (var == NULL) {                                                          \
        PyErr_Format(PyExc_ImportError, "libzmq %s lacks %s", path, name);      \
        return NULL;                                                            \
    }
    SYM(p_msg_init, "zmq_msg_init");
    SYM(p_msg_recv, "zmq_msg_recv");
    SYM(p_msg_data, "zmq_msg_data");
    SYM(p_msg_size, "zmq_msg_size");
    SYM(p_msg_more, "zmq_msg_more");
    SYM(p_msg_close, "zmq_msg_close");
    SYM(p_send, "zmq_send");
    SYM(p_errno, "zmq_errno");
    SYM(p_strerror, "zmq_strerror");
#undef SYM
    Py_XDECREF(ZMQError);
    Py_INCREF(error_class);
    ZMQError = error_class;
    Py_XDECREF(Oversized);
    Py_INCREF(oversized_class);
    Oversized = oversized_class;
    Py_RETURN_NONE;
}

/* Receive one frame; -1 with errno in *err on failure. The frame becomes bytes. */
static int recv_frame(void *sock, int flags, PyObject **out, int *more, int *err) {
    zmq_msg_t msg;
    p_msg_init(&msg);
    for (;;) {
        if (p_msg_recv(&msg, sock, flags) >= 0) break;
        *err = p_errno();
        if (*err != EINTR) {
            p_msg_close(&msg);
            return -1;
        }
    }
    *more = p_msg_more(&msg);
    if (out != NULL)
        *out = PyBytes_FromStringAndSize((const char *)p_msg_data(&msg),
                                         (Py_ssize_t)p_msg_size(&msg));
    p_msg_close(&msg);
    return 0;
}

static PyObject *raise_zmq(int err) {
    PyObject *exc = PyObject_CallFunction(ZMQError, "i", err);
    if (exc != NULL) {
        PyErr_SetObject(ZMQError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* The error, carrying in ``sent`` how many whole messages went out before it. */
static PyObject *raise_zmq_after(int err, Py_ssize_t sent) {
    PyObject *exc = PyObject_CallFunction(ZMQError, "i", err);
    if (exc == NULL) return NULL;
    PyObject *count = PyLong_FromSsize_t(sent);
    if (count == NULL || PyObject_SetAttrString(exc, "sent", count) < 0) {
        Py_XDECREF(count);
        Py_DECREF(exc);
        return NULL;
    }
    Py_DECREF(count);
    PyErr_SetObject(ZMQError, exc);
    Py_DECREF(exc);
    return NULL;
}

static PyObject *UNDERLYING; /* "underlying", interned once at import (see below) */

/* The libzmq socket behind a pyzmq Socket (its ``underlying`` address); NULL with an
 * exception set when it has none or is closed.
 *
 * The name is one interned string, not PyObject_GetAttrString's new string per call:
 * CPython's type attribute cache keeps a reference to the name of each lookup, in a
 * slot chosen by the string's address, so every fresh "underlying" stayed alive there.
 * Made during a wave of messages, hundreds of them outlived it and each kept a 1 MiB
 * arena of pymalloc from being returned (smockron.memory). */
static void *socket_handle(PyObject *socket) {
    PyObject *handle = PyObject_GetAttr(socket, UNDERLYING);
    if (handle == NULL) return NULL;
    void *sock = PyLong_AsVoidPtr(handle);
    Py_DECREF(handle);
    if (sock == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "socket is closed");
    return sock;
}

/* A message of ``total`` frames of which ``kept`` (a list) were kept: the list itself,
 * or, when frames were dropped, codec.Oversized(kept, total). Steals ``kept``. */
static PyObject *whole_or_oversized(PyObject *kept, Py_ssize_t total) {
    if (kept == NULL || total <= PyList_GET_SIZE(kept)) return kept;
    PyObject *out = PyObject_CallFunction(Oversized, "On", kept, total);
    Py_DECREF(kept);
    return out;
}

/* drain(socket, limit) -> list of messages (lists of bytes); never blocks. */
static PyObject *zmqfast_drain(PyObject *self, PyObject *args) {
    PyObject *socket;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "On", &socket, &limit)) return NULL;
    if (p_msg_recv == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_zmqfast.bind() was not called");
        return NULL;
    }
    void *sock = socket_handle(socket);
    if (sock == NULL) return NULL;
    PyObject *batch = PyList_New(0);
    if (batch == NULL) return NULL;
    while (PyList_GET_SIZE(batch) < limit) {
        PyObject *frame = NULL;
        int more = 0, err = 0;
        if (recv_frame(sock, ZMQ_DONTWAIT, &frame, &more, &err) < 0) {
            if (err == EAGAIN) break;
            Py_DECREF(batch);
            return raise_zmq(err);
        }
        if (frame == NULL) goto fail;
        PyObject *message = PyList_New(1);
        if (message == NULL) {
            Py_DECREF(frame);
            goto fail;
        }
        PyList_SET_ITEM(message, 0, frame);
        Py_ssize_t total = 1;
        while (more) {
            /* the rest of a multipart message has arrived with its first frame; past
             * MAX_FRAMES frames are only counted (memory stays bounded) */
            int keep = total < MAX_FRAMES;
            frame = NULL;
            if (recv_frame(sock, 0, keep ? &frame : NULL, &more, &err) < 0) {
                Py_DECREF(message);
                Py_DECREF(batch);
                return raise_zmq(err);
            }
            total++;
            if (keep) {
                int appended = frame == NULL ? -1 : PyList_Append(message, frame);
                Py_XDECREF(frame);
                if (appended < 0) {
                    Py_DECREF(message);
                    goto fail;
                }
            }
        }
        message = whole_or_oversized(message, total);
        if (message == NULL) goto fail;
        int appended = PyList_Append(batch, message);
        Py_DECREF(message);
        if (appended < 0) goto fail;
    }
    return batch;
fail:
    Py_DECREF(batch);
    return NULL;
}

/* The libzmq socket to send on, or NULL with an exception set. */
static void *sending_socket(PyObject *socket) {
    if (p_send == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_zmqfast.bind() was not called");
        return NULL;
    }
    return socket_handle(socket);
}

/* Frame j of a message of n, without blocking: 1 sent; 0 not taken (only the first
 * frame can be: the message is skipped); -1 an error, in *err. */
static int send_part(void *sock, const void *data, size_t size, Py_ssize_t j, Py_ssize_t n,
                     int *err) {
    int rc;
    do {
        rc = p_send(sock, data, size, ZMQ_DONTWAIT | (j + 1 < n ? ZMQ_SNDMORE : 0));
    } while (rc < 0 && p_errno() == EINTR);
    if (rc >= 0) return 1;
    *err = p_errno();
    return *err == EAGAIN && j == 0 ? 0 : -1;
}

/* send_all(socket, messages, stop=False) -> how many were sent. Each message is a list
 * of bytes. Never blocks: a message the socket cannot take now is skipped (a PUB drops at
 * its high-water mark anyway), or, with ``stop``, ends the call. A message's frames go atomically: once its first frame is
 * accepted, the others are too. Any other error raises ZMQError whose ``sent`` says
 * how many messages went out before it. */
static PyObject *zmqfast_send_all(PyObject *self, PyObject *args) {
    PyObject *socket, *messages;
    int stop = 0; /* a message not taken ends the call instead of being skipped */
    if (!PyArg_ParseTuple(args, "OO!|p", &socket, &PyList_Type, &messages, &stop)) return NULL;
    void *sock = sending_socket(socket);
    if (sock == NULL) return NULL;
    Py_ssize_t sent = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(messages); i++) {
        PyObject *frames = PyList_GET_ITEM(messages, i);
        if (!PyList_Check(frames)) {
            PyErr_SetString(PyExc_TypeError, "each message must be a list of bytes");
            return NULL;
        }
        Py_ssize_t n = PyList_GET_SIZE(frames);
        for (Py_ssize_t j = 0; j < n; j++) {
            if (!PyBytes_Check(PyList_GET_ITEM(frames, j))) {
                PyErr_SetString(PyExc_TypeError, "each frame must be bytes");
                return NULL;
            }
        }
        for (Py_ssize_t j = 0; j < n; j++) {
            PyObject *frame = PyList_GET_ITEM(frames, j);
            int err = 0;
            int rc = send_part(sock, PyBytes_AS_STRING(frame), (size_t)PyBytes_GET_SIZE(frame),
                               j, n, &err);
            if (rc == 0 && stop) return PyLong_FromSsize_t(sent);
            if (rc == 0) break;  /* not taken: skip this message */
            if (rc < 0) return raise_zmq_after(err, sent);
            if (j + 1 == n) sent++;
        }
    }
    return PyLong_FromSsize_t(sent);
}

/* ASCII decimal, at most max_digits digits, at most max_value; -1 if not. */
static long long parse_ts(const unsigned char *p, size_t n, size_t max_digits,
                          long long max_value) {
    if (n == 0 || n > max_digits) return -1;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v <= max_value ? v : -1;
}

static int frame_is(zmq_msg_t *m, PyObject *word) {
    size_t n = p_msg_size(m);
    return n == (size_t)PyBytes_GET_SIZE(word) &&
           memcmp(p_msg_data(m), PyBytes_AS_STRING(word), n) == 0;
}

/* What a message is checked against (drain_accounting and drain_control). */
typedef struct {
    PyObject *topics, *words[3];  /* topic -> domain; ACCEPTED, DELAYED, REJECTED or DELAY_UNTIL */
    Py_ssize_t max_id, max_log, max_digits;
    long long max_ts;
} Contract;

/* The twin of smockron.wire.accounting.split_accounting, in C. A message that
 * is plainly valid for a configured domain becomes the engine's tuple
 * (domain, status, identifier, received, delayed or None), timestamps as floats; anything else is returned
 * as raw frames for the Python codec, which names the problem (or finds it valid). */
static PyObject *decode_one(zmq_msg_t *f, int n, const Contract *c) {
    PyObject *topics = c->topics, *const *statuses = c->words;
    size_t max_id = (size_t)c->max_id, max_log = (size_t)c->max_log;
    size_t max_digits = (size_t)c->max_digits;
    long long max_ts = c->max_ts;
    if (n != 5 && n != 6) Py_RETURN_NONE;
    PyObject *key = PyBytes_FromStringAndSize((const char *)p_msg_data(&f[0]),
                                              (Py_ssize_t)p_msg_size(&f[0]));
    if (key == NULL) return NULL;
    PyObject *dom = PyDict_GetItemWithError(topics, key);  /* borrowed */
    Py_DECREF(key);
    if (dom == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    if (p_msg_size(&f[2]) > max_id) Py_RETURN_NONE;
    if (n == 6 && p_msg_size(&f[5]) > max_log) Py_RETURN_NONE;
    long long received = parse_ts(p_msg_data(&f[3]), p_msg_size(&f[3]), max_digits, max_ts);
    if (received < 0) Py_RETURN_NONE;
    PyObject *status = NULL;
    long long delayed = -1;
    size_t delayed_n = p_msg_size(&f[4]);
    if (frame_is(&f[1], statuses[0]) && delayed_n == 0) {
        status = statuses[0];
    } else if (frame_is(&f[1], statuses[2]) && delayed_n == 0) {
        status = statuses[2];
    } else if (frame_is(&f[1], statuses[1])) {
        delayed = parse_ts(p_msg_data(&f[4]), delayed_n, max_digits, max_ts);
        if (delayed < 0) Py_RETURN_NONE;
        status = statuses[1];
    } else {
        Py_RETURN_NONE;
    }
    PyObject *ident = PyBytes_FromStringAndSize((const char *)p_msg_data(&f[2]),
                                                (Py_ssize_t)p_msg_size(&f[2]));
    /* float ms, as the engine computes (an int compared with a float costs CPython a
     * conversion every time; timestamps are below 2^53, so exact) */
    PyObject *recv_obj = PyFloat_FromDouble((double)received);
    PyObject *delayed_obj = delayed < 0 ? (Py_INCREF(Py_None), Py_None)
                                        : PyFloat_FromDouble((double)delayed);
    if (ident == NULL || recv_obj == NULL || delayed_obj == NULL) {
        Py_XDECREF(ident);
        Py_XDECREF(recv_obj);
        Py_XDECREF(delayed_obj);
        return NULL;
    }
    Py_INCREF(dom);
    Py_INCREF(status);
    PyObject *t = PyTuple_New(5);
    if (t == NULL) {
        Py_DECREF(dom); Py_DECREF(status); Py_DECREF(ident);
        Py_DECREF(recv_obj); Py_DECREF(delayed_obj);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, dom);
    PyTuple_SET_ITEM(t, 1, status);
    PyTuple_SET_ITEM(t, 2, ident);
    PyTuple_SET_ITEM(t, 3, recv_obj);
    PyTuple_SET_ITEM(t, 4, delayed_obj);
    return t;
}

/* The twin of smockron.wire.control.split_control: a DELAY_UNTIL plainly valid for a
 * subscribed topic becomes (domain, identifier, until ms as int); anything else None. */
static PyObject *decode_control_one(zmq_msg_t *f, int n, const Contract *c) {
    if (n != 4 || !frame_is(&f[1], c->words[0]) || p_msg_size(&f[2]) > (size_t)c->max_id)
        Py_RETURN_NONE;
    long long until = parse_ts(p_msg_data(&f[3]), p_msg_size(&f[3]), (size_t)c->max_digits,
                               c->max_ts);
    if (until < 0) Py_RETURN_NONE;
    PyObject *key = PyBytes_FromStringAndSize((const char *)p_msg_data(&f[0]),
                                              (Py_ssize_t)p_msg_size(&f[0]));
    if (key == NULL) return NULL;
    PyObject *dom = PyDict_GetItemWithError(c->topics, key);  /* borrowed */
    Py_DECREF(key);
    if (dom == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *ident = PyBytes_FromStringAndSize((const char *)p_msg_data(&f[2]),
                                                (Py_ssize_t)p_msg_size(&f[2]));
    if (ident == NULL) return NULL;
    return Py_BuildValue("(ONL)", dom, ident, until);
}

typedef PyObject *(*Decoder)(zmq_msg_t *, int, const Contract *);

static void close_all(zmq_msg_t *f, int n) {
    for (int i = 0; i < n; i++) p_msg_close(&f[i]);
}

/* Up to ``limit`` queued messages, each received straight into zmq_msg_t frames and given
 * to ``decode``: its tuple goes to the records, or (None) the frames become a raw message
 * (codec.Oversized past MAX_FRAMES frames, the rest counted, not kept). ``ordered``: one
 * list, records and raw messages in the order received; else (records, raw). Never
 * blocks. */
static PyObject *drain_decoded(PyObject *socket, Py_ssize_t limit, Decoder decode,
                               const Contract *c, int ordered) {
    if (p_msg_recv == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_zmqfast.bind() was not called");
        return NULL;
    }
    void *sock = socket_handle(socket);
    if (sock == NULL) return NULL;
    PyObject *decoded = PyList_New(0), *raw = decoded;
    if (!ordered) raw = PyList_New(0);
    if (decoded == NULL || raw == NULL) goto fail;
    zmq_msg_t f[MAX_FRAMES];
    for (Py_ssize_t count = 0; count < limit; count++) {
        int n = 0, more = 1, flags = ZMQ_DONTWAIT, rc;
        Py_ssize_t total = 0;
        zmq_msg_t spill;
        while (more) {
            zmq_msg_t *m = n < MAX_FRAMES ? &f[n] : &spill;
            p_msg_init(m);
            do {
                rc = p_msg_recv(m, sock, flags);
            } while (rc < 0 && p_errno() == EINTR);
            if (rc < 0) {
                int err = p_errno();
                p_msg_close(m);
                close_all(f, n);
                if (err == EAGAIN && n == 0) goto done;
                Py_DECREF(decoded);
                if (!ordered) Py_DECREF(raw);
                return raise_zmq(err);
            }
            more = p_msg_more(m);
            total++;
            if (n < MAX_FRAMES) n++;
            else p_msg_close(m);
            flags = 0;  /* the rest of a multipart message has arrived with it */
        }
        PyObject *t = Py_None;
        Py_INCREF(t);
        if (total == n) {
            Py_DECREF(t);
            t = decode(f, n, c);
        }
        if (t == NULL) {
            close_all(f, n);
            goto fail;
        }
        int appended;
        if (t != Py_None) {
            appended = PyList_Append(decoded, t);
        } else {
            PyObject *message = PyList_New(n);
            if (message == NULL) {
                Py_DECREF(t);
                close_all(f, n);
                goto fail;
            }
            for (int i = 0; i < n; i++) {
                PyObject *b = PyBytes_FromStringAndSize((const char *)p_msg_data(&f[i]),
                                                        (Py_ssize_t)p_msg_size(&f[i]));
                if (b == NULL) {
                    Py_DECREF(message);
                    Py_DECREF(t);
                    close_all(f, n);
                    goto fail;
                }
                PyList_SET_ITEM(message, i, b);
            }
            message = whole_or_oversized(message, total);
            appended = message == NULL ? -1 : PyList_Append(raw, message);
            Py_XDECREF(message);
        }
        Py_DECREF(t);
        close_all(f, n);
        if (appended < 0) goto fail;
    }
done:
    if (ordered) return decoded;
    return Py_BuildValue("(NN)", decoded, raw);
fail:
    Py_XDECREF(decoded);
    if (!ordered) Py_XDECREF(raw);
    return NULL;
}

/* drain_accounting(socket, limit, topics, (ACCEPTED, DELAYED, REJECTED),
 *                  (max_identifier, max_loginfo, max_timestamp_digits, max_timestamp_ms))
 * -> (decoded tuples, raw messages); at most limit messages in all; never blocks. */
static PyObject *zmqfast_drain_accounting(PyObject *self, PyObject *args) {
    PyObject *socket;
    Py_ssize_t limit;
    Contract c;
    if (!PyArg_ParseTuple(args, "OnO!(SSS)(nnnL)", &socket, &limit, &PyDict_Type, &c.topics,
                          &c.words[0], &c.words[1], &c.words[2], &c.max_id, &c.max_log,
                          &c.max_digits, &c.max_ts))
        return NULL;
    return drain_decoded(socket, limit, decode_one, &c, 0);
}

/* drain_control(socket, limit, topics, DELAY_UNTIL,
 *               (max_identifier, max_timestamp_digits, max_timestamp_ms))
 * -> DELAY_UNTIL tuples and raw messages, in order; at most limit; never blocks. */
static PyObject *zmqfast_drain_control(PyObject *self, PyObject *args) {
    PyObject *socket;
    Py_ssize_t limit;
    Contract c = {0};
    if (!PyArg_ParseTuple(args, "OnO!S(nnL)", &socket, &limit, &PyDict_Type, &c.topics,
                          &c.words[0], &c.max_id, &c.max_digits, &c.max_ts))
        return NULL;
    return drain_decoded(socket, limit, decode_control_one, &c, 1);
}

/* send_controls(socket, topic, DELAY_UNTIL, [(identifier, until ms), ...], stop=False)
 * -> how many were sent: the frames of codec.control_frames, encoded here (no list per
 * message). Never blocks; what the socket cannot take is skipped, as in send_all, or,
 * with ``stop``, ends the call: the first ``sent`` pairs went, the rest did not. */
static PyObject *zmqfast_send_controls(PyObject *self, PyObject *args) {
    PyObject *socket, *topic, *command, *pairs;
    int stop = 0;
    if (!PyArg_ParseTuple(args, "OSSO!|p", &socket, &topic, &command, &PyList_Type, &pairs,
                          &stop))
        return NULL;
    void *sock = sending_socket(socket);
    if (sock == NULL) return NULL;
    Py_ssize_t sent = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pairs); i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyBytes_Check(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_TypeError, "each pair must be (identifier bytes, until int)");
            return NULL;
        }
        long long until = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
        if (until == -1 && PyErr_Occurred()) return NULL;
        char digits[24];
        int len = snprintf(digits, sizeof digits, "%lld", until);
        PyObject *ident = PyTuple_GET_ITEM(pair, 0);
        const void *data[4] = {PyBytes_AS_STRING(topic), PyBytes_AS_STRING(command),
                               PyBytes_AS_STRING(ident), digits};
        size_t size[4] = {(size_t)PyBytes_GET_SIZE(topic), (size_t)PyBytes_GET_SIZE(command),
                          (size_t)PyBytes_GET_SIZE(ident), (size_t)len};
        for (int j = 0; j < 4; j++) {
            int err = 0, rc = send_part(sock, data[j], size[j], j, 4, &err);
            if (rc == 0 && stop) return PyLong_FromSsize_t(sent);
            if (rc == 0) break;  /* not taken: skip this message */
            if (rc < 0) return raise_zmq_after(err, sent);
            if (j == 3) sent++;
        }
    }
    return PyLong_FromSsize_t(sent);
}

static PyMethodDef methods[] = {
    {"drain_accounting", zmqfast_drain_accounting, METH_VARARGS,
     "drain_accounting(socket, limit, topics, statuses, limits) -> (decoded, raw)."},
    {"drain_control", zmqfast_drain_control, METH_VARARGS,
     "drain_control(socket, limit, topics, DELAY_UNTIL, limits) -> records and raw, in order."},
    {"send_controls", zmqfast_send_controls, METH_VARARGS,
     "send_controls(socket, topic, DELAY_UNTIL, pairs, stop=False) -> number sent; never blocks."},
    {"send_all", zmqfast_send_all, METH_VARARGS,
     "send_all(socket, messages, stop=False) -> number sent; never blocks."},
    {"bind", zmqfast_bind, METH_VARARGS,
     "bind(libzmq_path, ZMQError, Oversized): use the symbols of the libzmq pyzmq loaded."},
    {"drain", zmqfast_drain, METH_VARARGS,
     "drain(socket, limit) -> up to limit queued messages, each a list of bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_zmqfast", "Compiled ZeroMQ batch receive and send (master and gatekeepers).", -1, methods,
};

PyMODINIT_FUNC PyInit__zmqfast(void) {
    UNDERLYING = PyUnicode_InternFromString("underlying");
    if (UNDERLYING == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "MAX_FRAMES", MAX_FRAMES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
