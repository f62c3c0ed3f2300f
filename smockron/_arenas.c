/* The pages of pymalloc's free pools handed back to the system.
 *
 * pymalloc (CPython's small-object allocator) returns a 1 MiB arena only when every
 * object in it is gone. After a wave of identifiers a few long-lived objects made
 * during the wave (a counter's last value, a timer's time) each keep one of the wave's
 * arenas, whose other pools are all free but whose pages stay resident: megabytes of
 * RSS that nothing uses.
 *
 * install() puts an arena allocator in front of CPython's (PyObject_SetArenaAllocator),
 * which only records the arenas it hands out. release() walks those arenas and, for each
 * pool with no block in use, marks the pool as never used (its size class set to the
 * value CPython gives a pool it has just carved, so it is initialised afresh when next
 * taken) and hands every page of it but the first, which holds the pool header and
 * the link of the arena's list of free pools, back with madvise(MADV_DONTNEED). A pool
 * taken again is initialised from its header and reads back zeros elsewhere, as a new
 * pool from a new arena does.
 *
 * This reads and writes CPython's pool header, whose layout is not a public API; so it
 * is built for the CPython versions whose layout it knows (3.11 and 3.12, with the radix
 * tree: 1 MiB arenas of 16 KiB pools), checks at run time that arenas are of that size
 * and that a live object's pool header reads as expected, and does nothing otherwise.
 * Everything runs with the GIL held (CPython's allocators require it), so no pool
 * changes under the walk.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000 && defined(MADV_DONTNEED)
#define ARENAS_SUPPORTED 1
#else
#define ARENAS_SUPPORTED 0
#endif

#define ARENA_SIZE ((size_t)1 << 20)
#define POOL_SIZE ((uintptr_t)1 << 14)
#define DUMMY_SIZE_IDX 0xffff

/* CPython 3.11/3.12 Objects/obmalloc.c, struct pool_header */
struct pool_header {
    union { void *_padding; unsigned int count; } ref;
    void *freeblock;
    struct pool_header *nextpool;
    struct pool_header *prevpool;
    unsigned int arenaindex;
    unsigned int szidx;
    unsigned int nextoffset;
    unsigned int maxnextoffset;
};

static PyObjectArenaAllocator previous;
static void **arenas = NULL; /* the arenas handed out since install(), unordered */
static size_t n_arenas = 0, cap_arenas = 0;
static int installed = 0;
static int wrong_size = 0; /* an arena of another size was asked: layout unknown */
static unsigned long long released_pages = 0;

static void *arena_alloc(void *ctx, size_t size) {
    void *p = previous.alloc(previous.ctx, size);
    if (p == NULL) return NULL;
    if (size != ARENA_SIZE) { wrong_size = 1; return p; }
    if (n_arenas == cap_arenas) {
        size_t cap = cap_arenas ? cap_arenas * 2 : 64;
        void **grown = realloc(arenas, cap * sizeof(void *)); /* not pymalloc: we are in it */
        if (grown == NULL) { wrong_size = 1; return p; } /* cannot track: stop releasing */
        arenas = grown;
        cap_arenas = cap;
    }
    arenas[n_arenas++] = p;
    return p;
}

static void arena_free(void *ctx, void *ptr, size_t size) {
    for (size_t i = 0; i < n_arenas; i++) {
        if (arenas[i] == ptr) {
            arenas[i] = arenas[--n_arenas];
            break;
        }
    }
    previous.free(previous.ctx, ptr, size);
}

static PyObject *install(PyObject *self, PyObject *unused) {
    if (!ARENAS_SUPPORTED) Py_RETURN_FALSE;
    if (!installed) {
        PyObjectArenaAllocator mine = {NULL, arena_alloc, arena_free};
        PyObject_GetArenaAllocator(&previous);
        PyObject_SetArenaAllocator(&mine);
        installed = 1;
    }
    Py_RETURN_TRUE;
}

/* Whether a live float's pool header reads as this file expects: pymalloc in use, with
 * this layout (a float is 24 bytes: size class 1, of 32-byte blocks). */
static int layout_checked(void) {
    if (n_arenas == 0) return 0; /* pymalloc not in use (PYTHONMALLOC), or no arena yet */
    PyObject *probe = PyFloat_FromDouble(12345.678);
    if (probe == NULL) { PyErr_Clear(); return 0; }
    uintptr_t at = (uintptr_t)probe;
    /* pymalloc is in use (it took arenas), so a float is one of its blocks, in a pool
     * whose header starts the 16 KiB around it, wherever its arena came from */
    struct pool_header *pool = (struct pool_header *)(at & ~(POOL_SIZE - 1));
    int ok = pool->szidx == 1 && pool->ref.count >= 1 && pool->ref.count <= POOL_SIZE / 32 &&
             pool->maxnextoffset == POOL_SIZE - 32 && pool->nextoffset <= POOL_SIZE;
    Py_DECREF(probe);
    return ok;
}

static PyObject *release(PyObject *self, PyObject *unused) {
    long page = sysconf(_SC_PAGESIZE);
    if (!ARENAS_SUPPORTED || !installed || wrong_size || n_arenas == 0 || page <= 0 ||
        (uintptr_t)page >= POOL_SIZE)
        return PyLong_FromLong(0);
    if (!layout_checked()) return PyLong_FromLong(-1); /* not (or not yet) provable */
    unsigned long long pages = 0;
    for (size_t i = 0; i < n_arenas; i++) {
        uintptr_t base = (uintptr_t)arenas[i];
        uintptr_t first = (base + POOL_SIZE - 1) & ~(POOL_SIZE - 1);
        for (uintptr_t p = first; p + POOL_SIZE <= base + ARENA_SIZE; p += POOL_SIZE) {
            struct pool_header *pool = (struct pool_header *)p;
            /* a pool never carved reads as zeros (maxnextoffset 0): left alone, untouched;
             * one already released (and not taken since) has the dummy size class */
            if (pool->ref.count != 0 || pool->maxnextoffset == 0 || pool->szidx == DUMMY_SIZE_IDX)
                continue;
            pool->szidx = DUMMY_SIZE_IDX;
            if (madvise((void *)(p + page), POOL_SIZE - page, MADV_DONTNEED) == 0)
                pages += (POOL_SIZE - page) / page;
        }
    }
    released_pages += pages;
    return PyLong_FromUnsignedLongLong(pages * page);
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    return Py_BuildValue("{s:O,s:n,s:K,s:O}", "installed", installed ? Py_True : Py_False,
                         "arenas", (Py_ssize_t)n_arenas, "released_pages", released_pages,
                         "layout_known", (ARENAS_SUPPORTED && !wrong_size) ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"install", install, METH_NOARGS,
     "Record the arenas pymalloc takes from now on; False where this build cannot."},
    {"release", release, METH_NOARGS,
     "Hand back the pages of free pools in the recorded arenas: bytes released, 0 where "
     "nothing can be, -1 where the pool layout could not be confirmed."},
    {"stats", stats, METH_NOARGS, "installed, arenas recorded, pages released in all."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_arenas", "pymalloc's free pools handed back.", -1, methods,
};

PyMODINIT_FUNC PyInit__arenas(void) { return PyModule_Create(&module); }
