"""Undecodable request frames get INVALID_ARGUMENT, not UNKNOWN.

gRPC decodes a request with the method's ``request_deserializer`` before (unary
calls) or inside (streams, ``context.read()``) the servicer's code, and turns
protobuf's ``DecodeError`` into ``UNKNOWN "Unexpected <class ...DecodeError>"``.
``InvalidFrameInterceptor`` (a ``grpc.aio.ServerInterceptor``, shared by the
broker and the bookie as pulsar-common's framing is) hands the servicer raw
bytes and decodes them itself: a frame that is not the method's request
message ends the call with ``INVALID_ARGUMENT`` and the details
``"InvalidArgument: ... is not a valid <type> ..."`` (``proto.errors``' form,
so the SDK raises ``InvalidArgument``).  Pulsar answers an unparsable command
by closing the connection; a status the caller can read is kinder.

Methods that decode their own stream (the bookie's ``AddEntry`` answers the
adds read before a bad frame first) are named in ``own_decoding``.
"""
from __future__ import annotations

import inspect
from typing import Callable, Iterable, Optional

import grpc
from google.protobuf.message import DecodeError

from proto.errors import InvalidArgument, to_status

__all__ = ["InvalidFrameInterceptor"]


def _type_name(decode: Callable) -> str:
    cls = getattr(decode, "__self__", None)
    descriptor = getattr(cls, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", None) or "request message"


async def _decode_or_abort(decode: Callable, raw: bytes, context, method: str, type_name: str):
    try:
        return decode(raw)
    except DecodeError as exc:
        code, details = to_status(InvalidArgument(
            f"a {len(raw)}-byte frame sent to {method} is not a valid {type_name} ({exc}); "
            f"build requests from proto/*.proto or use the minipulsar client"))
        await context.abort(getattr(grpc.StatusCode, code), details)


class _DecodingContext:
    """The servicer's view of a stream's context: ``read()`` returns decoded
    requests (or ``grpc.aio.EOF``); everything else is the real context's."""

    def __init__(self, context, decode: Callable, method: str, type_name: str):
        self._context = context
        self._decode = decode
        self._method = method
        self._type_name = type_name

    async def read(self):
        """The next request, decoded, or ``grpc.aio.EOF``; an undecodable frame ends the
        call with INVALID_ARGUMENT."""
        raw = await self._context.read()
        if raw is grpc.aio.EOF:
            return raw
        return await _decode_or_abort(self._decode, raw, self._context, self._method, self._type_name)

    async def requests(self, request_iterator):
        """Decode each raw frame of ``request_iterator`` (what the servicer iterates); an
        undecodable frame ends the call with INVALID_ARGUMENT."""
        async for raw in request_iterator:
            yield await _decode_or_abort(self._decode, raw, self._context, self._method, self._type_name)

    def __getattr__(self, name):
        return getattr(self._context, name)


def _wrap(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """``handler`` taking raw bytes and decoding them with its deserializer."""
    decode, type_name = handler.request_deserializer, _type_name(handler.request_deserializer)
    serialize = handler.response_serializer
    if not handler.request_streaming:
        behaviour = handler.unary_unary or handler.unary_stream
        if inspect.isasyncgenfunction(behaviour):
            async def call(raw, context):
                request = await _decode_or_abort(decode, raw, context, method, type_name)
                async for response in behaviour(request, context):
                    yield response
        else:
            async def call(raw, context):
                request = await _decode_or_abort(decode, raw, context, method, type_name)
                return await behaviour(request, context)
        make = grpc.unary_stream_rpc_method_handler if handler.response_streaming \
            else grpc.unary_unary_rpc_method_handler
    else:
        behaviour = handler.stream_stream or handler.stream_unary
        if inspect.isasyncgenfunction(behaviour):
            async def call(request_iterator, context):
                view = _DecodingContext(context, decode, method, type_name)
                async for response in behaviour(view.requests(request_iterator), view):
                    yield response
        else:
            async def call(request_iterator, context):
                view = _DecodingContext(context, decode, method, type_name)
                return await behaviour(view.requests(request_iterator), view)
        make = grpc.stream_stream_rpc_method_handler if handler.response_streaming \
            else grpc.stream_unary_rpc_method_handler
    return make(call, request_deserializer=None, response_serializer=serialize)


class InvalidFrameInterceptor(grpc.aio.ServerInterceptor):
    """Server interceptor: every method's requests are decoded by the wrapper
    above (one wrapped handler per method, built on its first call), except
    the full method names in ``own_decoding`` (e.g.
    ``"/minipulsar.bookie.Bookie/AddEntry"``)."""

    def __init__(self, own_decoding: Iterable[str] = ()):
        self._own = frozenset(own_decoding)
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation, handler_call_details) -> Optional[grpc.RpcMethodHandler]:
        """The method's handler wrapped to decode its own requests (built once per handler,
        cached by method name); unwrapped when there is no handler or deserializer, or the
        method is in ``own_decoding``."""
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or handler.request_deserializer is None or method in self._own:
            return handler
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = (handler, _wrap(handler, method))
            self._wrapped[method] = cached
        return cached[1]
