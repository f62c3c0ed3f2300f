"""Generated protobuf/gRPC modules; see ../proto/."""
