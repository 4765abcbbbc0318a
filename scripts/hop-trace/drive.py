"""Send N 100-byte messages to topic ``hop-trace`` with a consumer acking them,
so every hop can be timed: unbatched, one at a time (GAP seconds apart), or with
RATE given, at RATE msg/s with 1 ms batching (what the latency benchmark does).
Usage: drive.py SERVICE_URL N GAP_S [RATE]"""

import asyncio
import sys
import time

import mptrace
from client.client import AsyncClient


async def main() -> None:
    url, n, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0
    async with AsyncClient(url) as c:
        consumer = await c.subscribe("hop-trace", "s1")

        async def consume():
            while True:
                m = await consumer.receive()
                consumer.acknowledge(m)

        consuming = asyncio.ensure_future(consume())
        producer = await c.create_producer("hop-trace", batching_enabled=rate > 0, batching_max_publish_delay_ms=1)
        for _ in range(200):  # warm-up, not analysed
            await producer.send(b"x" * 100)
        mptrace.T("START")
        t0 = time.perf_counter()
        for i in range(n):
            if rate:
                producer.send_async(b"x" * 100, lambda res, msg_id: None)
                await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.perf_counter()))
            else:
                await producer.send(b"x" * 100)
                await asyncio.sleep(gap)
            if (i + 1) % 500 == 0:
                print(f"\r{i + 1}/{n} messages", end="", file=sys.stderr, flush=True)
        print(f"\n{n} messages, {(time.perf_counter() - t0) / n * 1e3:.2f} ms per send + gap", file=sys.stderr)
        await asyncio.sleep(0.5)
        consuming.cancel()
        await producer.close()


asyncio.run(main())
