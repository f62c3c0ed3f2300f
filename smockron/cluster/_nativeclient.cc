// The native gRPC client channel: libgrpc++ unary calls on serialized bytes, for
// smockron/cluster/client/. A libgrpc++ call costs a fraction of the CPU of grpcio's
// Python layer (docs/benchmarks.md), so a single check gets cheaper than a Redis round
// trip. Protobuf stays in Python (the generated classes): only bytes cross here.
//
//   ch = _nativeclient.Channel("127.0.0.1:1051", [("grpc.lb_policy_name", "round_robin")])
//   ch.call(method: str, request: bytes, timeout: float) -> bytes
//         blocking, the GIL released meanwhile; raises CallError(code, details)
//   ch.start(method, request, timeout, token) -> None
//         starts a call and returns at once; its outcome is queued and ch.fileno()
//         (an eventfd) becomes readable; no GIL is taken on gRPC's threads
//   ch.relay(method, request, timeout, limit, items, call, token) -> bool
//         start()'s call for a smockron.cluster._native Call: an answer of ``items``
//         items finishes ``call`` on gRPC's thread (no GIL, no Python, no event loop);
//         any other outcome is queued with ``token`` as start()'s are. False, and
//         nothing started, while ``limit`` relays are in flight (ch.relays);
//         ch.relayed_items counts the items of those answered
//   ch.completions() -> list[(token, code, payload_or_None, details)]
//         drains the queue (and the eventfd); code 0 is OK
//   ch.check(method, timeout, name, key, hits, limit, duration, algorithm, behavior,
//            burst, metadata: dict, created_at: int | None)
//         -> (status, limit, remaining, reset_time, error, metadata: dict)
//         one RateLimitReq's fields in, its RateLimitResp's out, coalesced with the
//         checks of the other threads: the first goes at once, alone; those made while
//         a call is in flight wait and go together in the next (up to 1,000), sent by
//         the oldest of them. Queueing, waiting, sending and waking all happen here
//         with the GIL released; raises CallError(code, details) as call() does
//   encode_request(name, ..., created_at) -> bytes, decode_response(bytes) -> tuple
//         check()'s codec of one item (module functions; the protobuf wire format,
//         the bytes the generated classes would give and take)
//   ch.coalesced_calls -> int   calls check() made
//   ch.close()        cancels calls in flight; later calls raise CallError(UNAVAILABLE)
//
// Plain-text channels only: TLS channels stay on grpcio (client.py decides).

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_grpc_options.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/async_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/byte_buffer.h>
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

PyObject* CallError = nullptr;  // smockron.cluster._nativeclient.CallError(code, details)

grpc::ByteBuffer to_buffer(const char* data, Py_ssize_t size) {
  grpc::Slice slice(data, static_cast<size_t>(size));
  return grpc::ByteBuffer(&slice, 1);
}

// The response as one Python bytes object (nullptr with an exception set).
PyObject* to_bytes(grpc::ByteBuffer& buffer) {
  grpc::Slice single;
  if (buffer.TrySingleSlice(&single).ok()) {
    return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(single.begin()),
                                     static_cast<Py_ssize_t>(single.size()));
  }
  std::vector<grpc::Slice> slices;
  buffer.Dump(&slices);
  size_t total = 0;
  for (const auto& s : slices) total += s.size();
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(total));
  if (out == nullptr) return nullptr;
  char* at = PyBytes_AS_STRING(out);
  for (const auto& s : slices) {
    std::copy(s.begin(), s.end(), at);
    at += s.size();
  }
  return out;
}

void set_deadline(grpc::ClientContext& ctx, double timeout) {
  auto micros = static_cast<long long>(std::ceil(timeout * 1e6));
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(micros));
}

// One asynchronous call: lives from start() until its completion is drained.
struct Pending {
  grpc::ClientContext ctx;
  grpc::ByteBuffer request, response;
  grpc::Status status;
  PyObject* token = nullptr;  // strong ref, released under the GIL by completions()
  PyObject* call = nullptr;   // relay()'s server call (strong ref), else nullptr
  size_t items = 0;           // relay(): the answer's item count expected
};

// smockron.cluster._native's answer for a relayed call, taken from its capsule.
int (*finish_relayed)(PyObject* call, const char* data, size_t size) = nullptr;

