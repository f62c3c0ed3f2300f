// The native gRPC transport: a libgrpc++ server with one *generic* callback service
// (raw bytes, no protobuf here) that hands every call to one Python callable.
//
//   server = _native.Server(dispatch, "127.0.0.1:1051", [("grpc.so_reuseport", 0), ...])
//   server.port                       -> bound port (0 when the address cannot be bound)
//   dispatch(call, method: str, request: bytes)   called on a gRPC thread, GIL held
//   call.finish(code: int, response: bytes | None, details: str) -> bool
//                                     once, from any thread (later calls return False)
//   call.peer                         -> the client's address, as grpc.ServicerContext.peer()
//   server.shutdown(grace_seconds)    stop taking calls; cancel those still running after
//                                     grace; returns when every call is done
//   _finish_relayed                   capsule: int(PyObject* call, const char*, size_t),
//                                     answers a call without the GIL (_nativeclient's relay)
//   server.stats() -> dict            calls / no_request / dispatch_errors / finished_late
//   tls = (key path, cert path, client CA path | None, request type, refresh seconds[,
//          san_check])              san_check(dns_names, ip_names) -> None | error text,
//                                     called once per connection whose client showed a
//                                     certificate (GRPC_CLIENT_TLS_SAN): text refuses it
//
// All logic stays in Python (smockron/cluster/transports/native.py). A call that Python drops
// without finishing is finished with INTERNAL when its Call object is freed; a call the
// client cancels is finished here, and Python's later finish() is a no-op. The GIL is
// taken (PyGILState_Ensure) only around dispatch and released while gRPC works.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_grpc_options.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

class Reactor;

struct Core {
  PyObject* dispatch = nullptr;  // strong ref, released under the GIL by the Server object
  PyObject* san_check = nullptr;  // likewise (None when not asked for)
  std::unique_ptr<grpc::CallbackGenericService> service;
  std::unique_ptr<grpc::Server> server;
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable idle;
  long outstanding = 0;  // reactors alive, under mu
  std::atomic<long> calls{0}, no_request{0}, dispatch_errors{0}, finished_late{0};
};

// One finish per call, whoever comes first: Python (finish / dealloc) or gRPC (OnCancel).
struct Slot {
  std::mutex mu;
  Reactor* reactor = nullptr;
  // While the dispatching thread is in Python, finish() only records the answer; that
  // thread sends it after letting go of the GIL (no GIL hand-off per answer).
  bool dispatching = false;
  Reactor* held = nullptr;
  grpc::StatusCode code = grpc::StatusCode::OK;
  bool has_payload = false;
  std::string payload, details;
};

Reactor* take(const std::shared_ptr<Slot>& slot) {
  std::lock_guard<std::mutex> lock(slot->mu);
  Reactor* r = slot->reactor;
  slot->reactor = nullptr;
  return r;
}

class Reactor : public grpc::ServerGenericBidiReactor {
 public:
  Reactor(Core* core, grpc::GenericCallbackServerContext* ctx)
      : core_(core), ctx_(ctx), slot_(std::make_shared<Slot>()) {
    slot_->reactor = this;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      ++core_->outstanding;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override;

  void OnCancel() override {
    Reactor* r = take(slot_);
    if (r != nullptr) {
      core_->finished_late++;
      r->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    }
  }

  void OnDone() override {
    Core* core = core_;
    delete this;
    std::lock_guard<std::mutex> lock(core->mu);
    if (--core->outstanding == 0) core->idle.notify_all();
  }

  // The winner of take() sends the answer (no GIL needed).
  void Send(grpc::StatusCode code, const std::string* payload, const std::string& details) {
    if (code == grpc::StatusCode::OK && payload != nullptr) {
      grpc::Slice slice(*payload);
      response_ = grpc::ByteBuffer(&slice, 1);
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      Finish(grpc::Status(code, details));
    }
  }

  std::shared_ptr<Slot> slot() const { return slot_; }

 private:
  Core* core_;
  grpc::GenericCallbackServerContext* ctx_;
  std::shared_ptr<Slot> slot_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
};

// ---- the Python Call object -------------------------------------------------------

struct CallObject {
  PyObject_HEAD
  std::shared_ptr<Slot>* slot;  // heap, so the C struct stays POD
  PyObject* peer;
};

// ``gil``: the caller holds it (released while gRPC sends); else it is not taken at all.
bool finish_call(CallObject* self, grpc::StatusCode code, const char* data, Py_ssize_t size,
                 const std::string& details, bool gil = true) {
  Slot& slot = **self->slot;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    if (slot.reactor == nullptr) return false;
    if (slot.dispatching) {
      slot.held = slot.reactor;
      slot.reactor = nullptr;
      slot.code = code;
      slot.has_payload = data != nullptr;
      if (data != nullptr) slot.payload.assign(data, static_cast<size_t>(size));
      slot.details = details;
      return true;
    }
  }
  Reactor* r = take(*self->slot);
  if (r == nullptr) return false;
  std::string payload;
  if (data != nullptr) payload.assign(data, static_cast<size_t>(size));
  PyThreadState* state = gil ? PyEval_SaveThread() : nullptr;
  r->Send(code, data != nullptr ? &payload : nullptr, details);
  if (state != nullptr) PyEval_RestoreThread(state);
  return true;
}

