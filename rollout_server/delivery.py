"""At-least-once delivery of session results to trainer callbacks, from a durable outbox.

A final result and its delivery row are written in one transaction, so no result is recorded without being
queued. The deliverer sends due rows, marks them delivered on success, and otherwise schedules the next attempt
with exponential backoff; after ``max_attempts`` failures (or a permanent rejection) the row is kept as a dead
letter, visible in the task's statistics. Each delivery carries the result's idempotency key: a trainer that
dedupes on it sees every result exactly once, even when an acknowledgement is lost and the row is resent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable

from rollout_server.errors import DeliveryFailed
from rollout_server.metrics import RolloutMetrics
from rollout_server.models import DeliveryConfig, DeliveryRecord, DeliveryState
from rollout_server.ports import CallbackSender
from rollout_server.store import Store

__all__ = ["Deliverer"]

_log = logging.getLogger(__name__)


class Deliverer:
    """Sends queued session results to their callbacks."""

    def __init__(
        self,
        store: Store,
        sender: CallbackSender,
        config: DeliveryConfig,
        *,
        clock: Callable[[], float],
        wakeup: asyncio.Event,
        metrics: RolloutMetrics | None = None,
    ) -> None:
        self._metrics = metrics or RolloutMetrics()
        self._store = store
        self._sender = sender
        self._config = config
        self._clock = clock
        self._wakeup = wakeup
        self._limit = asyncio.Semaphore(config.concurrency)

    def _now(self) -> float:
        return self._clock()

    def backoff(self, attempts: int) -> float:
        """Delay after the ``attempts``-th failed attempt."""
        return float(min(self._config.backoff_s * 2 ** (attempts - 1), self._config.backoff_max_s))

    async def deliver_once(self) -> int:
        """Send every due delivery once; return how many were attempted."""
        due = await self._store.due_deliveries(self._now(), self._config.batch)
        await asyncio.gather(*(self._deliver(d) for d in due))
        return len(due)

    async def _deliver(self, delivery: DeliveryRecord) -> None:
        async with self._limit:
            expected = delivery.attempts
            attempt = expected + 1
            max_attempts = delivery.target.max_attempts or self._config.max_attempts
            result = await self._store.get_result(delivery.session_id)
            updated = dataclasses.replace(delivery, attempts=attempt)
            if result is None:
                updated.state, updated.last_error = DeliveryState.DEAD, "result not found"
                self._metrics.delivery_attempted("dead_lettered")
            else:
                try:
                    await self._sender.deliver(delivery.target, result, attempt)
                except DeliveryFailed as exc:
                    updated.last_error = exc.message
                    if not exc.retryable or attempt >= max_attempts:
                        updated.state = DeliveryState.DEAD
                        self._metrics.delivery_attempted("dead_lettered")
                        _log.warning(
                            "dead-lettered result %s after %d attempts: %s",
                            delivery.idempotency_key,
                            attempt,
                            exc.message,
                        )
                    else:
                        updated.next_attempt_at = self._now() + self.backoff(attempt)
                        self._metrics.delivery_attempted("retry")
                else:
                    updated.state, updated.last_error = DeliveryState.DELIVERED, ""
                    self._metrics.delivery_attempted("delivered", self._now() - result.recorded_at)
            await self._store.update_delivery(updated, expected)

    async def run(self) -> None:
        """Deliver forever: after every wakeup, and at least every ``poll_s``."""
        while True:
            self._wakeup.clear()
            try:
                sent = await self.deliver_once()
            except Exception:
                _log.exception("delivery turn failed; retrying")
                sent = 0
            if sent:
                continue
            due = await self._store.due_deliveries(float("inf"), 1)
            timeout = self._config.poll_s
            if due:
                timeout = min(timeout, max(due[0].next_attempt_at - self._now(), 0.001))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)
