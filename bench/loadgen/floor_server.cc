// A C++ gRPC server answering every GetRateLimits with a constant (no rate limiting):
// bench/grpc_floor.py measures it next to constant-answer Python servers, to show what
// the gRPC stack itself costs per call on this machine. Usage: floor_server PORT
#include <grpcpp/grpcpp.h>
#include "gubernator.grpc.pb.h"
using namespace pb::gubernator;
class Svc final : public V1::CallbackService {
  grpc::ServerUnaryReactor* GetRateLimits(grpc::CallbackServerContext* ctx, const GetRateLimitsReq* req, GetRateLimitsResp* resp) override {
    auto* r = resp->add_responses();
    r->set_limit(req->requests(0).limit()); r->set_remaining(5); r->set_reset_time(123);
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};
int main(int argc, char** argv) {
  Svc svc;
  grpc::ServerBuilder b;
  b.AddListeningPort(std::string("127.0.0.1:") + argv[1], grpc::InsecureServerCredentials());
  b.RegisterService(&svc);
  auto s = b.BuildAndStart();
  s->Wait();
}