PyObject* Call_finish(PyObject* op, PyObject* args) {
  auto* self = reinterpret_cast<CallObject*>(op);
  int code = 0;
  Py_buffer data{};
  data.buf = nullptr;
  const char* details = "";
  Py_ssize_t details_len = 0;
  PyObject* payload = Py_None;
  if (!PyArg_ParseTuple(args, "iO|s#", &code, &payload, &details, &details_len)) return nullptr;
  if (code < 0 || code > 16) {
    PyErr_SetString(PyExc_ValueError, "gRPC status code out of range");
    return nullptr;
  }
  bool done;
  std::string det(details, static_cast<size_t>(details_len));
  if (payload == Py_None) {
    done = finish_call(self, static_cast<grpc::StatusCode>(code), nullptr, 0, det);
  } else {
    if (PyObject_GetBuffer(payload, &data, PyBUF_SIMPLE) < 0) return nullptr;
    done = finish_call(self, static_cast<grpc::StatusCode>(code),
                       static_cast<const char*>(data.buf), data.len, det);
    PyBuffer_Release(&data);
  }
  return PyBool_FromLong(done);
}

PyObject* Call_get_peer(PyObject* op, void*) {
  auto* self = reinterpret_cast<CallObject*>(op);
  Py_INCREF(self->peer);
  return self->peer;
}

PyObject* Call_get_done(PyObject* op, void*) {
  auto* self = reinterpret_cast<CallObject*>(op);
  std::lock_guard<std::mutex> lock((*self->slot)->mu);
  return PyBool_FromLong((*self->slot)->reactor == nullptr);
}

void Call_dealloc(PyObject* op) {
  auto* self = reinterpret_cast<CallObject*>(op);
  if (self->slot != nullptr) {
    finish_call(self, grpc::StatusCode::INTERNAL, nullptr, 0, "call dropped unanswered");
    delete self->slot;
  }
  Py_XDECREF(self->peer);
  Py_TYPE(op)->tp_free(op);
}

