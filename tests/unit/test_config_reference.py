"""The generated configuration reference is current, and config.example.toml agrees with it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.config.reference import render_reference

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"
EXAMPLE = ROOT / "config.example.toml"
#: Keys the example sets to something other than the default, on purpose.
EXAMPLE_OVERRIDES = {("upstream", "url")}


def test_the_reference_is_current():
    assert REFERENCE.read_text() == render_reference(), (
        "docs/configuration.md is stale: python -m mcp_sse_gateway.config.reference "
        "> docs/configuration.md"
    )


def test_the_reference_names_every_key_and_its_environment_variable():
    text = REFERENCE.read_text()
    for section, field in Settings.model_fields.items():
        assert f"## `[{section}]`" in text
        assert field.annotation is not None
        for key in field.annotation.model_fields:  # type: ignore[union-attr]
            assert f"`MCP_SSE_GATEWAY_{section.upper()}__{key.upper()}`" in text, key


def test_the_example_sets_each_key_it_names_to_its_default():
    example = tomllib.loads(EXAMPLE.read_text())
    defaults = Settings().model_dump(mode="json")
    for section, values in example.items():
        for key, value in values.items():
            if (section, key) in EXAMPLE_OVERRIDES:
                continue
            assert value == defaults[section][key], f"{section}.{key}"


def test_the_operations_guide_names_every_metric():
    from mcp_sse_gateway.metrics import Metrics

    text = (ROOT / "docs" / "operations.md").read_text()
    for family in Metrics().registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in text, name