// A thread in check(): parked on ``state`` (a futex word) until answered or made the
// sender. Lives on that thread's stack; nobody touches it after setting its state.
struct Waiter {
  std::string item;    // the serialized RateLimitReq
  std::string answer;  // its serialized RateLimitResp
  grpc::Status status;
  std::atomic<int> state{0};  // kWaiting, kAnswered or kLead
  Waiter* next = nullptr;     // the waiter of the same call to wake next (a chain)
};

constexpr int kWaiting = 0, kAnswered = 1, kLead = 2;
constexpr size_t kMaxCoalesced = 1000;  // the server's limit per GetRateLimits

struct Core {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
  std::map<std::string, std::unique_ptr<grpc::internal::RpcMethod>> methods;  // GIL-guarded
  // Completion queues of finished blocking calls, reused: one per call would be created
  // and destroyed per call otherwise (as grpc::internal::BlockingUnaryCall does).
  std::vector<std::unique_ptr<grpc::CompletionQueue>> queues;  // under mu
  int event_fd = -1;
  std::mutex mu;
  std::deque<Pending*> done;        // under mu
  std::vector<Pending*> spent;      // under mu: relays answered, freed under the GIL
  std::atomic<int> relays{0};
  std::atomic<long long> relayed_items{0};  // items of relays the peer answered in whole
  std::vector<Pending*> in_flight;  // under mu: cancelled by close()
  bool closed = false;              // under mu
  std::mutex co_mu;                 // check()'s queue
  std::deque<Waiter*> co_queue;     // under co_mu
  bool co_sending = false;          // under co_mu
  std::atomic<long long> co_calls{0};
};

struct ChannelObject {
  PyObject_HEAD
  Core* core;
};

Core* open_core(ChannelObject* self) {
  Core* core = self->core;
  if (core == nullptr || core->closed) {
    PyErr_SetObject(CallError, Py_BuildValue("(is)", static_cast<int>(grpc::StatusCode::UNAVAILABLE),
                                             "channel closed"));
    return nullptr;
  }
  return core;
}

// A registered method (interned once per channel and name), as generated stubs use.
const grpc::internal::RpcMethod& method_of(Core* core, const char* name) {
  auto it = core->methods.find(name);
  if (it == core->methods.end()) {
    auto method = std::make_unique<grpc::internal::RpcMethod>(
        name, grpc::internal::RpcMethod::NORMAL_RPC, core->channel);
    it = core->methods.emplace(name, std::move(method)).first;
  }
  return *it->second;
}

PyObject* raise_status(const grpc::Status& status) {
  const std::string& msg = status.error_message();
  PyObject* details = PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "replace");
  if (details == nullptr) return nullptr;
  PyObject* args = Py_BuildValue("(iN)", static_cast<int>(status.error_code()), details);
  if (args != nullptr) {
    PyErr_SetObject(CallError, args);
    Py_DECREF(args);
  }
  return nullptr;
}

// One unary call on a pooled completion queue, waited for on this thread (no hand-off).
void blocking_call(Core* core, const grpc::internal::RpcMethod& method, grpc::ClientContext& ctx,
                   const grpc::ByteBuffer& request, grpc::ByteBuffer& response,
                   grpc::Status& status) {
  std::unique_ptr<grpc::CompletionQueue> cq;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    if (!core->queues.empty()) {
      cq = std::move(core->queues.back());
      core->queues.pop_back();
    }
  }
  if (!cq) cq = std::make_unique<grpc::CompletionQueue>();
  {
    std::unique_ptr<grpc::ClientAsyncResponseReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientAsyncResponseReaderHelper::Create<grpc::ByteBuffer>(
            core->channel.get(), cq.get(), method, &ctx, request));
    reader->StartCall();
    reader->Finish(&response, &status, cq.get());
    void* tag = nullptr;
    bool ok = false;
    cq->Next(&tag, &ok);  // the only tag on this queue: the call's end
  }
  std::lock_guard<std::mutex> lock(core->mu);
  core->queues.push_back(std::move(cq));
}