PyMethodDef Call_methods[] = {
    {"finish", Call_finish, METH_VARARGS,
     "finish(code, response_or_None, details='') -> bool: answer the call once."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef Call_getset[] = {
    {"peer", Call_get_peer, nullptr, "the client's address", nullptr},
    {"done", Call_get_done, nullptr, "True once finished or cancelled", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject CallType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// _nativeclient's relay (the capsule ``_finish_relayed``): answers ``op`` with ``data``
// from a thread that holds no GIL, the caller keeping ``op`` alive. 1: answered, 0:
// finished already (cancelled), -1: not a Call.
int finish_relayed(PyObject* op, const char* data, size_t size) {
  if (Py_TYPE(op) != &CallType) return -1;
  auto* self = reinterpret_cast<CallObject*>(op);
  return finish_call(self, grpc::StatusCode::OK, data, static_cast<Py_ssize_t>(size), "", false);
}

void Reactor::OnReadDone(bool ok) {
  if (!ok) {  // the client half-closed without a message
    core_->no_request++;
    if (Reactor* r = take(slot_)) r->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "no request message"));
    return;
  }
  if (core_->stopping.load() || _Py_IsFinalizing()) {
    if (Reactor* r = take(slot_)) r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server stopping"));
    return;
  }
  core_->calls++;
  std::vector<grpc::Slice> slices;
  request_.Dump(&slices);
  std::string body;
  if (slices.size() == 1) {
    body.assign(reinterpret_cast<const char*>(slices[0].begin()), slices[0].size());
  } else {
    for (const auto& s : slices) body.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  request_.Clear();
  const std::string& method = ctx_->method();
  std::string peer = ctx_->peer();
  // From here on `this` may be finished and deleted by another thread: use locals only.
  Core* core = core_;
  std::shared_ptr<Slot> slot = slot_;
  {
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->dispatching = true;
  }
  // A gRPC thread gets its Python thread state once and keeps it (the outer Ensure is
  // never released): a plain Ensure/Release pair would create and destroy one per call.
  thread_local bool python_thread = false;
  if (!python_thread) {
    PyGILState_Ensure();
    PyEval_SaveThread();
    python_thread = true;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  auto* call = PyObject_New(CallObject, &CallType);
  bool ok_call = false;
  if (call != nullptr) {
    call->slot = new std::shared_ptr<Slot>(slot);
    call->peer = PyUnicode_DecodeUTF8(peer.data(), static_cast<Py_ssize_t>(peer.size()), "replace");
    if (call->peer == nullptr) {
      call->peer = PyUnicode_FromString("");
      PyErr_Clear();
    }
    PyObject* result = PyObject_CallFunction(
        core->dispatch, "Os#y#", reinterpret_cast<PyObject*>(call), method.data(),
        static_cast<Py_ssize_t>(method.size()), body.data(), static_cast<Py_ssize_t>(body.size()));
    if (result != nullptr) {
      ok_call = true;
      Py_DECREF(result);
    } else {
      core->dispatch_errors++;
      PyErr_WriteUnraisable(core->dispatch);
    }
    Py_DECREF(call);  // finishes with INTERNAL if Python neither answered nor kept it
  } else {
    PyErr_Clear();
  }
  PyGILState_Release(gil);
  Reactor* held;
  {
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->dispatching = false;
    held = slot->held;
    slot->held = nullptr;
  }
  if (held != nullptr) {
    held->Send(slot->code, slot->has_payload ? &slot->payload : nullptr, slot->details);
    return;
  }
  if (!ok_call) {
    if (Reactor* r = take(slot)) r->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "dispatch failed"));
  }
}

class Service : public grpc::CallbackGenericService {
 public:
  explicit Service(Core* core) : core_(core) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    return new Reactor(core_, ctx);
  }

 private:
  Core* core_;
};

// ---- GRPC_CLIENT_TLS_SAN: the client certificate's names, checked in the handshake ----

PyObject* name_list(const std::vector<grpc::string_ref>& names) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(names.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < names.size(); ++i) {
    PyObject* item = PyUnicode_DecodeUTF8(names[i].data(), static_cast<Py_ssize_t>(names[i].size()),
                                          "surrogateescape");
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
  }
  return list;
}

// Runs after libgrpc++ verified the chain, as upstream's VerifyPeerCertificate does: a
// connection whose certificate Python's check refuses is closed before any call. The
// check object belongs to the Core (released with it); handshakes end before that.
class SanVerifier : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit SanVerifier(PyObject* check) : check_(check) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    *sync_status = Check(request);
    return true;  // decided synchronously
  }

  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  grpc::Status Check(grpc::experimental::TlsCustomVerificationCheckRequest* request) {
    if (request->peer_cert().empty()) return grpc::Status::OK;  // none shown (verify-cert)
    if (_Py_IsFinalizing()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server stopping");
    grpc::Status status = grpc::Status::OK;
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject* dns = name_list(request->dns_names());
    PyObject* ips = dns == nullptr ? nullptr : name_list(request->ip_names());
    PyObject* result = ips == nullptr ? nullptr : PyObject_CallFunctionObjArgs(check_, dns, ips, nullptr);
    if (result == nullptr) {
      PyErr_WriteUnraisable(check_);
      status = grpc::Status(grpc::StatusCode::INTERNAL, "client certificate check failed");
    } else if (result != Py_None) {
      const char* text = PyUnicode_Check(result) ? PyUnicode_AsUTF8(result) : nullptr;
      if (text == nullptr) PyErr_Clear();
      status = grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                            text != nullptr ? text : "client certificate refused");
    }
    Py_XDECREF(result);
    Py_XDECREF(ips);
    Py_XDECREF(dns);
    PyGILState_Release(gil);
    return status;
  }

  PyObject* check_;  // borrowed from the Core
};

