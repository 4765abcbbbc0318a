"""Helpers for geo-replication tests: N real clusters (each a standalone
process: 2 bookies + 1 broker with its own metadata store) registered with
each other, and admin/produce/consume helpers over the raw protocol."""
from __future__ import annotations

import json
from pathlib import Path

import grpc

from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from tests.procs import ProcessTracker, StandaloneProcess


class Cluster:
    def __init__(self, name: str, proc: StandaloneProcess):
        self.name = name
        self.proc = proc
        self._channel = None
        self._loop = None

    @property
    def url(self) -> str:
        return self.proc.service_url

    def stub(self):
        import asyncio

        loop = asyncio.get_running_loop()
        if self._channel is None or self._loop is not loop:
            self._channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.proc.port}")
            self._loop = loop
        return broker_pb2_grpc.PulsarBrokerStub(self._channel)

    async def admin(self, method: str, **body):
        resp = await self.stub().Admin(pb.AdminRequest(method=method, body_json=json.dumps(body)), timeout=30)
        return json.loads(resp.body_json)

    async def close(self):
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def start_clusters(base: Path, names: list[str], tracker: ProcessTracker, broker_config: str = "") -> list[Cluster]:
    clusters = []
    for name in names:
        extra = ["--cluster-name", name, "--no-journal-sync"]
        if broker_config:
            cfg = base / f"{name}-broker.toml"
            cfg.write_text(broker_config)
            extra += ["--broker-config", str(cfg)]
        proc = StandaloneProcess(base / name, extra, tracker).start()
        clusters.append(Cluster(name, proc))
    return clusters


async def connect_clusters(clusters: list[Cluster], tenant: str, namespace: str, replication: list[str]) -> None:
    """Register every cluster in every cluster's metadata, create the tenant
    (allowed everywhere) and the namespace replicated to ``replication``."""
    names = [c.name for c in clusters]
    for c in clusters:
        for other in clusters:
            if other is not c:
                try:
                    await c.admin("clusters.create", name=other.name, service_url=other.url)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                        raise
                    await c.admin("clusters.update", name=other.name, service_url=other.url)
        await c.admin("tenants.create", tenant=tenant, allowed_clusters=names)
        await c.admin("namespaces.create", namespace=f"{tenant}/{namespace}")
        await c.admin("namespaces.set_clusters", namespace=f"{tenant}/{namespace}", clusters=replication)


def single_entry(producer: str, seq: int, payload: bytes, replicate_to=None) -> bytes:
    from client.batching import BatchMessageContainer, PendingMessage
    from client.entry_format import encode_entry

    c = BatchMessageContainer()
    c.add(PendingMessage(payload=payload, sequence_id=seq,
                         replicate_to=list(replicate_to) if replicate_to else None))
    md, data, _ = c.build(producer, publish_time_ms=int(__import__("time").time() * 1000))
    return encode_entry(md, data)


async def produce_raw(cluster: Cluster, topic: str, producer: str, payloads: list[bytes], start_seq: int = 0,
                      replicate_to=None, window: int = 100) -> list:
    """Send each payload as one entry; returns the receipts (in order)."""
    call = cluster.stub().Produce()
    await call.write(pb.ProducerRequest(create=pb.CreateProducer(topic=topic, producer_name=producer)))
    first = await call.read()
    assert first.HasField("success"), first
    receipts = []
    for i in range(0, len(payloads), window):
        chunk = payloads[i:i + window]
        await call.write(pb.ProducerRequest(sends=pb.SendBatch(sends=[
            pb.Send(sequence_id=start_seq + i + k, highest_sequence_id=start_seq + i + k, num_messages=1,
                    headers_and_payload=single_entry(producer, start_seq + i + k, p, replicate_to))
            for k, p in enumerate(chunk)])))
        got = 0
        while got < len(chunk):
            resp = await call.read()
            assert resp.HasField("receipts"), resp
            receipts.extend(resp.receipts.receipts)
            got += len(resp.receipts.receipts)
    await call.done_writing()
    call.cancel()
    return receipts