void drain(grpc::CompletionQueue& cq) {
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

PyObject* Channel_call(PyObject* op, PyObject* args) {
  auto* self = reinterpret_cast<ChannelObject*>(op);
  const char* name;
  Py_buffer data{};
  double timeout;
  if (!PyArg_ParseTuple(args, "sy*d", &name, &data, &timeout)) return nullptr;
  Core* core = open_core(self);
  if (core == nullptr) {
    PyBuffer_Release(&data);
    return nullptr;
  }
  const grpc::internal::RpcMethod& method = method_of(core, name);
  grpc::ByteBuffer request = to_buffer(static_cast<const char*>(data.buf), data.len);
  PyBuffer_Release(&data);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  set_deadline(ctx, timeout);
  grpc::Status status;
  Py_BEGIN_ALLOW_THREADS
  blocking_call(core, method, ctx, request, response, status);
  Py_END_ALLOW_THREADS
  if (!status.ok()) return raise_status(status);
  return to_bytes(response);
}

void park(Waiter* w) {
  int* word = reinterpret_cast<int*>(&w->state);
  while (w->state.load(std::memory_order_acquire) == kWaiting) {
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, kWaiting, nullptr, nullptr, 0);
  }
}

// After this the waiter may return and its memory be gone: only the syscall follows,
// which names the address and touches nothing.
void wake(Waiter* w, int state) {
  w->state.store(state, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<int*>(&w->state), FUTEX_WAKE_PRIVATE, 1, nullptr,
          nullptr, 0);
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

bool get_varint(const char*& at, const char* end, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && at < end; shift += 7) {
    auto byte = static_cast<uint8_t>(*at++);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return true;
  }
  return false;
}

// --- One item's codec: the fields of a RateLimitReq to its wire bytes, a RateLimitResp's
// bytes to Python values (proto3: zero fields left out; unknown fields skipped).

void put_key(std::string& out, int field, int wire) {
  put_varint(out, static_cast<uint64_t>(field << 3 | wire));
}

bool put_string(std::string& out, int field, PyObject* value, bool always = false) {
  Py_ssize_t size;
  const char* text = PyUnicode_AsUTF8AndSize(value, &size);
  if (text == nullptr) return false;
  if (size > 0 || always) {
    put_key(out, field, 2);
    put_varint(out, static_cast<uint64_t>(size));
    out.append(text, static_cast<size_t>(size));
  }
  return true;
}

bool put_int(std::string& out, int field, PyObject* value, bool always = false) {
  long long v = PyLong_AsLongLong(value);
  if (v == -1 && PyErr_Occurred()) return false;
  if (v != 0 || always) {
    put_key(out, field, 0);
    put_varint(out, static_cast<uint64_t>(v));  // negative: ten bytes, as protobuf does
  }
  return true;
}

// RateLimitReq: name 1, unique_key 2, hits 3, limit 4, duration 5, algorithm 6,
// behavior 7, burst 8, metadata 9 (map<string, string>), created_at 10 (optional).
bool encode_request(PyObject* const f[10], std::string& out) {
  if (!put_string(out, 1, f[0]) || !put_string(out, 2, f[1])) return false;
  for (int i = 2; i < 8; ++i) {
    if (!put_int(out, i + 1, f[i])) return false;
  }
  if (f[8] != Py_None) {
    if (!PyDict_Check(f[8])) {
      PyErr_SetString(PyExc_TypeError, "metadata must be a dict of str to str");
      return false;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(f[8], &pos, &key, &value)) {
      std::string entry;
      if (!put_string(entry, 1, key) || !put_string(entry, 2, value)) return false;
      put_key(out, 9, 2);
      put_varint(out, entry.size());
      out += entry;
    }
  }
  return f[9] == Py_None || put_int(out, 10, f[9], true);
}

bool skip_field(const char*& at, const char* end, uint64_t key) {
  uint64_t n;
  switch (key & 7) {
    case 0:
      return get_varint(at, end, n);
    case 1:
      n = 8;
      break;
    case 5:
      n = 4;
      break;
    case 2:
      if (!get_varint(at, end, n)) return false;
      break;
    default:
      return false;
  }
  if (n > static_cast<uint64_t>(end - at)) return false;
  at += n;
  return true;
}

// A length-delimited field's bytes: [at, at + n) after its length.
bool get_bytes(const char*& at, const char* end, const char*& start, size_t& n) {
  uint64_t len;
  if (!get_varint(at, end, len) || len > static_cast<uint64_t>(end - at)) return false;
  start = at;
  n = static_cast<size_t>(len);
  at += len;
  return true;
}

