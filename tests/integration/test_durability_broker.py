"""Durability through the SDK against a real broker and real bookie processes that
are killed or paused: what a user of the broker's defaults (E=Qw=Qa=2) sees.

* A bookie SIGKILLed with unconsumed messages: none is lost (the failed ledger is
  closed at the writer's LAC, never trimmed while unconsumed).
* Deduplication on, a bookie killed or paused under load, ledgers rolling over
  every few entries: every send stored exactly once (pending adds resubmitted
  to the next ledger, never revived by a recovery; dedup rewound only after the
  topic's pending adds drained: ``PersistentTopic.addFailed``).
"""
from __future__ import annotations

from tests.procs import restart_bookie_same_port

import asyncio
import os
import signal
import uuid

import pytest

from client import AsyncClient, InitialPosition, MessageId
from client.errors import PulsarException
from tests.procs import ensure_namespace, start_bookie, start_broker


_same_port = restart_bookie_same_port


@pytest.fixture
def cluster(tmp_path, process_tracker):
    """``cluster(n_bookies, **broker_config) -> (broker, [bookies])``: real processes."""

    def start(n_bookies: int = 2, **broker_config):
        bookies = [start_bookie(tmp_path / f"bookie-{i}", tracker=process_tracker) for i in range(n_bookies)]
        conf = tmp_path / "broker.toml"
        lines = []
        for k, v in broker_config.items():
            lines.append(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}")
        conf.write_text("\n".join(lines) + "\n")
        broker = start_broker(tmp_path / "broker", [b.address for b in bookies], config_file=conf,
                              tracker=process_tracker)
        return broker, bookies

    return start


async def _namespace(broker, namespace: str = "public/default") -> None:
    """A broker alone (not standalone) starts without tenants: create the test's namespace."""
    await ensure_namespace(broker.service_url, namespace)


async def _read_everything(client, topic: str) -> list[bytes]:
    reader = await client.create_reader(topic, start_message_id=MessageId.earliest)
    out = []
    while await reader.has_message_available():
        out.append((await reader.read_next(timeout_millis=10000)).data())
    await reader.close()
    return out


async def test_bookie_killed_with_defaults_loses_no_unconsumed_message(cluster):
    """The report: two bookies, broker defaults, 1,000 acknowledged messages, one bookie
    SIGKILLed, one more send times out, the first message acknowledged, the bookie restarted:
    the 999 others must all be delivered (the ledger holding them was trimmed)."""
    broker, bookies = cluster(2)
    await _namespace(broker)
    topic = f"persistent://public/default/dur-{uuid.uuid4().hex[:6]}"
    async with AsyncClient(broker.service_url, operation_timeout_seconds=10) as client:
        consumer = await client.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
        producer = await client.create_producer(topic, send_timeout_millis=3000)
        for i in range(0, 1000, 100):
            await asyncio.gather(*(producer.send(b"m-%04d" % j) for j in range(i, i + 100)))
        bookies[1].kill()
        outage = await asyncio.gather(*(producer.send(b"outage-%02d" % i) for i in range(50)),
                                      return_exceptions=True)   # wait for a ledger: time out on the client
        assert all(isinstance(r, PulsarException) for r in outage)
        first = await consumer.receive(timeout_millis=10000)
        assert first.data() == b"m-0000"
        await consumer.acknowledge_and_wait(first)
        await asyncio.sleep(1.0)                          # trimming had run here
        bookies[1] = _same_port(bookies[1])
        got = []
        while True:
            try:
                msg = await consumer.receive(timeout_millis=15000 if len(got) < 999 else 3000)
            except PulsarException:
                break
            got.append(msg.data())
            consumer.acknowledge(msg)
        expected = [b"m-%04d" % i for i in range(1, 1000)]
        assert got[:999] == expected
        late = got[999:]                                  # timed-out sends may still be stored, once each
        assert late == sorted(set(late)) and all(m.startswith(b"outage-") for m in late)


async def _send_all(producer, total: int, window: int = 200) -> None:
    for start in range(0, total, window):
        await asyncio.gather(*(producer.send(b"m-%06d" % i, sequence_id=i) for i in range(start, start + window)))


@pytest.mark.parametrize("fault", ["kill", "pause"])
async def test_dedup_stores_every_send_once_when_a_bookie_fails(cluster, fault):
    """Dedup on; 2 bookies (E=Qw=Qa=2: no spare); ledgers roll over every 3 entries; a bookie is
    SIGKILLed (or SIGSTOPped, then SIGKILLed) during 6,000 sends and back 2 s later: no send is
    stored twice and none is lost. Before, failed adds were failed to the client while recovery
    wrote them back, and dedup was rewound with later sends still in flight (1,400 duplicates)."""
    broker, bookies = cluster(2, broker_deduplication_enabled=True,
                              managed_ledger_max_entries_per_ledger=3,
                              managed_ledger_min_ledger_rollover_time_minutes=0,
                              bookkeeper_client_timeout_in_seconds=2)
    await _namespace(broker)
    topic = f"persistent://public/default/dedup-{uuid.uuid4().hex[:6]}"
    total = 6000
    async with AsyncClient(broker.service_url) as client:
        # A subscription holds the data (without one, consumed ledgers are trimmed at once).
        await (await client.subscribe(topic, "keep", initial_position=InitialPosition.Earliest)).close()
        producer = await client.create_producer(topic, producer_name="p1", batching_enabled=False,
                                                send_timeout_millis=60000, max_pending_messages=500)
        task = asyncio.create_task(_send_all(producer, total))
        await asyncio.sleep(1.5)
        victim = bookies[0]
        if fault == "pause":
            os.kill(victim.pid, signal.SIGSTOP)
            await asyncio.sleep(3.0)
        victim.kill()
        await asyncio.sleep(2.0)
        bookies[0] = _same_port(victim)
        await asyncio.wait_for(task, 180)
        stored = await _read_everything(client, topic)
    dups = len(stored) - len(set(stored))
    assert dups == 0, f"{dups} duplicates"
    assert stored == [b"m-%06d" % i for i in range(total)]
