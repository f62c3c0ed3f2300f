"""The Gubernator-compatible cluster: gRPC and HTTP APIs, ring, batching, GLOBAL, discovery."""
