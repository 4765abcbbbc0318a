"""Acknowledgment receipts: which ``Ack`` frames the broker has not answered
yet, and which ``acknowledge_and_wait`` calls wait for them.

Pulsar concept: the ack receipt (``ConsumerBuilder.isAckReceiptEnabled``,
``PersistentAcknowledgmentsGroupingTracker`` completing each ack's future when
the ``CommandAckResponse`` of the flush that carried it arrives). An ack can
leave in any flush -- the group timer's, the one sent on a new connection
before the first Flow, or the waiting call's own -- so a waiter is not tied
to the frames it wrote itself: once its ack has been taken from the pending
set, it waits for every flush in flight at that moment (its ack is in one of
them), and

- is done when all of them are confirmed;
- fails with the broker's error when one is refused with a non-retriable
  error (``InvalidArgument``, ``NotAllowed``, ...): that ack is dropped, as
  Pulsar does;
- waits again when a flush is refused with a retriable error
  (``ServiceNotReady``: the topic is being unloaded) or the connection breaks
  before the answer: the caller makes those acks pending again
  (``AcknowledgmentsGroupingTracker.requeue`` / ``requeue_in_flight``) and the
  waiter attaches to the flush that sends them next.

Before this, a call that found its ack already taken by another flush (e.g.
the one sent on reconnection while it waited for the connection) returned at
once, confirming an ack the broker had not applied, or had refused.

Sans-I/O apart from completing asyncio futures; not thread-safe (the
consumer's loop only).
"""
from __future__ import annotations

import asyncio
from typing import Optional

__all__ = ["AckReceipts", "CONFIRMED", "REFUSED", "REQUEUE", "PENDING"]

CONFIRMED = "confirmed"   # every frame of the flush was applied
REFUSED = "refused"       # a frame was refused with a non-retriable error: the flush's acks are dropped
REQUEUE = "requeue"       # a frame was refused with a retriable error: send the flush's acks again
PENDING = "pending"       # frames of the flush are still unanswered (or the request id is unknown)


class AckReceipts:
    """Frames in flight per tracker token (``flush_in_flight``) and the waiters
    of ``acknowledge_and_wait``.

    Usage: ``add_waiter(future)`` after adding the ack to the tracker; after
    every ``tracker.flush_in_flight()``, ``sent(token, request_ids)`` (each
    frame's request id) and then ``attach()``; on each answer to an ack frame,
    ``answered(request_id, error)`` says what to do with the flush; on a broken
    stream ``connection_lost()``; on close ``close(error)``.
    """

    __slots__ = ("_rid_token", "_frames_left", "_errors", "_waiters")

    def __init__(self) -> None:
        self._rid_token: dict[int, int] = {}        # request id -> token
        self._frames_left: dict[int, int] = {}      # token -> frames not answered yet
        self._errors: dict[int, BaseException] = {}  # token -> first error answered for it
        # [future, tokens waited for (None: its ack is still pending in the tracker)]
        self._waiters: list[list] = []

    # ---------------------------------------------------------------- registering
    def add_waiter(self, future: asyncio.Future) -> None:
        """``future`` completes once the acks pending now are confirmed (see module doc)."""
        self._waiters.append([future, None])

    def sent(self, token: int, request_ids: list[int]) -> None:
        """The flush ``token`` left as frames with ``request_ids`` (at least one)."""
        for rid in request_ids:
            self._rid_token[rid] = token
        self._frames_left[token] = len(request_ids)

    def attach(self) -> None:
        """Pending acks were just taken (flushed, or found empty): each waiter
        whose ack was pending now waits for every flush in flight; with none in
        flight its ack is already confirmed (or was a no-op) and it is done."""
        tokens = set(self._frames_left)
        for w in self._waiters:
            if w[1] is None:
                if tokens:
                    w[1] = set(tokens)
                elif not w[0].done():
                    w[0].set_result(None)
        self._prune()

    # ---------------------------------------------------------------- answers
    def answered(self, request_id: int, error: Optional[BaseException]) -> tuple[Optional[int], str]:
        """An answer to an ack frame: ``error`` None for CommandSuccess, else the
        exception of the CommandError (with its ``retriable`` flag). Returns
        ``(token, outcome)``: ``(None, PENDING)`` for a request id that is not
        an ack in flight; ``PENDING`` while other frames of the flush are
        unanswered; otherwise ``CONFIRMED`` (confirm the token in the tracker),
        ``REFUSED`` (confirm it too: the broker will not apply it) or
        ``REQUEUE`` (requeue the token in the tracker)."""
        token = self._rid_token.pop(request_id, None)
        if token is None:
            return None, PENDING
        if error is not None:
            self._errors.setdefault(token, error)
        left = self._frames_left.get(token, 1) - 1
        if left > 0:
            self._frames_left[token] = left
            return token, PENDING
        self._frames_left.pop(token, None)
        error = self._errors.pop(token, None)
        if error is None:
            outcome = CONFIRMED
        elif getattr(error, "retriable", False):
            outcome = REQUEUE
        else:
            outcome = REFUSED
        for w in self._waiters:
            if w[1] is None or token not in w[1]:
                continue
            if outcome == CONFIRMED:
                w[1].discard(token)
                if not w[1] and not w[0].done():
                    w[0].set_result(None)
            elif outcome == REFUSED:
                if not w[0].done():
                    w[0].set_exception(error)
            else:
                w[1] = None   # its ack is pending again: it attaches to the next flush
        self._prune()
        return token, outcome

    def connection_lost(self) -> None:
        """The stream broke: no answer will come for what is in flight; the
        caller requeues every flush (``requeue_in_flight``) and every waiter of
        one waits for the next flush."""
        self._rid_token.clear()
        self._frames_left.clear()
        self._errors.clear()
        for w in self._waiters:
            if w[1] is not None:
                w[1] = None
        self._prune()

    def close(self, error: BaseException) -> None:
        """The consumer closed: every waiter still waiting fails with ``error``."""
        for fut, _ in self._waiters:
            if not fut.done():
                fut.set_exception(error)
        self._waiters.clear()
        self._rid_token.clear()
        self._frames_left.clear()
        self._errors.clear()

    # ---------------------------------------------------------------- figures
    def in_flight(self) -> int:
        """Flushes whose frames are not all answered."""
        return len(self._frames_left)

    def waiting(self) -> int:
        """Waiters not done yet."""
        return sum(1 for fut, _ in self._waiters if not fut.done())

    def _prune(self) -> None:
        if any(fut.done() for fut, _ in self._waiters):
            self._waiters = [w for w in self._waiters if not w[0].done()]