// ---- the Python Server object -----------------------------------------------------

struct ServerObject {
  PyObject_HEAD
  Core* core;
  int port;
};

void shutdown_core(Core* core, double grace) {
  if (core == nullptr || !core->server) return;
  core->stopping.store(true);
  auto deadline = std::chrono::system_clock::now() +
                  std::chrono::microseconds(static_cast<long long>(grace * 1e6));
  core->server->Shutdown(deadline);  // cancels what is left at the deadline
  {
    // calls cancelled or finished: wait for their OnDone (bounded, then leak)
    std::unique_lock<std::mutex> lock(core->mu);
    core->idle.wait_for(lock, std::chrono::seconds(5), [core] { return core->outstanding == 0; });
  }
  core->server->Wait();
}

int Server_init(PyObject* op, PyObject* args, PyObject*) {
  auto* self = reinterpret_cast<ServerObject*>(op);
  PyObject* dispatch;
  const char* address;
  PyObject* options = nullptr;
  PyObject* tls = nullptr;
  if (!PyArg_ParseTuple(args, "Os|OO", &dispatch, &address, &options, &tls)) return -1;
  if (!PyCallable_Check(dispatch)) {
    PyErr_SetString(PyExc_TypeError, "dispatch must be callable");
    return -1;
  }
  if (self->core != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "server already started");
    return -1;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  PyObject* san_check = Py_None;
  if (tls != nullptr && tls != Py_None) {
    // (key path, cert path, client CA path or None, grpc_ssl_client_certificate_request_type,
    // refresh seconds[, san_check]): the files are watched, so a node reloads them
    // without a restart
    const char *key, *cert, *root = nullptr;
    int request = 0;
    unsigned int refresh = 1;
    if (!PyArg_ParseTuple(tls, "ssziI|O", &key, &cert, &root, &request, &refresh, &san_check))
      return -1;
    if (san_check != Py_None && !PyCallable_Check(san_check)) {
      PyErr_SetString(PyExc_TypeError, "san_check must be callable or None");
      return -1;
    }
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        key, cert, root == nullptr ? "" : root, refresh);
    grpc::experimental::TlsServerCredentialsOptions tls_options(provider);
    tls_options.watch_identity_key_cert_pairs();
    if (root != nullptr) tls_options.watch_root_certs();
    tls_options.set_cert_request_type(
        static_cast<grpc_ssl_client_certificate_request_type>(request));
    if (san_check != Py_None) {
      tls_options.set_certificate_verifier(
          grpc::experimental::ExternalCertificateVerifier::Create<SanVerifier>(san_check));
    }
    credentials = grpc::experimental::TlsServerCredentials(tls_options);
  }
  grpc::ServerBuilder builder;
  int parsed = for_each_grpc_option(
      options,
      [&](const std::string& name, int v) {
        if (name == "grpc.max_receive_message_length") {
          builder.SetMaxReceiveMessageSize(v);
        } else {
          builder.AddChannelArgument(name, v);
        }
      },
      [&](const std::string& name, const std::string& v) { builder.AddChannelArgument(name, v); });
  if (parsed < 0) return -1;
  auto* core = new Core();
  Py_INCREF(dispatch);
  core->dispatch = dispatch;
  Py_INCREF(san_check);
  core->san_check = san_check;
  core->service = std::make_unique<Service>(core);
  int port = 0;
  builder.AddListeningPort(address, credentials, &port);
  builder.RegisterCallbackGenericService(core->service.get());
  std::unique_ptr<grpc::Server> server;
  Py_BEGIN_ALLOW_THREADS
  server = builder.BuildAndStart();
  Py_END_ALLOW_THREADS
  if (!server || port == 0) {
    if (server) {
      Py_BEGIN_ALLOW_THREADS
      server->Shutdown();
      Py_END_ALLOW_THREADS
    }
    Py_DECREF(dispatch);
    Py_DECREF(san_check);
    delete core;
    self->port = 0;
    return 0;  // port 0 says "cannot bind", as grpc's add_insecure_port does
  }
  core->server = std::move(server);
  self->core = core;
  self->port = port;
  return 0;
}

