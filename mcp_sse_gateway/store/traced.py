"""An event store whose calls are traced: one ``store.<operation>`` client span per call.

Only used when tracing is on (:mod:`mcp_sse_gateway.tracing`). A call made outside any span (the
heartbeat loop, say) is not traced: it would be a trace of its own every few seconds.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, cast

from mcp_sse_gateway.errors import StoreError
from mcp_sse_gateway.store.base import EventStore, session_digest
from mcp_sse_gateway.tracing import SESSION, Tracing

__all__ = ["traced_store"]

#: Characters of the session digest in attributes (as in log lines).
DIGEST_CHARS = 12


class _TracedStore:
    def __init__(self, store: EventStore, tracing: Tracing, system: str) -> None:
        self._store = store
        self._tracing = tracing
        self._system = system

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name.startswith("_") or not inspect.iscoroutinefunction(attr):
            return attr
        traced = self._trace(name, attr)
        # Looked up once per name: the next call finds it on the instance.
        setattr(self, name, traced)
        return traced

    def _trace(
        self, name: str, call: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        tracing, system = self._tracing, self._system
        parameters = list(inspect.signature(call).parameters)
        by_session = bool(parameters) and parameters[0] == "session_id"
        span_name = f"store.{name}"

        async def traced(*args: Any, **kwargs: Any) -> Any:
            if not tracing.origin():
                return await call(*args, **kwargs)
            attributes: dict[str, str] = {"db.system.name": system, "db.operation.name": name}
            if by_session and args:
                attributes[SESSION] = session_digest(args[0])[:DIGEST_CHARS]
            with tracing.span(span_name, kind="client", attributes=attributes) as span:
                try:
                    return await call(*args, **kwargs)
                except StoreError as exc:
                    span.fail(type(exc).__name__)
                    raise

        traced.__name__ = name
        return traced


def traced_store(store: EventStore, tracing: Tracing, system: str) -> EventStore:
    """*store* with every call inside a span when tracing is on; *store* itself when it is off.

    Args:
        store: the event store.
        tracing: the gateway's tracing.
        system: the backend's name for ``db.system.name`` (``redis`` or ``memory``).
    """
    if not tracing.enabled:
        return store
    return cast("EventStore", _TracedStore(store, tracing, system))
