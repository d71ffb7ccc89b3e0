"""Durable tool calls of the 2026-07-28 era: the ``[tasks]`` section (DESIGN D11).

With ``enabled``, the gateway serves the Tasks extension (``io.modelcontextprotocol/tasks``,
SEP-2663) on behalf of an upstream that lacks it, for the tools listed in ``[tasks.tools]``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mcp_sse_gateway.config.defaults import (
    DEFAULT_TASK_INPUT_WAIT_MS,
    DEFAULT_TASK_POLL_INTERVAL_MS,
    DEFAULT_TASK_RUN_TIMEOUT_S,
    DEFAULT_TASK_TTL_MS,
)
from mcp_sse_gateway.config.fields import PositiveSeconds, Section

#: How a listed tool runs as a task, for a client that declares the extension:
#: ``optional`` and ``required`` (the MCP ``taskSupport`` terms) become a task at once;
#: ``after_input`` relays an input request the upstream answers at once (an MRTR round) and
#: becomes a task otherwise. A client without the extension gets ``-32021`` for a ``required``
#: tool and the upstream's synchronous answer for the others.
TaskSupport = Literal["optional", "required", "after_input"]


class TasksSettings(Section):
    """The Tasks extension served by the gateway (2026-07-28 era requests only; DESIGN D11)."""

    enabled: bool = Field(
        default=False,
        description="Serve the Tasks extension (io.modelcontextprotocol/tasks) for the tools in "
        "tasks.tools, on requests of the 2026-07-28 era: the upstream call runs in the gateway, "
        "and its record (status, result, input requests) is kept in the store.",
    )
    default_ttl_ms: int = Field(
        default=DEFAULT_TASK_TTL_MS,
        gt=0,
        description="How long a task's record is kept after it is created (ttlMs), milliseconds.",
    )
    poll_interval_ms: int = Field(
        default=DEFAULT_TASK_POLL_INTERVAL_MS,
        gt=0,
        description="The polling interval suggested to clients (pollIntervalMs), milliseconds; "
        "also how often a running task checks for a cancellation from another replica.",
    )
    input_wait_ms: int = Field(
        default=DEFAULT_TASK_INPUT_WAIT_MS,
        ge=0,
        description="For after_input tools: how long the gateway waits for the upstream's "
        "first answer before it creates the task, milliseconds. An input request within it is "
        "relayed as it is (an MRTR round); anything else becomes the task.",
    )
    run_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_TASK_RUN_TIMEOUT_S,
        description="How long one upstream round of a task may run before the task fails, seconds.",
    )

    @model_validator(mode="after")
    def _rounds_end_before_records(self) -> TasksSettings:
        # A round that outlived its record would have nowhere to put its result.
        if self.run_timeout_s * 1000 >= self.default_ttl_ms:
            raise ValueError("run_timeout_s must be shorter than default_ttl_ms")
        return self

    tools: dict[str, TaskSupport] = Field(
        default_factory=dict,
        description="Task support per tool name: optional, required or after_input. Tools not "
        'listed stay synchronous. Environment form: a JSON object, {"slow_compute": "optional"}.',
    )
