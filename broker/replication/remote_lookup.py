"""Which broker of a remote cluster serves a topic: the replicator's lookup (the
lookup Pulsar's replicator producer does through its PulsarClient). The remote
cluster's service URL may list several brokers (``minipulsar://h1:p1,h2:p2``): any
live one answers; redirects are followed as the SDK's lookup does."""
from __future__ import annotations

import grpc

from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.service_url import parse_service_url

__all__ = ["lookup_remote_owner", "MAX_REDIRECTS"]

MAX_REDIRECTS = 20  # Pulsar's maxLookupRedirects


async def lookup_remote_owner(remote_url: str, topic: str, open_channel, timeout_s: float = 10.0) -> str:
    """The gRPC target ``host:port`` of the broker of ``remote_url``'s cluster that
    serves ``topic``. ``open_channel(target) -> grpc.aio.Channel`` gives (pooled)
    channels. A standalone remote (``proxy_through_service_url``) or one without the
    Lookup RPC is served by the host that answered. Raises ``ConnectionError`` when no
    host answers, or the remote's error (``grpc.aio.AioRpcError``) for a refused lookup."""
    url = parse_service_url(remote_url)
    last: Exception | None = None
    for host in url.targets:
        stub = broker_pb2_grpc.PulsarBrokerStub(open_channel(host))
        try:
            resp = await stub.Lookup(pb.LookupRequest(topic=topic), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return host
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                last = exc
                continue
            raise
        answered = host
        for _ in range(MAX_REDIRECTS):
            if resp.proxy_through_service_url:
                return answered
            owner = parse_service_url(resp.broker_service_url).target
            if resp.response != pb.LookupResponse.REDIRECT:
                return owner
            stub = broker_pb2_grpc.PulsarBrokerStub(open_channel(owner))
            resp = await stub.Lookup(pb.LookupRequest(topic=topic, authoritative=resp.authoritative),
                                     timeout=timeout_s)
            answered = owner
        raise ConnectionError(f"lookup of {topic} on {remote_url} redirected more than {MAX_REDIRECTS} times")
    raise ConnectionError(f"no broker of {remote_url} answered the lookup of {topic}: "
                          f"{getattr(last, 'details', lambda: last)()}")