// One metadata entry (key 1, value 2) into ``dict``; false: malformed (no exception) or
// an exception set (``failed``).
bool decode_entry(const char* at, const char* end, PyObject* dict, bool& failed) {
  const char *key = "", *value = "";
  size_t key_n = 0, value_n = 0;
  while (at < end) {
    uint64_t tag;
    if (!get_varint(at, end, tag)) return false;
    if (tag == (1 << 3 | 2)) {
      if (!get_bytes(at, end, key, key_n)) return false;
    } else if (tag == (2 << 3 | 2)) {
      if (!get_bytes(at, end, value, value_n)) return false;
    } else if (!skip_field(at, end, tag)) {
      return false;
    }
  }
  PyObject* k = PyUnicode_DecodeUTF8(key, static_cast<Py_ssize_t>(key_n), nullptr);
  PyObject* v = k ? PyUnicode_DecodeUTF8(value, static_cast<Py_ssize_t>(value_n), nullptr) : nullptr;
  failed = v == nullptr || PyDict_SetItem(dict, k, v) < 0;
  Py_XDECREF(k);
  Py_XDECREF(v);
  return true;
}

// RateLimitResp: status 1, limit 2, remaining 3, reset_time 4, error 5, metadata 6.
PyObject* decode_response(const char* at, const char* end) {
  uint64_t ints[5] = {0, 0, 0, 0, 0};  // by field number 1..4
  const char* error = "";
  size_t error_n = 0;
  PyObject* metadata = PyDict_New();
  if (metadata == nullptr) return nullptr;
  bool ok = true, failed = false;
  while (ok && !failed && at < end) {
    uint64_t tag;
    const char* start;
    size_t n;
    if (!get_varint(at, end, tag)) {
      ok = false;
    } else if ((tag & 7) == 0 && tag >> 3 >= 1 && tag >> 3 <= 4) {
      ok = get_varint(at, end, ints[tag >> 3]);
    } else if (tag == (5 << 3 | 2)) {
      ok = get_bytes(at, end, error, error_n);
    } else if (tag == (6 << 3 | 2)) {
      ok = get_bytes(at, end, start, n) && decode_entry(start, start + n, metadata, failed);
    } else {
      ok = skip_field(at, end, tag);
    }
  }
  if (failed) {
    Py_DECREF(metadata);
    return nullptr;
  }
  if (!ok) {
    Py_DECREF(metadata);
    PyErr_SetObject(CallError, Py_BuildValue("(is)", static_cast<int>(grpc::StatusCode::INTERNAL),
                                             "GetRateLimits: malformed response item"));
    return nullptr;
  }
  PyObject* text = PyUnicode_DecodeUTF8(error, static_cast<Py_ssize_t>(error_n), nullptr);
  if (text == nullptr) {
    Py_DECREF(metadata);
    return nullptr;
  }
  return Py_BuildValue("(iLLLNN)", static_cast<int>(ints[1]), static_cast<long long>(ints[2]),
                       static_cast<long long>(ints[3]), static_cast<long long>(ints[4]), text,
                       metadata);
}

// The items of GetRateLimitsResp.responses (field 1), other fields skipped.
bool split_responses(const std::string& body, std::vector<std::string>& out) {
  const char* at = body.data();
  const char* end = at + body.size();
  while (at < end) {
    uint64_t tag;
    const char* item;
    size_t n;
    if (!get_varint(at, end, tag)) return false;
    if (tag == (1 << 3 | 2)) {
      if (!get_bytes(at, end, item, n)) return false;
      out.emplace_back(item, n);
    } else if (!skip_field(at, end, tag)) {
      return false;
    }
  }
  return true;
}

// One GetRateLimits call for ``batch``; every waiter's answer or status filled in.
void send_batch(Core* core, const grpc::internal::RpcMethod& method,
                const std::vector<Waiter*>& batch, double timeout) {
  std::string body;
  for (Waiter* w : batch) {
    body.push_back('\x0a');  // field 1 (requests), length-delimited
    put_varint(body, w->item.size());
    body += w->item;
  }
  grpc::ByteBuffer request = to_buffer(body.data(), static_cast<Py_ssize_t>(body.size()));
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  set_deadline(ctx, timeout);
  grpc::Status status;
  core->co_calls.fetch_add(1, std::memory_order_relaxed);
  blocking_call(core, method, ctx, request, response, status);
  std::vector<std::string> answers;
  if (status.ok()) {
    std::vector<grpc::Slice> slices;
    std::string raw;
    if (response.Dump(&slices).ok()) {
      for (const auto& slice : slices) raw.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    if (!split_responses(raw, answers)) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, "GetRateLimits: malformed response");
    } else if (answers.size() != batch.size()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL,
                            "GetRateLimits: " + std::to_string(answers.size()) +
                                " responses for " + std::to_string(batch.size()) + " requests");
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (status.ok()) {
      batch[i]->answer = std::move(answers[i]);
    } else {
      batch[i]->status = status;
    }
  }
}

