// gRPC channel options from Python: a sequence of (name, value) pairs, value int or str.
// One parser for the native server (_native.cc) and the native client (_nativeclient.cc).
#pragma once

#include <Python.h>

#include <string>

// Calls on_int(name, value) or on_str(name, value) for each pair; -1 with a Python
// error set when ``options`` is not such a sequence or a value is neither int nor str.
template <typename OnInt, typename OnStr>
int for_each_grpc_option(PyObject* options, OnInt on_int, OnStr on_str) {
  if (options == nullptr || options == Py_None) return 0;
  PyObject* seq = PySequence_Fast(options, "options must be a sequence of (name, value)");
  if (seq == nullptr) return -1;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const char* name;
    PyObject* value;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "sO", &name, &value)) {
      Py_DECREF(seq);
      return -1;
    }
    if (PyLong_Check(value)) {
      on_int(std::string(name), static_cast<int>(PyLong_AsLong(value)));
    } else if (PyUnicode_Check(value)) {
      on_str(std::string(name), std::string(PyUnicode_AsUTF8(value)));
    } else {
      Py_DECREF(seq);
      PyErr_Format(PyExc_TypeError, "gRPC option %s: int or str expected", name);
      return -1;
    }
  }
  Py_DECREF(seq);
  return 0;
}
