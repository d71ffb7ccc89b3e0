"""The configuration reference (``docs/configuration.md``), generated from the settings models.

Every key of every section, with its environment variable, default, unit and meaning, taken from
the pydantic fields themselves, so the reference cannot drift from the code (a test compares the
file with :func:`render_reference`). Regenerate it with::

    python -m mcp_sse_gateway.config.reference > docs/configuration.md
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from mcp_sse_gateway.config.settings import CONFIG_PATH_ENV, ENV_PREFIX, Settings

__all__ = ["render_reference"]

#: Units by key suffix (the settings' naming rule: units are in the names).
UNITS = (("_ms", "milliseconds"), ("_s", "seconds"), ("_bytes", "bytes"))

HEADER = f"""# Configuration reference

<!-- Generated from the settings models by `python -m mcp_sse_gateway.config.reference`:
do not edit by hand (a test fails when this file is stale). -->

Every key, by section. Set a key in a TOML file (`--config PATH`, or the `{CONFIG_PATH_ENV}`
variable), in the environment, or with a command-line flag where one exists. Precedence, highest
first: flags, environment, the TOML file, the defaults. Environment variables are named
`{ENV_PREFIX}<SECTION>__<KEY>`; lists are JSON (`'["mcp.example.com"]'`). A misspelt key is
refused; a variable of the prefix that names no section is ignored, with a warning on stderr.
Durations end in `_s` (seconds) or `_ms` (milliseconds), sizes in `_bytes`.
`config.example.toml` holds every key with its default. `mcp-sse-gateway check-config` prints
the settings in effect, secrets redacted (URLs keep their host).

Tracing is configured by OpenTelemetry's own `OTEL_*` variables, not here: see
[operations](operations.md#traces). "DESIGN D7" and the like name sections of the
[design](design.md).
"""


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    else:
        value = field.default
    if value is None:
        return "none"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value)}`"


def _unit(key: str) -> str:
    for suffix, unit in UNITS:
        if key.endswith(suffix):
            return unit
    return ""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _section(name: str, model: type[BaseModel]) -> list[str]:
    doc = inspect.cleandoc(model.__doc__ or "").split("\n\n", 1)[0]
    lines = [
        f"## `[{name}]`",
        "",
        " ".join(doc.split()),
        "",
        "| key | environment variable | default | unit | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, field in model.model_fields.items():
        if not field.description:
            raise ValueError(f"{name}.{key} has no description: the reference needs one")
        env = f"{ENV_PREFIX}{name.upper()}__{key.upper()}"
        lines.append(
            f"| `{key}` | `{env}` | {_default(field)} | {_unit(key)} | {_cell(field.description)} |"
        )
    return [*lines, ""]


def render_reference() -> str:
    """The reference as Markdown: a table per section, in the order of :class:`Settings`.

    Raises:
        ValueError: a field has no ``description``.
        TypeError: a field of :class:`Settings` is not a section.
    """
    lines = [HEADER]
    for name, field in Settings.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise TypeError(f"{name} is not a section model")
        lines += _section(name, model)
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_reference())
