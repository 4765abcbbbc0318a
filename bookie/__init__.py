"""minipulsar bookie package."""

import proto.grpc_defaults  # noqa: E402,F401 - before anything imports grpc (see that module)
