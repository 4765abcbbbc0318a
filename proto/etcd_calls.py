"""Two etcd calls shared by the broker's etcd metadata store and the bookie's
registration (``bookie`` may not import ``broker``): one lease keep-alive round trip
and a short description of an etcd/gRPC error. aetcd (asyncio etcd client) objects."""
from __future__ import annotations

import aetcd
import grpc
from aetcd import rpc

__all__ = ["keep_alive_rpc", "describe_error"]


async def keep_alive_rpc(client: aetcd.Client, lease_id: int, timeout: float):
    """One LeaseKeepAlive round trip of lease ``lease_id`` (timeout in seconds): the
    reply (``reply.TTL`` <= 0: the lease is gone) or None when etcd answered nothing.
    Raises ``grpc.aio.AioRpcError`` when etcd cannot be reached."""
    call = client.leasestub.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=timeout)
    try:
        async for reply in call:
            return reply
        return None
    finally:
        call.cancel()


def describe_error(exc: BaseException) -> str:
    """``"UNAVAILABLE: <first line of the details>"`` for a gRPC error, else
    ``"<ExceptionClass>: <message>"``."""
    if isinstance(exc, grpc.aio.AioRpcError):
        details = (exc.details() or "").split("\n")[0]
        return f"{exc.code().name}: {details}" if details else exc.code().name
    return f"{type(exc).__name__}: {exc}"