async def read_all(cluster: Cluster, topic: str, expect: int, timeout_s: float = 30.0,
                   settle_s: float = 0.5) -> list:
    """Read the topic from the earliest position with a Reader until ``expect``
    entries arrived and nothing more came for ``settle_s``; returns
    [(MessageMetadata, payload bytes)] (single-message entries)."""
    import asyncio
    import time

    from client.batching import parse_batch
    from client.entry_format import decode_entry

    call = cluster.stub().Consume()
    await call.write(pb.ConsumerRequest(subscribe=pb.Subscribe(
        topic=topic, subscription=f"reader-{time.monotonic_ns()}", sub_type=pb.Exclusive,
        initial_position=pb.Earliest, durable=False)))
    first = await call.read()
    assert first.HasField("subscribed"), first
    await call.write(pb.ConsumerRequest(flow=pb.Flow(permits=1_000_000)))
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            wait = settle_s if len(out) >= expect else max(0.05, deadline - time.monotonic())
            try:
                resp = await asyncio.wait_for(call.read(), wait)
            except asyncio.TimeoutError:
                if len(out) >= expect:
                    break
                continue
            if resp.HasField("messages"):
                for e in resp.messages.entries:
                    md, payload = decode_entry(e.headers_and_payload)
                    for smm, data in parse_batch(md, bytes(payload)):
                        out.append((md, data))
    finally:
        call.cancel()
    return out


class RawConsumer:
    """A consumer over the raw Consume stream (durable, Exclusive by default)."""

    def __init__(self, cluster: Cluster, topic: str, subscription: str, replicated: bool = True,
                 sub_type=pb.Exclusive, initial=pb.Earliest):
        self.cluster, self.topic, self.subscription = cluster, topic, subscription
        self.replicated, self.sub_type, self.initial = replicated, sub_type, initial
        self.call = None
        self.buffer = []
        self._req = 0

    async def start(self, permits: int = 100000):
        self.call = self.cluster.stub().Consume()
        await self.call.write(pb.ConsumerRequest(subscribe=pb.Subscribe(
            topic=self.topic, subscription=self.subscription, sub_type=self.sub_type,
            initial_position=self.initial, durable=True, replicate_subscription_state=self.replicated)))
        first = await self.call.read()
        assert first.HasField("subscribed"), first
        await self.call.write(pb.ConsumerRequest(flow=pb.Flow(permits=permits)))
        import asyncio
        self.queue = asyncio.Queue()
        self._pump_task = asyncio.create_task(self._pump())
        return self

    async def _pump(self):
        from client.batching import parse_batch
        from client.entry_format import decode_entry

        try:
            while True:
                resp = await self.call.read()
                if resp is grpc.aio.EOF:
                    return
                if resp.HasField("messages"):
                    for e in resp.messages.entries:
                        md, payload = decode_entry(e.headers_and_payload)
                        for _, data in parse_batch(md, bytes(payload)):
                            self.queue.put_nowait((e.position, md, data))
        except (grpc.aio.AioRpcError, __import__("asyncio").CancelledError):
            return

    async def receive(self, n: int, timeout_s: float = 20.0):
        """Next n messages (fewer on timeout): [(position, md, payload)]."""
        import asyncio
        import time

        deadline = time.monotonic() + timeout_s
        out = []
        while len(out) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                out.append(await asyncio.wait_for(self.queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return out

    async def ack_cumulative(self, position):
        self._req += 1
        await self.call.write(pb.ConsumerRequest(ack=pb.Ack(ack_type=pb.Cumulative, request_id=self._req, positions=[
            pb.AckPosition(ledger_id=position.ledger_id, entry_id=position.entry_id)])))

    async def ack(self, positions):
        self._req += 1
        await self.call.write(pb.ConsumerRequest(ack=pb.Ack(ack_type=pb.Individual, request_id=self._req, positions=[
            pb.AckPosition(ledger_id=p.ledger_id, entry_id=p.entry_id) for p in positions])))

    def close(self):
        if self.call is not None:
            self.call.cancel()
            self._pump_task.cancel()
