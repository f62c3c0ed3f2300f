#!/bin/sh
# Regenerate the Envoy rate-limit protobuf and gRPC modules in smockron/cluster/envoy/pb/.
# Run from anywhere; uses the Python that has grpcio-tools (override with $PYTHON).
set -eu
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
"${PYTHON:-python}" -m grpc_tools.protoc -I . \
    --python_out=. --grpc_python_out=. --pyi_out=. \
    smockron/cluster/envoy/pb/base.proto \
    smockron/cluster/envoy/pb/ratelimit_unit.proto \
    smockron/cluster/envoy/pb/ratelimit.proto \
    smockron/cluster/envoy/pb/rls.proto
# Only rls.proto defines a service; drop the empty gRPC modules of the others.
rm -f smockron/cluster/envoy/pb/base_pb2_grpc.py \
      smockron/cluster/envoy/pb/ratelimit_unit_pb2_grpc.py \
      smockron/cluster/envoy/pb/ratelimit_pb2_grpc.py