// The sender's last step: the oldest waiter sends next, or nobody is sending.
void hand_over(Core* core) {
  std::lock_guard<std::mutex> lock(core->co_mu);
  if (core->co_queue.empty()) {
    core->co_sending = false;
  } else {
    wake(core->co_queue.front(), kLead);
  }
}

// A waiter made the sender: one call for the oldest queued checks (itself the oldest);
// the others of the call are woken in a chain, each by the one before (spread over
// their own threads instead of all by this one).
void send_queued(Core* core, const grpc::internal::RpcMethod& method, Waiter* mine,
                 double timeout) {
  std::vector<Waiter*> batch;
  {
    std::lock_guard<std::mutex> lock(core->co_mu);
    size_t n = std::min(core->co_queue.size(), kMaxCoalesced);
    batch.assign(core->co_queue.begin(), core->co_queue.begin() + static_cast<long>(n));
    core->co_queue.erase(core->co_queue.begin(), core->co_queue.begin() + static_cast<long>(n));
  }
  send_batch(core, method, batch, timeout);
  Waiter* first = nullptr;
  Waiter* last = nullptr;
  for (Waiter* w : batch) {
    if (w == mine) continue;
    if (last != nullptr) last->next = w;
    else first = w;
    last = w;
  }
  if (first != nullptr) wake(first, kAnswered);
}

PyObject* Channel_check(PyObject* op, PyObject* args) {
  auto* self = reinterpret_cast<ChannelObject*>(op);
  const char* name;
  double timeout;
  PyObject* fields[10];
  if (!PyArg_ParseTuple(args, "sdOOOOOOOOOO", &name, &timeout, &fields[0], &fields[1],
                        &fields[2], &fields[3], &fields[4], &fields[5], &fields[6], &fields[7],
                        &fields[8], &fields[9])) {
    return nullptr;
  }
  Core* core = open_core(self);
  if (core == nullptr) return nullptr;
  Waiter w;
  if (!encode_request(fields, w.item)) return nullptr;
  const grpc::internal::RpcMethod& method = method_of(core, name);
  Py_BEGIN_ALLOW_THREADS
  bool lead;
  {
    std::lock_guard<std::mutex> lock(core->co_mu);
    lead = !core->co_sending;
    if (lead) core->co_sending = true;
    else core->co_queue.push_back(&w);
  }
  if (lead) {  // a lone check: at once, by itself
    send_batch(core, method, std::vector<Waiter*>{&w}, timeout);
    hand_over(core);
  } else {
    park(&w);
    if (w.state.load(std::memory_order_acquire) == kLead) {
      send_queued(core, method, &w, timeout);
      hand_over(core);
    } else if (w.next != nullptr) {
      wake(w.next, kAnswered);
    }
  }
  Py_END_ALLOW_THREADS
  if (!w.status.ok()) return raise_status(w.status);
  return decode_response(w.answer.data(), w.answer.data() + w.answer.size());
}

PyObject* module_encode_request(PyObject*, PyObject* args) {
  PyObject* fields[10];
  if (!PyArg_ParseTuple(args, "OOOOOOOOOO", &fields[0], &fields[1], &fields[2], &fields[3],
                        &fields[4], &fields[5], &fields[6], &fields[7], &fields[8], &fields[9])) {
    return nullptr;
  }
  std::string out;
  if (!encode_request(fields, out)) return nullptr;
  return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}

PyObject* module_decode_response(PyObject*, PyObject* args) {
  Py_buffer data{};
  if (!PyArg_ParseTuple(args, "y*", &data)) return nullptr;
  const char* at = static_cast<const char*>(data.buf);
  PyObject* out = decode_response(at, at + data.len);
  PyBuffer_Release(&data);
  return out;
}

PyObject* Channel_coalesced_calls(PyObject* op, void*) {
  Core* core = reinterpret_cast<ChannelObject*>(op)->core;
  return PyLong_FromLongLong(core == nullptr ? 0 : core->co_calls.load());
}

