/* The master's receive loop in C: drain whole ZeroMQ messages from a pyzmq socket.
 *
 * Why: in Python each frame costs a method call, a Frame object and, with
 * recv_multipart, a getsockopt(RCVMORE) round through pyzmq. Here a batch of
 * messages costs one call: zmq_msg_recv + zmq_msg_more per frame, bytes built directly.
 *
 * libzmq is not linked at build time: pyzmq wheels ship their own libzmq without
 * zmq.h, and a second copy of libzmq must never touch pyzmq's sockets. bind() is given
 * the path of the libzmq pyzmq already loaded and takes the few symbols needed from
 * that very copy (dlopen RTLD_NOLOAD). The declarations below follow zmq.h (4.x ABI).
 * Without a compiler smockron uses the pure-Python loop in receive.py instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>

typedef struct { unsigned char _[64]; } __attribute__((aligned(8))) zmq_msg_t;

#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2
#define MAX_FRAMES 16

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

static PyObject *fastrecv_bind(PyObject *self, PyObject *args) {
    const char *path;
    PyObject *error_class;
    if (!PyArg_ParseTuple(args, "sO", &path, &error_class)) return NULL;
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

/* drain(socket, limit) -> list of messages (lists of bytes); never blocks. */
static PyObject *fastrecv_drain(PyObject *self, PyObject *args) {
    PyObject *socket;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "On", &socket, &limit)) return NULL;
    if (p_msg_recv == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_fastrecv.bind() was not called");
        return NULL;
    }
    PyObject *handle = PyObject_GetAttrString(socket, "underlying");
    if (handle == NULL) return NULL;
    void *sock = PyLong_AsVoidPtr(handle);
    Py_DECREF(handle);
    if (sock == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "socket is closed");
        return NULL;
    }
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
        int appended = PyList_Append(batch, message);
        Py_DECREF(message);
        if (appended < 0) goto fail;
        while (more) {
            /* the rest of a multipart message has arrived with its first frame */
            int keep = PyList_GET_SIZE(message) < MAX_FRAMES;
            frame = NULL;
            if (recv_frame(sock, 0, keep ? &frame : NULL, &more, &err) < 0) {
                Py_DECREF(batch);
                return raise_zmq(err);
            }
            if (keep) {
                if (frame == NULL) goto fail;
                appended = PyList_Append(message, frame);
                Py_DECREF(frame);
                if (appended < 0) goto fail;
            }
        }
    }
    return batch;
fail:
    Py_DECREF(batch);
    return NULL;
}

/* send_all(socket, messages) -> how many were sent. Each message is a list of bytes.
 * Never blocks: a message the socket cannot take now is skipped (a PUB drops at its
 * high-water mark anyway). A message's frames go atomically: once its first frame is
 * accepted, the others are too. */
static PyObject *fastrecv_send_all(PyObject *self, PyObject *args) {
    PyObject *socket, *messages;
    if (!PyArg_ParseTuple(args, "OO!", &socket, &PyList_Type, &messages)) return NULL;
    if (p_send == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_fastrecv.bind() was not called");
        return NULL;
    }
    PyObject *handle = PyObject_GetAttrString(socket, "underlying");
    if (handle == NULL) return NULL;
    void *sock = PyLong_AsVoidPtr(handle);
    Py_DECREF(handle);
    if (sock == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "socket is closed");
        return NULL;
    }
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
            int flags = ZMQ_DONTWAIT | (j + 1 < n ? ZMQ_SNDMORE : 0);
            int rc;
            do {
                rc = p_send(sock, PyBytes_AS_STRING(frame), (size_t)PyBytes_GET_SIZE(frame),
                            flags);
            } while (rc < 0 && p_errno() == EINTR);
            if (rc < 0) {
                int err = p_errno();
                if (err == EAGAIN && j == 0) break;  /* not taken: skip this message */
                return raise_zmq(err);
            }
            if (j + 1 == n) sent++;
        }
    }
    return PyLong_FromSsize_t(sent);
}

static PyMethodDef methods[] = {
    {"send_all", fastrecv_send_all, METH_VARARGS,
     "send_all(socket, messages) -> number sent; never blocks."},
    {"bind", fastrecv_bind, METH_VARARGS,
     "bind(libzmq_path, ZMQError): use the symbols of the libzmq pyzmq loaded."},
    {"drain", fastrecv_drain, METH_VARARGS,
     "drain(socket, limit) -> up to limit queued messages, each a list of bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastrecv", "Compiled receive loop of the master.", -1, methods,
};

PyMODINIT_FUNC PyInit__fastrecv(void) { return PyModule_Create(&module); }
