// Open-loop gRPC load generator for bench/cluster.py (part 3): single-check
// GetRateLimits calls to one smockron cluster node, speaking the Gubernator v2 API
// through the C++ gRPC client and code generated from smockron's own gubernator.proto.
//
// Why C++: a Python grpc.aio client costs ~0.3-0.4 ms of CPU per call on the bench
// machine, as much as the server it measures, so at 2,000 calls/s on two cores the
// client's own queueing dominated the tail. This client costs a few tens of us per call.
//
// Built by bench/cluster.py (protoc + g++ against Debian's libgrpc++-dev) into
// bench/loadgen/build/. Usage: loadgen ADDRESS SERVER_PID RATE SECONDS [SEQ] [CPU]
//   SEQ sequential calls first (idle round trip), then RATE calls/s for SECONDS, sent at
//   fixed intervals (open loop) whatever the answers. CPU >= 0 pins this process.
// Prints one JSON object: latency percentiles (ms, measured from the call's start and,
// stricter, from its scheduled time), the client's and the server's CPU per call (us,
// getrusage / /proc/PID/stat) and failed calls. Every answer is checked: status OK,
// one response without error.
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "gubernator.grpc.pb.h"

using pb::gubernator::GetRateLimitsReq;
using pb::gubernator::GetRateLimitsResp;
using pb::gubernator::V1;

static double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double self_cpu() {
  rusage r;
  getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

static double proc_cpu(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(s.substr(s.rfind(')') + 2));
  std::string field;
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15; i++) {
    rest >> field;
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return double(utime + stime) / sysconf(_SC_CLK_TCK);
}

static GetRateLimitsReq make_req(int i) {
  GetRateLimitsReq req;
  auto* r = req.add_requests();
  r->set_name("b");
  r->set_unique_key("lat-" + std::to_string(i % 100));
  r->set_hits(1);
  r->set_limit(1000000000);
  r->set_duration(60000);
  return req;
}

static bool good(const grpc::Status& st, const GetRateLimitsResp& resp) {
  return st.ok() && resp.responses_size() == 1 && resp.responses(0).error().empty();
}

static double pct(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(v.size() * p))] * 1000;
}

struct Call {
  grpc::ClientContext ctx;
  GetRateLimitsReq req;
  GetRateLimitsResp resp;
};

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s ADDRESS SERVER_PID RATE SECONDS [SEQ] [CPU]\n", argv[0]);
    return 2;
  }
  std::string address = argv[1];
  int pid = atoi(argv[2]);
  double rate = atof(argv[3]), seconds = atof(argv[4]);
  int seq = argc > 5 ? atoi(argv[5]) : 1000;
  int cpu = argc > 6 ? atoi(argv[6]) : -1;
  if (cpu >= 0) {  // before the channel exists, so gRPC's threads inherit it
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  prctl(PR_SET_TIMERSLACK, 1UL);
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = V1::NewStub(channel);
  std::vector<GetRateLimitsReq> reqs;
  for (int i = 0; i < 100; i++) reqs.push_back(make_req(i));

  int failed = 0;
  for (int i = 0; i < 300; i++) {  // warm up
    grpc::ClientContext ctx;
    GetRateLimitsResp resp;
    if (!good(stub->GetRateLimits(&ctx, reqs[i % 100], &resp), resp)) failed++;
  }
  std::vector<double> seq_lat;
  double c0 = self_cpu(), s0 = proc_cpu(pid);
  for (int i = 0; i < seq; i++) {
    grpc::ClientContext ctx;
    GetRateLimitsResp resp;
    double t = now_s();
    if (!good(stub->GetRateLimits(&ctx, reqs[i % 100], &resp), resp)) failed++;
    seq_lat.push_back(now_s() - t);
  }
  double c1 = self_cpu(), s1 = proc_cpu(pid);
  double seq_client = seq ? (c1 - c0) / seq * 1e6 : 0, seq_server = seq ? (s1 - s0) / seq * 1e6 : 0;

  long total = long(rate * seconds);
  std::vector<double> lat(total, -1), sched_lat(total, -1);
  std::atomic<long> done{0};
  std::atomic<int> open_failed{0};
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, int> codes;  // failed calls by gRPC status code number
  double start = now_s() + 0.01;
  c0 = self_cpu();
  s0 = proc_cpu(pid);
  for (long i = 0; i < total; i++) {
    double due = start + i / rate;
    timespec ts;
    ts.tv_sec = time_t(due);
    ts.tv_nsec = long((due - ts.tv_sec) * 1e9);
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
    auto* call = new Call;
    call->req = reqs[i % 100];
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    double t = now_s();
    stub->async()->GetRateLimits(&call->ctx, &call->req, &call->resp, [&, call, i, t, due](grpc::Status st) {
      double end = now_s();
      if (good(st, call->resp)) {
        lat[i] = end - t;
        sched_lat[i] = end - due;
      } else {
        open_failed++;
        std::lock_guard<std::mutex> g(mu);
        codes[st.ok() ? "BAD_ANSWER" : std::to_string(int(st.error_code()))]++;
      }
      delete call;
      if (++done == total) {
        std::lock_guard<std::mutex> g(mu);
        cv.notify_all();
      }
    });
  }
  {
    std::unique_lock<std::mutex> g(mu);
    cv.wait_for(g, std::chrono::seconds(30), [&] { return done.load() == total; });
  }
  double elapsed = now_s() - start;
  c1 = self_cpu();
  s1 = proc_cpu(pid);
  std::string failed_codes;
  {
    std::lock_guard<std::mutex> g(mu);
    for (auto& [code, n] : codes) failed_codes += code + ":" + std::to_string(n) + " ";
  }
  std::vector<double> ok, ok_sched;
  for (long i = 0; i < total; i++)
    if (lat[i] >= 0) {
      ok.push_back(lat[i]);
      ok_sched.push_back(sched_lat[i]);
    }
  printf(
      "{\"seq_p50\": %.3f, \"seq_p99\": %.3f, \"seq_client_us\": %.0f, \"seq_server_us\": %.0f, "
      "\"rate\": %.0f, \"achieved\": %.0f, \"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f, \"p999\": %.3f, "
      "\"max\": %.3f, \"p99_from_schedule\": %.3f, \"client_us\": %.0f, \"server_us\": %.0f, "
      "\"failed\": %d, \"failed_codes\": \"%s\"}\n",
      pct(seq_lat, 0.5), pct(seq_lat, 0.99), seq_client, seq_server, rate, total / elapsed,
      pct(ok, 0.5), pct(ok, 0.9), pct(ok, 0.99), pct(ok, 0.999), pct(ok, 1.0), pct(ok_sched, 0.99),
      (c1 - c0) / total * 1e6, (s1 - s0) / total * 1e6, failed + int(total - long(ok.size())), failed_codes.c_str());
  return 0;
}