// A call's end: queued for completions() (``queue``) or, a relay answered, put aside.
void completed(Core* core, Pending* pending, bool queue = true) {
  {
    std::lock_guard<std::mutex> lock(core->mu);
    for (auto it = core->in_flight.begin(); it != core->in_flight.end(); ++it) {
      if (*it == pending) {
        *it = core->in_flight.back();
        core->in_flight.pop_back();
        break;
      }
    }
    if (!queue) {
      core->spent.push_back(pending);
      return;
    }
    core->done.push_back(pending);
  }
  uint64_t one = 1;
  ssize_t written = write(core->event_fd, &one, sizeof one);
  (void)written;  // a full counter still reads as readable
}

// A call's state for its request bytes (``data`` released) and Python ``token`` (held).
Pending* new_pending(Py_buffer& data, PyObject* token) {
  auto* pending = new Pending();
  pending->request = to_buffer(static_cast<const char*>(data.buf), data.len);
  PyBuffer_Release(&data);
  Py_INCREF(token);
  pending->token = token;
  return pending;
}

// Starts ``pending``'s unary call (in flight until it ends); ``done`` runs on gRPC's
// thread when it has, the status in ``pending``.
void call_unary(Core* core, const char* name, Pending* pending, double timeout,
                void (*done)(Core*, Pending*)) {
  set_deadline(pending->ctx, timeout);
  {
    std::lock_guard<std::mutex> lock(core->mu);
    core->in_flight.push_back(pending);
  }
  std::string method(name);
  Py_BEGIN_ALLOW_THREADS
  core->stub->UnaryCall(&pending->ctx, method, grpc::StubOptions(), &pending->request,
                        &pending->response, [core, pending, done](grpc::Status status) {
                          pending->status = std::move(status);
                          done(core, pending);
                        });
  Py_END_ALLOW_THREADS
}

PyObject* Channel_start(PyObject* op, PyObject* args) {
  auto* self = reinterpret_cast<ChannelObject*>(op);
  const char* name;
  Py_buffer data{};
  double timeout;
  PyObject* token;
  if (!PyArg_ParseTuple(args, "sy*dO", &name, &data, &timeout, &token)) return nullptr;
  Core* core = open_core(self);
  if (core == nullptr) {
    PyBuffer_Release(&data);
    return nullptr;
  }
  Pending* pending = new_pending(data, token);
  call_unary(core, name, pending, timeout, [](Core* c, Pending* p) { completed(c, p); });
  Py_RETURN_NONE;
}

// Frees a call's Python references and itself (with the GIL).
void release(Pending* pending) {
  Py_XDECREF(pending->call);
  Py_DECREF(pending->token);
  delete pending;
}

void free_spent(Core* core) {
  std::vector<Pending*> spent;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    spent.swap(core->spent);
  }
  for (Pending* pending : spent) release(pending);
}

// A relay's end on gRPC's thread: an answer with the items expected goes to the server
// call at once; anything else to completions().
void relayed(Core* core, Pending* pending) {
  core->relays.fetch_sub(1);
  std::string body;
  std::vector<grpc::Slice> slices;
  std::vector<std::string> answers;
  if (pending->status.ok() && pending->response.Dump(&slices).ok()) {
    for (const auto& s : slices) body.append(reinterpret_cast<const char*>(s.begin()), s.size());
    bool whole = split_responses(body, answers) && answers.size() == pending->items;
    if (whole) {
      // counted before the answer goes: a client that reads the node's /metrics right
      // after its answer must find it counted
      const auto items = static_cast<long long>(pending->items);
      core->relayed_items.fetch_add(items);
      if (finish_relayed(pending->call, body.data(), body.size()) >= 0) {
        completed(core, pending, false);
        return;
      }
      core->relayed_items.fetch_sub(items);  // not a call: the event loop's path counts it
    }
  }
  completed(core, pending);
}

