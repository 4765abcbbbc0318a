"""Malformed input on every gRPC method of the broker and of a bookie WHILE the SDK
workload runs (dedup on): the existing hypothesis strategies of
``tests/integration/test_bad_input_fuzz.py`` (random and mutated request messages,
unknown enum values, hostile strings, raw garbage frames; derandomized, a few
examples per method), oversized frames (over the 64 MiB gRPC limit) and Produce
streams cut in the middle of a message (through ``tests/tcp_proxy.py``). Each bad
call gets a clear error status; the servers keep serving; the workload's four checks
(``tests/faults/harness.py``) show that nothing stored was damaged; a message cut in
the middle of its frame is not stored at all.

The workload runs in its own namespace so that fuzzed admin calls on
``public/default`` (policies, deduplication) cannot change its settings.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections import Counter

import grpc
import pytest
from hypothesis import HealthCheck, given, settings

from client.entry_format import encode_entry
from proto import broker_pb2
from proto.common import GRPC_MAX_MESSAGE_BYTES
from proto.pulsar_api_pb2 import MessageMetadata
from tests.faults.harness import Workload
from tests.integration.test_bad_input_fuzz import CLEAR_CODES, METHODS, PYTHON_TEXT, call, inputs
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(200)

#: examples per method while the workload runs (the full fuzz is test_bad_input_fuzz.py)
EXAMPLES = int(os.environ.get("MINIPULSAR_FAULT_FUZZ_EXAMPLES", "8"))


def fuzz_every_method(broker: str, bookie: str, figures: Counter, problems: list) -> None:
    """Blocking: the fuzz strategies against every method of ``broker`` and ``bookie``
    (``host:port``); counts status codes in ``figures``, unclear answers in ``problems``."""
    channels = {"broker": grpc.insecure_channel(broker), "bookie": grpc.insecure_channel(bookie)}
    try:
        for kind, method in METHODS:
            channel = channels[kind]

            @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(inputs(kind, method))
            def run(given_input):
                _, frames = given_input
                code, details, _ = call(channel, kind, method, frames)
                figures["inputs"] += 1
                figures[code.name] += 1
                if code not in CLEAR_CODES or any(t in details for t in PYTHON_TEXT):
                    problems.append(f"{kind}.{method}: {code.name} {details!r} for {frames!r}")

            run()
    finally:
        for ch in channels.values():
            ch.close()


def oversized_frames(broker: str, bookie: str) -> dict:
    """One frame over the gRPC limit to a unary and a streaming method of each server;
    returns {method: status code name}."""
    big = b"\0" * (GRPC_MAX_MESSAGE_BYTES + 1024)
    out = {}
    with grpc.insecure_channel(broker) as ch:
        for name, path, req in [
                ("broker.Admin", "/minipulsar.broker.PulsarBroker/Admin",
                 broker_pb2.AdminRequest(method="brokers.health", body_json="{}").SerializeToString() + b"\x12" + big),
                ("broker.Produce", "/minipulsar.broker.PulsarBroker/Produce", big)]:
            try:
                if name.endswith("Produce"):
                    list(ch.stream_stream(path)(iter([big]), timeout=60))
                else:
                    ch.unary_unary(path)(req, timeout=60)
                out[name] = "OK"
            except grpc.RpcError as exc:
                out[name] = exc.code().name
    with grpc.insecure_channel(bookie) as ch:
        try:
            list(ch.stream_stream("/minipulsar.bookie.Bookie/AddEntry")(iter([big]), timeout=60))
            out["bookie.AddEntry"] = "OK"
        except grpc.RpcError as exc:
            out["bookie.AddEntry"] = exc.code().name
    return out


async def produce_cut_mid_message(broker_port: int, topic: str, payload: bytes, cut_after: int) -> str:
    """A Produce stream through a proxy that resets the connection ``cut_after`` bytes
    after the create was answered, inside the Send frame of ``payload``; returns the
    stream's final status code name."""
    async with TcpProxy("127.0.0.1", broker_port) as proxy:
        async with grpc.aio.insecure_channel(proxy.address) as channel:
            stub = channel.stream_stream("/minipulsar.broker.PulsarBroker/Produce",
                                         request_serializer=broker_pb2.ProducerRequest.SerializeToString,
                                         response_deserializer=broker_pb2.ProducerResponse.FromString)
            stream = stub(timeout=20)
            await stream.write(broker_pb2.ProducerRequest(create=broker_pb2.CreateProducer(
                topic=topic, producer_name="cut-mid-message")))
            first = await stream.read()
            assert first.HasField("success"), first
            proxy.cut_after_bytes(cut_after)
            md = MessageMetadata(producer_name="cut-mid-message", sequence_id=0, publish_time=int(time.time() * 1000))
            await stream.write(broker_pb2.ProducerRequest(sends=broker_pb2.SendBatch(sends=[broker_pb2.Send(
                sequence_id=0, highest_sequence_id=0, num_messages=1, headers_and_payload=encode_entry(md, payload))])))
            try:
                while True:
                    resp = await stream.read()
                    if resp is grpc.aio.EOF:
                        return "EOF"
                    assert not resp.HasField("receipts"), f"a message cut in the middle was acknowledged: {resp}"
            except grpc.aio.AioRpcError as exc:
                return exc.code().name


async def test_malformed_input_while_serving(fault_cluster):
    cluster = fault_cluster(3)
    await cluster.create_namespace("faults/work")
    w = await Workload(cluster.service_url, topic="persistent://faults/work/malformed").start()
    broker, bookie = f"127.0.0.1:{cluster.broker.port}", cluster.bookies[0].address
    figures, problems = Counter(), []
    try:
        await w.run_for(1.0)
        w.fault("fuzzed requests on every method")
        await asyncio.to_thread(fuzz_every_method, broker, bookie, figures, problems)
        w.fault("oversized frames")
        oversized = await asyncio.to_thread(oversized_frames, broker, bookie)
        w.fault("Produce streams cut mid-message")
        cut_topic = "persistent://faults/work/cut-mid-message"
        cut_codes = [await produce_cut_mid_message(cluster.broker.port, cut_topic, b"x" * 300_000, n)
                     for n in (7, 40_000, 150_000)]
        await w.run_for(2.0)
        row = await w.finish("malformed input on every gRPC method",
                             f"{figures['inputs']} fuzzed requests, 3 oversized frames, 3 streams cut mid-message",
                             serve_bound_s=60)
        print(f"fuzz answers: {dict(figures)}; oversized: {oversized}; cut streams: {cut_codes}")
        assert not problems, "\n".join(problems[:5])
        assert figures["inputs"] >= EXAMPLES * len(METHODS) // 2
        assert all(code == "RESOURCE_EXHAUSTED" for code in oversized.values()), oversized
        assert all(p.is_running() for p in [cluster.broker, *cluster.bookies])
        # nothing of the cut messages was stored
        from client import AsyncClient, MessageId
        async with AsyncClient(cluster.service_url) as client:
            reader = await client.create_reader(cut_topic, start_message_id=MessageId.earliest)
            assert not await reader.has_message_available(), "a message cut mid-frame was stored"
            await reader.close()
        assert row.lost == 0
    finally:
        await w.close()
