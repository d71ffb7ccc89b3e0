"""Building blocks of the settings sections: their frozen base model and constrained field types."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

#: A duration in seconds: positive and finite (``inf`` and ``nan`` are refused).
PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Section(BaseModel):
    """Base of every section of :class:`~mcp_sse_gateway.config.Settings`: frozen, no extra keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")