PyObject* Channel_relay(PyObject* op, PyObject* args) {
  auto* self = reinterpret_cast<ChannelObject*>(op);
  const char* name;
  Py_buffer data{};
  double timeout;
  int limit;
  Py_ssize_t items;
  PyObject *call, *token;
  if (!PyArg_ParseTuple(args, "sy*dinOO", &name, &data, &timeout, &limit, &items, &call, &token))
    return nullptr;
  Core* core = open_core(self);
  if (core != nullptr && finish_relayed == nullptr) {
    finish_relayed = reinterpret_cast<int (*)(PyObject*, const char*, size_t)>(
        PyCapsule_Import("smockron.cluster._native._finish_relayed", 0));
  }
  if (core == nullptr || finish_relayed == nullptr) {
    PyBuffer_Release(&data);
    return nullptr;
  }
  free_spent(core);
  if (core->relays.fetch_add(1) >= limit) {
    core->relays.fetch_sub(1);
    PyBuffer_Release(&data);
    Py_RETURN_FALSE;
  }
  Pending* pending = new_pending(data, token);
  Py_INCREF(call);
  pending->call = call;
  pending->items = static_cast<size_t>(items);
  call_unary(core, name, pending, timeout, relayed);
  Py_RETURN_TRUE;
}

PyObject* Channel_relays(PyObject* op, void*) {
  Core* core = reinterpret_cast<ChannelObject*>(op)->core;
  return PyLong_FromLong(core == nullptr ? 0 : core->relays.load());
}

PyObject* Channel_relayed_items(PyObject* op, void*) {
  Core* core = reinterpret_cast<ChannelObject*>(op)->core;
  return PyLong_FromLongLong(core == nullptr ? 0 : core->relayed_items.load());
}

PyObject* completion(Pending* pending) {
  PyObject* payload;
  if (pending->status.ok()) {
    payload = to_bytes(pending->response);
    if (payload == nullptr) return nullptr;
  } else {
    Py_INCREF(Py_None);
    payload = Py_None;
  }
  const std::string& msg = pending->status.error_message();
  PyObject* details = PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "replace");
  if (details == nullptr) {
    Py_DECREF(payload);
    return nullptr;
  }
  return Py_BuildValue("(OiNN)", pending->token, static_cast<int>(pending->status.error_code()),
                       payload, details);
}

PyObject* Channel_completions(PyObject* op, PyObject*) {
  auto* self = reinterpret_cast<ChannelObject*>(op);
  Core* core = self->core;
  std::deque<Pending*> done;
  if (core != nullptr) {
    uint64_t count;
    ssize_t got = read(core->event_fd, &count, sizeof count);  // non-blocking: reset
    (void)got;
    std::lock_guard<std::mutex> lock(core->mu);
    done.swap(core->done);
  }
  PyObject* out = PyList_New(0);
  for (Pending* pending : done) {
    PyObject* item = out != nullptr ? completion(pending) : nullptr;
    if (item == nullptr || PyList_Append(out, item) < 0) Py_CLEAR(out);
    Py_XDECREF(item);
    release(pending);
  }
  return out;
}

PyObject* Channel_fileno(PyObject* op, PyObject*) {
  Core* core = reinterpret_cast<ChannelObject*>(op)->core;
  return PyLong_FromLong(core == nullptr ? -1 : core->event_fd);
}

// Called with the GIL held: completions() (which frees calls) cannot run meanwhile, so
// every call listed in flight is still alive when it is cancelled.
void close_core(Core* core) {
  std::vector<Pending*> cancel;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    if (core->closed) return;
    core->closed = true;
    cancel = core->in_flight;
  }
  for (Pending* pending : cancel) pending->ctx.TryCancel();
}

PyObject* Channel_close(PyObject* op, PyObject*) {
  Core* core = reinterpret_cast<ChannelObject*>(op)->core;
  if (core != nullptr) close_core(core);
  Py_RETURN_NONE;
}

int Channel_init(PyObject* op, PyObject* args, PyObject*) {
  auto* self = reinterpret_cast<ChannelObject*>(op);
  const char* target;
  PyObject* options = nullptr;
  if (!PyArg_ParseTuple(args, "s|O", &target, &options)) return -1;
  if (self->core != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "channel already open");
    return -1;
  }
  grpc::ChannelArguments arguments;
  int parsed = for_each_grpc_option(
      options, [&](const std::string& name, int v) { arguments.SetInt(name, v); },
      [&](const std::string& name, const std::string& v) { arguments.SetString(name, v); });
  if (parsed < 0) return -1;
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;
  }
  auto* core = new Core();
  core->event_fd = fd;
  std::string where(target);
  Py_BEGIN_ALLOW_THREADS
  core->channel = grpc::CreateCustomChannel(where, grpc::InsecureChannelCredentials(), arguments);
  Py_END_ALLOW_THREADS
  core->stub = std::make_unique<grpc::GenericStub>(core->channel);
  self->core = core;
  return 0;
}

