"""Wake-ups of the Redis event store: one Pub/Sub subscription per process, fanned out locally.

Waiting readers hold no Redis connection. One subscriber task per store listens on the channel
``<prefix>:wake`` and wakes an :class:`asyncio.Event` per (session digest, stream life) that has
local waiters. Every replica receives every wake-up (about 50 bytes each); in exchange there is
no per-stream ``SUBSCRIBE`` churn. Only streams a reader waits on through the store publish (the
``watch`` script marks them), so a writer's own local readers cost no Pub/Sub traffic.

The subscription runs on redis-py's own machinery:

* its health check (``health_check_interval``): after :data:`SUBSCRIBER_PING_S` of silence it
  sends ``PING`` on the subscribed connection; when nothing at all, not even that ``PONG``,
  arrived for :data:`SUBSCRIBER_DEAD_S`, the connection is given up (half-open TCP);
* its ``Retry``: a read that fails on a dropped connection reconnects and subscribes again, up
  to :data:`SUBSCRIBER_REPEATS` times with backoff :data:`SUBSCRIBER_BACKOFF_S`.

When that does not bring the subscription back, every local waiter is woken to look at its
stream (and then looks again every :data:`UNSUBSCRIBED_RECHECK_S` until the subscription is
back), and the subscriber starts over on a new connection (in Redis Cluster, on the next node),
with jittered exponential backoff (tenacity). Each new subscription wakes every local waiter
again, as wake-ups published while it was down are lost: none is missed across an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
import tenacity
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from mcp_sse_gateway.store.redis.cluster import ClusterSubscriber
from mcp_sse_gateway.store.redis.keys import parse_wake_message

log = structlog.get_logger("mcp_sse_gateway.store")

#: redis-py's health check: a PING after this much silence on the subscription, seconds.
SUBSCRIBER_PING_S = 5.0
#: The subscription is given up when nothing at all arrived for this long, seconds.
SUBSCRIBER_DEAD_S = 15.0
#: The subscriber's read timeout, seconds (the period of its liveness checks).
SUBSCRIBER_POLL_S = 1.0
#: Times redis-py reconnects and subscribes again before the subscription counts as lost.
SUBSCRIBER_REPEATS = 2
#: Backoff between new subscriptions: exponential from the first value, capped at the second,
#: seconds (redis-py's repeats and the subscriber's own).
SUBSCRIBER_BACKOFF_S = (0.05, 2.0)
#: While the subscription is down, waiters look at their stream this often, seconds.
UNSUBSCRIBED_RECHECK_S = 1.0

Key = tuple[str, str]
#: ``has_news(wait_s)``: one look at the stream; True when the waiter should return.
HasNews = Callable[[float], Awaitable[bool]]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


@dataclass(slots=True)
class _Watch:
    """Local waiters of one stream life: one event, replaced at every wake-up."""

    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: Wake-ups received from Redis (not counting resubscriptions).
    messages: int = 0
    users: int = 0

    def wake(self, *, message: bool) -> None:
        if message:
            self.messages += 1
        self.changed.set()
        self.changed = asyncio.Event()


class Wakeups:
    """The process's wake-up subscription and its local waiters.

    Args:
        subscriber: provides the subscription's connection (``pubsub()``); see
            :func:`~mcp_sse_gateway.store.redis.connections.open_clients`.
        channel: the wake-up channel.
        url_for_logs: where Redis is, already redacted.
    """

    def __init__(self, subscriber: Redis | ClusterSubscriber, channel: str, url_for_logs: str):
        self._subscriber = subscriber
        self._channel = channel
        self._url = url_for_logs
        self._watches: dict[Key, _Watch] = {}
        self._subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._down = False
        self._closed = False
        self._parked = 0

    @property
    def subscribed(self) -> bool:
        """Whether the subscription is in place (wake-ups are being received)."""
        return self._subscribed.is_set()

    @property
    def waiting(self) -> int:
        """Calls of :meth:`wait` in progress."""
        return sum(watch.users for watch in self._watches.values())

    @property
    def parked(self) -> int:
        """Calls of :meth:`wait` that looked at their stream and now wait for a wake-up."""
        return self._parked

    async def wait(self, key: Key, has_news: HasNews, timeout_s: float) -> bool:
        """Wait for a wake-up of *key*, looking at the stream with *has_news* first.

        The stream is looked at once the waiter is registered (so a wake-up published during
        the look is not missed: the look marks the stream watched, see the ``watch`` script),
        again after each new subscription, and every :data:`UNSUBSCRIBED_RECHECK_S` while there
        is none.

        Args:
            key: ``(session digest, stream life)``.
            has_news: one look at the stream, given the time left, seconds.
            timeout_s: the longest wait, seconds.

        Returns:
            True when *has_news* said so, a wake-up arrived, or the store closed; False when
            *timeout_s* passed first. Safe to cancel: nothing stays registered.

        Raises:
            StoreUnavailable: *has_news* could not reach Redis.
        """
        self._start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        watch = self._watches.setdefault(key, _Watch())
        watch.users += 1
        try:
            while True:
                changed, seen = watch.changed, watch.messages
                subscribed = self._subscribed.is_set()
                if self._closed or await has_news(max(0.0, deadline - loop.time())):
                    return True
                if loop.time() >= deadline:
                    return False
                if not subscribed:
                    # Wait for the subscription (bounded), then look again.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(
                            min(UNSUBSCRIBED_RECHECK_S, deadline - loop.time())
                        ):
                            await self._subscribed.wait()
                    continue
                self._parked += 1
                try:
                    async with asyncio.timeout_at(deadline):
                        await changed.wait()
                except TimeoutError:
                    return False
                finally:
                    self._parked -= 1
                if watch.messages != seen:
                    return True
                # Subscribed again after an outage (wake-ups may be lost), or closed: look again.
        finally:
            watch.users -= 1
            if watch.users == 0 and self._watches.get(key) is watch:
                del self._watches[key]

    def wake_all(self) -> None:
        """Wake every local waiter to look at its stream."""
        for watch in self._watches.values():
            watch.wake(message=False)

    async def close(self) -> None:
        """Stop the subscriber and wake every waiter (they return True). Idempotent."""
        self._closed = True
        task, self._task = self._task, None
        while task is not None and not task.done():
            # Repeated: a client with a socket_timeout may swallow one cancellation (3.11).
            task.cancel()
            await asyncio.wait([task], timeout=0.1)
        self.wake_all()

    # The subscriber task ------------------------------------------------------------------------

    def _start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="mcp-sse-gateway-store-wakeups"
            )

    async def _run(self) -> None:
        """Subscribe, dispatch, and start over after each loss; never returns."""
        while True:
            # A new backoff after each loss of a subscription that worked.
            async for attempt in tenacity.AsyncRetrying(
                retry=tenacity.retry_if_exception_type(Exception),
                wait=tenacity.wait_random_exponential(
                    multiplier=SUBSCRIBER_BACKOFF_S[0], max=SUBSCRIBER_BACKOFF_S[1]
                ),
            ):
                with attempt:
                    await self._subscribe_once()

    async def _subscribe_once(self) -> None:
        """One subscription until it is lost. Raises when it never got in place."""
        pubsub = self._subscriber.pubsub()
        try:
            await pubsub.subscribe(self._channel)
            await self._dispatch(pubsub)
        except Exception as exc:
            worked = self._subscribed.is_set()
            if worked:
                self._subscribed.clear()
                self.wake_all()  # waiters learn of the outage at once and look for themselves
            if not self._down:
                self._down = True
                log.warning("store.redis_wakeups_lost", url=self._url, error=type(exc).__name__)
            if not worked:
                raise
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # redis-py < 8.2

    async def _dispatch(self, pubsub: PubSub) -> None:
        """Read the subscription until it fails (never returns normally)."""
        loop = asyncio.get_running_loop()
        last_seen, pinged = loop.time(), False
        while True:
            message = await pubsub.get_message(timeout=SUBSCRIBER_POLL_S)
            now = loop.time()
            if message is not None:
                last_seen, pinged = now, False
                self._handle(message)
                continue
            # redis-py's health check PINGs and reads the PONG itself, without returning it.
            last_seen = max(last_seen, _last_read(pubsub))
            if now - last_seen > SUBSCRIBER_DEAD_S:
                raise redis_errors.TimeoutError("the wake-up subscription went silent")
            if now - last_seen > SUBSCRIBER_PING_S and not pinged and not _health_checked(pubsub):
                await pubsub.ping()  # a client built without the health check: PING by hand
                pinged = True

    def _handle(self, message: dict[str, Any]) -> None:
        kind = _text(message["type"])
        if kind == "message":
            parsed = parse_wake_message(_text(message["data"]))
            watch = self._watches.get(parsed) if parsed else None
            if watch is not None:
                watch.wake(message=True)
        elif kind == "subscribe":
            self._subscribed.set()
            if self._down:
                self._down = False
                log.info("store.redis_wakeups_restored", url=self._url)
            # Wake-ups published while there was no subscription are lost: look again.
            self.wake_all()


def _health_checked(pubsub: PubSub) -> bool:
    """Whether redis-py runs its health check on the subscription's connection."""
    return pubsub.connection is not None and bool(pubsub.connection.health_check_interval)


def _last_read(pubsub: PubSub) -> float:
    """When redis-py last read anything on the subscription (its health check's clock).

    ``-inf`` before the first read, or without a health check.
    """
    connection = pubsub.connection
    if connection is None or not _health_checked(pubsub):
        return float("-inf")
    return connection.next_health_check - connection.health_check_interval
