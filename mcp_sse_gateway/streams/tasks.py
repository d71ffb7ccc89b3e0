"""Tasks served on behalf of the upstream (the Tasks extension, SEP-2663; DESIGN D11).

A task-supporting ``tools/call`` of the 2026-07-28 era runs upstream in an app-owned task, as a
pump does (D4): the client that asked gets a ``CreateTaskResult`` at once, and its connection
may drop. The task's record is in the store (:mod:`.task_record`), so ``tasks/get`` is answered
on any replica. Every change of a record is a compare-and-set (``EventStore.put_task``), so of a
result, a cancellation and a death found by two replicas, exactly one settles the task.

* The upstream's answer (JSON, or the response in an SSE stream) settles the round: a tool
  result is ``completed``, a JSON-RPC error ``failed``, an ``InputRequiredResult`` (SEP-2322)
  ``input_required``. ``tasks/update`` answers input; once all is answered the call is issued
  upstream again with the answers and the upstream's ``requestState``.
* ``tasks/cancel`` settles ``cancelled`` and closes the upstream request: at once on the
  replica running it, and within ``tasks.poll_interval_ms`` from another one (the running round
  checks its record).
* A round outlives its client but not its replica: a drain lets it finish (up to the drain
  timeout, D8); a replica that dies leaves a ``working`` task whose owner has no heartbeat, and
  the first ``tasks/get`` that sees it fails it (D7).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.errors import SSEError, StoreError, UpstreamError
from mcp_sse_gateway.store.base import TASK_SCOPE, session_digest
from mcp_sse_gateway.streams.answers import jsonrpc_response
from mcp_sse_gateway.streams.context import StreamContext
from mcp_sse_gateway.streams.task_record import (
    Outcome,
    TaskRecord,
    gateway_error,
    new_record,
)
from mcp_sse_gateway.streams.upstream import UpstreamCall, UpstreamResponse, is_event_stream

log = structlog.get_logger("mcp_sse_gateway.tasks")

#: Compare-and-set attempts before a change gives up (each loses only to another change).
MAX_WRITE_ATTEMPTS = 16
#: Error messages of the gateway's own task failures.
REPLICA_GONE = "The gateway replica running the task stopped before the call ended (gateway)"
SHUT_DOWN = "The gateway shut down before the call ended (gateway)"
NO_ANSWER = "The upstream answered no JSON-RPC response to the call (gateway)"
OUTCOME_LOST = "The gateway could not store the call's outcome (gateway)"
#: Delays between attempts to store a round's outcome while the store is down, seconds.
SETTLE_RETRY_S = (0.5, 1.0, 2.0, 4.0)


#: Whether the request at hand presents the credentials a task's binding was made of (D8).
Owns = Callable[[str], bool]


class UnknownTask(LookupError):
    """No task with this id for these credentials (never created, expired, or another's)."""


class Tasks:
    """The tasks of one app.

    Args:
        ctx: the app's stream layer.
    """

    def __init__(self, ctx: StreamContext) -> None:
        self._ctx = ctx
        # task id -> the round running on this replica
        self._running: dict[str, asyncio.Task[None]] = {}
        # task ids whose round this replica is about to start (record written, round not yet)
        self._starting: set[str] = set()

    @property
    def running(self) -> int:
        """Upstream rounds of tasks running on this replica now."""
        return len(self._running)

    # Creating -----------------------------------------------------------------------------------

    async def create(
        self,
        request: dict[str, Any],
        call: UpstreamCall,
        *,
        first: asyncio.Task[Outcome] | None = None,
    ) -> TaskRecord:
        """Store a new task for the ``tools/call`` *request* and start its upstream round.

        The record is stored before this returns (a ``tasks/get`` right after resolves).
        *first* is a round already running (started by :meth:`first_round`), else one starts.

        Raises:
            GatewayBusy: this replica runs ``server.max_pumps`` rounds and pumps already.
            StoreError: the store refused or is down (nothing runs upstream then).
        """
        settings = self._ctx.settings.tasks
        record = new_record(
            request,
            owner=self._ctx.replica_id,
            auth=call.auth,
            ttl_ms=settings.default_ttl_ms,
            poll_ms=settings.poll_interval_ms,
        )
        try:
            self._ctx.check_pump_capacity(standalone=False)  # a task's round is a pump's peer
            if first is not None and first.done() and not first.cancelled():
                # Answered already (an after_input tool's quick result): stored settled.
                record = record.settled(first.result())
            created = await self._ctx.store.put_task(
                record.task_id, record.to_json(), version=0, ttl_ms=record.ttl_ms
            )
        except BaseException:
            if first is not None:
                first.cancel()
            raise
        if not created:  # 128 random bits collided: never in practice
            raise StoreError("task id already taken")
        self._ctx.metrics.tasks_created.inc()
        log.info("task.created", task=_log_id(record.task_id), status=record.status)
        if record.terminal:
            self._ctx.metrics.tasks_settled.labels(record.status).inc()
        else:
            self._start_round(record.task_id, call, request, first)
        return record

    def first_round(self, request: dict[str, Any], call: UpstreamCall) -> asyncio.Task[Outcome]:
        """Start the upstream round of *request* before any task exists (``after_input``)."""
        body = json.dumps(request).encode()
        return asyncio.get_running_loop().create_task(self._ask(call, body), name="task.first")

    def _start_round(
        self,
        task_id: str,
        call: UpstreamCall,
        request: dict[str, Any],
        first: asyncio.Task[Outcome] | None = None,
    ) -> None:
        body = json.dumps(request).encode()
        upstream = first or asyncio.get_running_loop().create_task(
            self._ask(_call_for(call, request), body), name="task.upstream"
        )
        round_ = self._ctx.registry.spawn(self._round(task_id, upstream), name="task.round")
        self._running[task_id] = round_
        round_.add_done_callback(lambda _: self._forget(task_id, round_))

    def _forget(self, task_id: str, round_: asyncio.Task[None]) -> None:
        if self._running.get(task_id) is round_:
            del self._running[task_id]

    # One upstream round ---------------------------------------------------------------------

    async def _round(self, task_id: str, upstream: asyncio.Task[Outcome]) -> None:
        """Wait for the upstream's answer, watching for a cancellation; settle the task."""
        poll_s = self._ctx.settings.tasks.poll_interval_ms / 1000
        try:
            while True:
                done, _ = await asyncio.wait({upstream}, timeout=poll_s)
                if done:
                    break
                record = await self._read_quietly(task_id)
                if record is None or record.terminal:
                    return  # cancelled (or expired) elsewhere: closes the upstream request
            outcome = upstream.result()
        except asyncio.CancelledError:
            # A drain that ran out of time, or a cancellation on this replica (settled then).
            with contextlib.suppress(StoreError):
                await self._settle(task_id, gateway_error(SHUT_DOWN))
            raise
        finally:
            upstream.cancel()
        for delay_s in (*SETTLE_RETRY_S, None):
            try:
                await self._settle(task_id, outcome)
            except StoreError:
                if delay_s is None:
                    # A later tasks/get on this replica fails the task (OUTCOME_LOST).
                    log.warning("task.outcome_lost", task=_log_id(task_id))
                    return
                await asyncio.sleep(delay_s)
            else:
                return

    async def _ask(self, call: UpstreamCall, body: bytes) -> Outcome:
        """Send the ``tools/call`` upstream and read its one JSON-RPC response.

        Never raises but for cancellation: every failure is the gateway's error outcome.
        """
        timeout_s = self._ctx.settings.tasks.run_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._ctx.upstream.open(
                    "POST", call.url, call.headers, body, headers_timeout_s=timeout_s
                )
                try:
                    return await self._answer(response)
                finally:
                    response.close()
        except TimeoutError:
            return gateway_error(f"The call ran longer than {timeout_s:g} s (gateway)")
        except UpstreamError as exc:
            self._ctx.metrics.upstream_errors.labels(type(exc).__name__).inc()
            return gateway_error(f"The upstream failed: {type(exc).__name__} (gateway)")
        except SSEError:
            return gateway_error("The upstream's answer is too large or malformed (gateway)")

    async def _answer(self, response: UpstreamResponse) -> Outcome:
        """The outcome in *response*: its JSON-RPC response (JSON or SSE), else an error."""
        limit = self._ctx.settings.store.max_event_bytes
        message = await jsonrpc_response(response, max_bytes=limit)
        if message is not None:
            return Outcome.of_response(message)
        if is_event_stream(response):
            return gateway_error(NO_ANSWER)
        return Outcome(
            "error",
            {
                "code": jsonrpc.UPSTREAM_HTTP_ERROR,
                "message": f"Upstream answered HTTP {response.status}, not a JSON-RPC response",
                "data": {"status": response.status},
            },
        )

    # Reading and changing records -------------------------------------------------------------

    async def get(self, task_id: str, owns: Owns) -> TaskRecord:
        """The task as ``tasks/get`` shows it; a ``working`` task whose replica died fails now.

        *owns* tells whether the request presents the creator's credentials.

        Raises:
            UnknownTask: no such task for these credentials.
            StoreError: the store is down.
        """
        record = await self._read(task_id, owns)
        if record.status != "working" or not record.owner:
            return record
        owner = record.owner
        if owner == self._ctx.replica_id:
            # This replica's round: running, starting, or ended without settling (the store
            # was down when it tried): the outcome is lost then.
            if task_id in self._running or task_id in self._starting:
                return record
            reason = OUTCOME_LOST
        elif not await self._ctx.store.replica_alive(owner):
            reason = REPLICA_GONE
        else:
            return record
        failed = await self._change(
            task_id,
            lambda r: (
                r.settled(gateway_error(reason))
                if r.status == "working" and r.owner == owner
                else None
            ),
        )
        if failed is None:
            return await self._read(task_id, owns)
        self._ctx.metrics.tasks_settled.labels("failed").inc()
        log.warning("task.orphaned", task=_log_id(task_id), owner=owner[:8])
        return failed

    async def binding(self, task_id: str, owns: Owns) -> str:
        """The credential binding of the task (to check the request with the upstream, D8).

        Raises:
            UnknownTask: no such task for these credentials.
            StoreError: the store is down.
        """
        return (await self._read(task_id, owns)).auth

    async def cancel(self, task_id: str, owns: Owns) -> None:
        """Cancel the task (idempotent: a terminal task stays as it is).

        Raises:
            UnknownTask: no such task for these credentials.
            StoreError: the store is down.
        """
        await self._read(task_id, owns)
        changed = await self._change(task_id, lambda r: None if r.terminal else r.cancelled())
        if changed is not None and changed.status == "cancelled":
            self._ctx.metrics.tasks_settled.labels("cancelled").inc()
            log.info("task.settled", task=_log_id(task_id), status="cancelled")
            running = self._running.get(task_id)
            if running is not None:
                running.cancel("task cancelled")

    async def update(
        self, task_id: str, owns: Owns, responses: dict[str, Any], call: UpstreamCall
    ) -> None:
        """Record the client's answers to pending input; the last one re-issues the call.

        Answers to keys that are not pending are ignored; a task that waits for no input is
        left as it is.

        Raises:
            UnknownTask: no such task for these credentials.
            StoreError: the store is down.
        """
        await self._read(task_id, owns)
        # Shielded: a client that leaves once the answers are stored must not stop the round
        # they start (the task would stay working with no round).
        await asyncio.shield(self._answer_input(task_id, responses, call))

    async def _answer_input(
        self, task_id: str, responses: dict[str, Any], call: UpstreamCall
    ) -> None:
        me = self._ctx.replica_id
        self._starting.add(task_id)
        try:
            changed = await self._change(
                task_id,
                lambda r: r.answered(responses, me) if r.status == "input_required" else None,
            )
            if changed is not None and changed.status == "working":
                log.info("task.input_answered", task=_log_id(task_id))
                self._start_round(task_id, call, changed.reissued())
        finally:
            self._starting.discard(task_id)

    async def _settle(self, task_id: str, outcome: Outcome) -> None:
        """End a round: the task takes *outcome* unless it was settled meanwhile."""
        me = self._ctx.replica_id
        changed = await self._change(
            task_id,
            lambda r: r.settled(outcome) if r.status == "working" and r.owner == me else None,
        )
        if changed is not None:
            if changed.terminal:
                self._ctx.metrics.tasks_settled.labels(changed.status).inc()
            log.info("task.settled", task=_log_id(task_id), status=changed.status)

    async def _read(self, task_id: str, owns: Owns) -> TaskRecord:
        found = await self._ctx.store.get_task(task_id)
        record = _decode(found[1]) if found is not None else None
        # Another client's task is unknown to this one (its id is no bearer token).
        if record is None or not owns(record.auth):
            raise UnknownTask(task_id)
        return record

    async def _read_quietly(self, task_id: str) -> TaskRecord | None:
        """The record for a running round's check; a store outage is no cancellation."""
        try:
            found = await self._ctx.store.get_task(task_id)
        except StoreError:
            return _STILL_RUNNING
        return _decode(found[1]) if found is not None else None

    async def _change(
        self, task_id: str, change: Callable[[TaskRecord], TaskRecord | None]
    ) -> TaskRecord | None:
        """Apply *change* to the stored record by compare-and-set; None when it changed nothing.

        Raises:
            StoreError: the store is down, or the record kept changing under us.
        """
        for _ in range(MAX_WRITE_ATTEMPTS):
            found = await self._ctx.store.get_task(task_id)
            if found is None:
                return None
            version, text = found
            current = _decode(text)
            if current is None:
                return None
            new = change(current)
            if new is None:
                return None
            written = await self._ctx.store.put_task(
                task_id, new.to_json(), version=version, ttl_ms=new.ttl_ms
            )
            if written:
                return new
        raise StoreError("the task record kept changing")


#: What a running round sees of its record while the store is down: go on.
_STILL_RUNNING = TaskRecord("", "working", "", "", 1, 1, "", "", {})


def _log_id(task_id: str) -> str:
    """What log lines show of a task id: a digest (the id itself reads the task)."""
    return session_digest(TASK_SCOPE + task_id)[:12]


def _call_for(call: UpstreamCall, request: dict[str, Any]) -> UpstreamCall:
    """*call* with its ``Mcp-Method`` and ``Mcp-Name`` headers (SEP-2243) naming *request*.

    A round that ``tasks/update`` starts is sent with that request's headers (its credentials):
    they name ``tasks/update`` and the task, and must name ``tools/call`` and the tool.
    """
    params = request.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    values = {"mcp-method": str(request.get("method")), "mcp-name": str(name)}
    headers = [(n, values.get(n.lower(), v)) for n, v in call.headers]
    return replace(call, headers=headers)


def _decode(text: str) -> TaskRecord | None:
    try:
        return TaskRecord.from_json(text)
    except ValueError:
        log.warning("task.record_unreadable")
        return None