void Channel_dealloc(PyObject* op) {
  auto* self = reinterpret_cast<ChannelObject*>(op);
  Core* core = self->core;
  if (core != nullptr) {
    bool idle;
    close_core(core);
    Py_BEGIN_ALLOW_THREADS
    // cancelled calls complete soon; wait for them (bounded) before freeing what they use
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard<std::mutex> lock(core->mu);
        if (core->in_flight.empty()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Py_END_ALLOW_THREADS
    std::deque<Pending*> done;
    {
      std::lock_guard<std::mutex> lock(core->mu);
      idle = core->in_flight.empty();
      done.swap(core->done);
    }
    for (Pending* pending : done) release(pending);
    free_spent(core);
    if (idle) {
      for (auto& cq : core->queues) drain(*cq);
      close(core->event_fd);
      core->methods.clear();
      core->stub.reset();
      core->channel.reset();
      delete core;
    }  // else: a call still points at it; leak rather than crash
  }
  Py_TYPE(op)->tp_free(op);
}

PyMethodDef Channel_methods[] = {
    {"check", Channel_check, METH_VARARGS,
     "check(method, timeout, *request fields) -> response fields: one check, coalesced."},
    {"call", Channel_call, METH_VARARGS,
     "call(method, request, timeout) -> bytes: one blocking unary call, GIL released."},
    {"start", Channel_start, METH_VARARGS,
     "start(method, request, timeout, token): begin a call; see completions()."},
    {"relay", Channel_relay, METH_VARARGS,
     "relay(method, request, timeout, limit, items, call, token) -> bool: answer a server "
     "call with the peer's answer, in C++; see completions() for failures."},
    {"completions", Channel_completions, METH_NOARGS,
     "completions() -> [(token, code, payload or None, details)]: calls finished since."},
    {"fileno", Channel_fileno, METH_NOARGS, "the eventfd readable while completions wait"},
    {"close", Channel_close, METH_NOARGS, "cancel calls in flight; refuse new ones"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef Channel_getset[] = {
    {"coalesced_calls", Channel_coalesced_calls, nullptr, "GetRateLimits calls check() made",
     nullptr},
    {"relays", Channel_relays, nullptr, "relay() calls in flight", nullptr},
    {"relayed_items", Channel_relayed_items, nullptr,
     "items of relay() calls the peer answered (each finished its server call)", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject ChannelType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyMethodDef module_methods[] = {
    {"encode_request", module_encode_request, METH_VARARGS,
     "encode_request(name, key, hits, limit, duration, algorithm, behavior, burst, metadata, "
     "created_at) -> bytes: a RateLimitReq as check() sends it"},
    {"decode_response", module_decode_response, METH_VARARGS,
     "decode_response(bytes) -> (status, limit, remaining, reset_time, error, metadata)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "smockron.cluster._nativeclient",
                          "libgrpc++ client channel making unary calls on raw bytes", -1,
                          module_methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__nativeclient(void) {
  ChannelType.tp_name = "smockron.cluster._nativeclient.Channel";
  ChannelType.tp_basicsize = sizeof(ChannelObject);
  ChannelType.tp_flags = Py_TPFLAGS_DEFAULT;
  ChannelType.tp_new = PyType_GenericNew;
  ChannelType.tp_init = Channel_init;
  ChannelType.tp_dealloc = Channel_dealloc;
  ChannelType.tp_methods = Channel_methods;
  ChannelType.tp_getset = Channel_getset;
  ChannelType.tp_doc = "Channel(target, options=()): a plain-text libgrpc++ channel";
  if (PyType_Ready(&ChannelType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  CallError = PyErr_NewExceptionWithDoc(
      "smockron.cluster._nativeclient.CallError",
      "a call failed: args are (gRPC status code as int, details)", nullptr, nullptr);
  if (CallError == nullptr || PyModule_AddObject(m, "CallError", CallError) < 0) {
    Py_XDECREF(CallError);
    Py_DECREF(m);
    return nullptr;
  }
  Py_INCREF(CallError);  // the module's reference was stolen; keep ours
  Py_INCREF(&ChannelType);
  if (PyModule_AddObject(m, "Channel", reinterpret_cast<PyObject*>(&ChannelType)) < 0) {
    Py_DECREF(&ChannelType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
