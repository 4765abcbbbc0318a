"""The event loop thread of the synchronous facades (``client.sync.Client``,
``SyncAdminClient``, the Spark source's lookups and reads): one asyncio loop
running forever in a daemon thread, which blocking calls submit coroutines to
(the role of the official client's C++ I/O threads, Pulsar's
``ExecutorProvider``/event-loop group).

Its own module so that ``client.admin`` and ``client.sync`` both import it and
neither imports the other.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Callable

from client.errors import AlreadyClosed

__all__ = ["LoopThread"]


class LoopThread:
    """An asyncio event loop running forever in a daemon thread named ``name``.

    ``run(coro, timeout=None)`` blocks the calling thread until the coroutine
    finishes on the loop and returns its result or raises its exception;
    ``call(fn, *args)`` runs a plain function on the loop thread.  Calling them
    from the loop thread itself (e.g. inside a send callback) would deadlock
    and raises ``RuntimeError`` instead.
    """

    def __init__(self, name: str = "minipulsar-client"):
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    @property
    def running(self) -> bool:
        """True while the thread is alive and the loop not closed (False after ``stop``)."""
        return self.thread.is_alive() and not self.loop.is_closed()

    def _check_thread(self) -> None:
        if threading.current_thread() is self.thread:
            raise RuntimeError("blocking minipulsar call from the client's own thread (e.g. inside a send "
                               "callback) would deadlock; use send_async or the AsyncClient API there")
        if not self.running:
            raise AlreadyClosed("the client is closed; create a new one")

    def run(self, coro, timeout: float | None = None):
        """Run ``coro`` on the loop and wait (``timeout`` seconds, None = forever)."""
        try:
            self._check_thread()
        except BaseException:
            coro.close()
            raise
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise
        except KeyboardInterrupt:
            fut.cancel()
            raise

    def call(self, fn: Callable, *args, **kwargs):
        """Run plain ``fn(*args, **kwargs)`` on the loop thread and return its result."""
        async def wrapper():
            return fn(*args, **kwargs)
        return self.run(wrapper())

    def call_soon(self, fn: Callable, *args) -> None:
        """Schedule ``fn(*args)`` on the loop without waiting."""
        if not self.running:
            raise AlreadyClosed("the client is closed; create a new one")
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        """Stop the loop and join the thread.  Idempotent."""
        if self.loop.is_closed():
            return
        if threading.current_thread() is self.thread:
            raise RuntimeError("cannot stop the client from its own thread (e.g. inside a callback)")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()