PyObject* Server_shutdown(PyObject* op, PyObject* args) {
  auto* self = reinterpret_cast<ServerObject*>(op);
  double grace = 0.0;
  if (!PyArg_ParseTuple(args, "|d", &grace)) return nullptr;
  Core* core = self->core;
  if (core == nullptr || core->stopping.load()) Py_RETURN_NONE;
  Py_BEGIN_ALLOW_THREADS
  shutdown_core(core, grace);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* Server_stats(PyObject* op, PyObject*) {
  auto* self = reinterpret_cast<ServerObject*>(op);
  Core* core = self->core;
  if (core == nullptr) return PyDict_New();
  long outstanding;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    outstanding = core->outstanding;
  }
  return Py_BuildValue("{s:l,s:l,s:l,s:l,s:l}", "calls", core->calls.load(), "no_request",
                       core->no_request.load(), "dispatch_errors", core->dispatch_errors.load(),
                       "finished_late", core->finished_late.load(), "outstanding", outstanding);
}

PyObject* Server_get_port(PyObject* op, void*) {
  return PyLong_FromLong(reinterpret_cast<ServerObject*>(op)->port);
}

void Server_dealloc(PyObject* op) {
  auto* self = reinterpret_cast<ServerObject*>(op);
  Core* core = self->core;
  if (core != nullptr) {
    if (!core->stopping.load()) {
      Py_BEGIN_ALLOW_THREADS
      shutdown_core(core, 0.0);
      Py_END_ALLOW_THREADS
    }
    bool idle;
    {
      std::lock_guard<std::mutex> lock(core->mu);
      idle = core->outstanding == 0;
    }
    if (idle) {
      core->server.reset();
      Py_CLEAR(core->dispatch);
      Py_CLEAR(core->san_check);
      delete core;
    }  // else: a reactor still points at it; leak rather than crash
  }
  Py_TYPE(op)->tp_free(op);
}

PyMethodDef Server_methods[] = {
    {"shutdown", Server_shutdown, METH_VARARGS,
     "shutdown(grace_seconds=0.0): stop; cancel calls still running after grace."},
    {"stats", Server_stats, METH_NOARGS, "counters of the transport"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef Server_getset[] = {
    {"port", Server_get_port, nullptr, "bound port, 0 if the address could not be bound", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject ServerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "smockron.cluster._native",
                          "libgrpc++ generic server handing raw calls to Python", -1,
                          nullptr, nullptr, nullptr, nullptr, nullptr};

// The fields both types set, then PyType_Ready; false with the exception set.
bool ready_type(PyTypeObject& type, const char* name, Py_ssize_t size, destructor dealloc,
                PyMethodDef* methods, PyGetSetDef* getset, const char* doc) {
  type.tp_name = name;
  type.tp_basicsize = size;
  type.tp_flags = Py_TPFLAGS_DEFAULT;
  type.tp_dealloc = dealloc;
  type.tp_methods = methods;
  type.tp_getset = getset;
  type.tp_doc = doc;
  return PyType_Ready(&type) == 0;
}

bool add_type(PyObject* module, const char* name, PyTypeObject& type) {
  Py_INCREF(&type);
  if (PyModule_AddObject(module, name, reinterpret_cast<PyObject*>(&type)) < 0) {
    Py_DECREF(&type);
    return false;
  }
  return true;
}

}  // namespace

PyMODINIT_FUNC PyInit__native(void) {
  ServerType.tp_new = PyType_GenericNew;
  ServerType.tp_init = Server_init;
  if (!ready_type(CallType, "smockron.cluster._native.Call", sizeof(CallObject), Call_dealloc,
                  Call_methods, Call_getset, "one gRPC call, answered with finish()") ||
      !ready_type(ServerType, "smockron.cluster._native.Server", sizeof(ServerObject),
                  Server_dealloc, Server_methods, Server_getset,
                  "Server(dispatch, address, options=()): a started libgrpc++ server"))
    return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  PyObject* relay = PyCapsule_New(reinterpret_cast<void*>(&finish_relayed),
                                  "smockron.cluster._native._finish_relayed", nullptr);
  if (relay == nullptr || PyModule_AddObject(m, "_finish_relayed", relay) < 0) {
    Py_XDECREF(relay);
    Py_DECREF(m);
    return nullptr;
  }
  if (!add_type(m, "Call", CallType) || !add_type(m, "Server", ServerType)) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
