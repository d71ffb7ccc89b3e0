"""The container image (Dockerfile), checked without a Docker engine.

CI builds no image (no engine runs there): hadolint lints the Dockerfile (``.ci/run``), these
tests check its invariants, and the last one runs the image's recipe in a fresh virtual
environment: the same hash-pinned lock file, the same wheel, the same command line and
environment, in front of the example server.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import aiohttp
import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

from mcp_sse_gateway.example.process import example_upstream
from tests.support.gateway_process import (
    GATEWAY_ENV_PREFIX,
    gateway_env,
    gateway_process,
    serve_command,
)
from tests.support.mcp_http import open_session
from tests.support.mcp_http import stream_notifications_call as _call
from tests.support.ports import free_port
from tests.support.sse_client import json_messages, read_events

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"


def _instructions() -> list[dict]:
    parser = DockerfileParser(path=str(DOCKERFILE))
    return parser.structure


def _final_stage() -> list[dict]:
    instructions = _instructions()
    last_from = max(i for i, ins in enumerate(instructions) if ins["instruction"] == "FROM")
    return instructions[last_from:]


def _values(stage: list[dict], instruction: str) -> list[str]:
    return [ins["value"] for ins in stage if ins["instruction"] == instruction]


def test_multi_stage_on_a_slim_official_python():
    froms = _values(_instructions(), "FROM")
    assert len(froms) >= 2  # build and runtime
    # Every stage starts from the official image or from an earlier stage of this file.
    stages = {f.split()[-1] for f in froms if " AS " in f.upper()}
    assert all(f.split()[0] in {"${PYTHON_IMAGE}", *stages} for f in froms)
    assert froms[-1].split()[0] == "${PYTHON_IMAGE}"  # the runtime: no build stage beneath
    args = dict(v.split("=", 1) for v in _values(_instructions(), "ARG") if "=" in v)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base), base


def test_runtime_stage_invariants():
    stage = _final_stage()
    user = _values(stage, "USER")
    assert user, "no USER in the runtime stage"
    assert user[-1].split(":")[0] not in {"0", "root"}
    assert json.loads(_values(stage, "ENTRYPOINT")[-1]) == ["mcp-sse-gateway"]
    assert json.loads(_values(stage, "CMD")[-1]) == ["serve"]
    assert _values(stage, "EXPOSE") == ["8080"]
    assert _values(stage, "STOPSIGNAL") == ["SIGTERM"]
    healthcheck = _values(stage, "HEALTHCHECK")[-1]
    command = json.loads(healthcheck.split("CMD", 1)[1])
    # Liveness: a draining gateway answers /readyz 503 on purpose and must not be killed.
    assert command == ["mcp-sse-gateway", "healthcheck"]
    env = " ".join(_values(stage, "ENV"))
    assert "MCP_SSE_GATEWAY_SERVER__HOST=0.0.0.0" in env
    assert "MCP_SSE_GATEWAY_SERVER__PORT=8080" in env
    labels = " ".join(_values(stage, "LABEL"))
    for key in ("title", "version", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    runs = " ".join(_values(stage, "RUN"))
    for tool in ("apt-get install", "gcc", "build-essential", "pip install"):
        assert tool not in runs, f"{tool} in the runtime stage"


def test_dependencies_come_from_the_hash_pinned_lock():
    runs = " ".join(_values(_instructions(), "RUN"))
    assert "--require-hashes" in runs
    assert "-r requirements.lock" in runs


def _locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    text = LOCK.read_text()
    for block in re.split(r"\n(?=\S)", text):
        match = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)", block)
        if match:
            assert "--hash=sha256:" in block, f"{match.group(1)} is not hash-pinned"
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_the_lock_pins_every_dependency_of_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _locked()
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} missing from requirements.lock (regenerate it)"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]}: {spec}"


def test_dockerignore_keeps_the_context_small():
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"  # everything out, then the few files the image needs back in
    allowed = {p[1:] for p in patterns if p.startswith("!")}
    assert {"requirements.lock", "pyproject.toml", "mcp_sse_gateway/"} <= allowed
    assert not allowed & {"tests/", ".venv/", ".git/"}


def _run(*command: str | Path, cwd: Path | None = None) -> None:
    subprocess.run(
        [str(c) for c in command],
        check=True,
        cwd=cwd,
        timeout=600,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory) -> Path:
    """The image's /opt/venv, made by the Dockerfile's own steps."""
    venv = tmp_path_factory.mktemp("image") / "venv"
    _run(sys.executable, "-m", "venv", venv)
    pip = venv / "bin" / "pip"
    _run(pip, "install", "-q", "--require-hashes", "--no-deps", "-r", LOCK)
    wheels = venv.parent / "wheels"
    _run(pip, "wheel", "-q", "--no-deps", "--wheel-dir", wheels, ROOT)
    _run(pip, "install", "-q", "--no-deps", *sorted(wheels.glob("*.whl")))
    return venv


def _image_env() -> dict[str, str]:
    env = {}
    for value in _values(_final_stage(), "ENV"):
        env.update(re.findall(r"(\S+?)=(\S+)", value))
    return env


@pytest.mark.timeout(900)
async def test_the_image_recipe_serves_the_example_server(image_venv, tmp_path):
    """The venv built as the image builds it runs ``mcp-sse-gateway serve`` with the image's
    environment (listening on loopback here instead of 0.0.0.0: tests stay on loopback) and
    carries a resumed tool call; ``mcp-sse-gateway healthcheck`` passes against it."""
    env = gateway_env(**{k: v for k, v in _image_env().items() if k.startswith(GATEWAY_ENV_PREFIX)})
    env.pop("PYTHONPATH", None)
    port = free_port()
    env["MCP_SSE_GATEWAY_SERVER__HOST"] = "127.0.0.1"
    env["MCP_SSE_GATEWAY_SERVER__PORT"] = str(port)
    binary = image_venv / "bin" / "mcp-sse-gateway"
    async with example_upstream() as upstream_url:
        env["MCP_SSE_GATEWAY_UPSTREAM__URL"] = upstream_url
        url = f"http://127.0.0.1:{port}/mcp"
        async with gateway_process(
            serve_command(program=[str(binary)]),
            env=env,
            ready_url=f"http://127.0.0.1:{port}/healthz",
            ready_timeout_s=30,
            cwd=tmp_path,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            stop_signal=signal.SIGTERM,
            stop_timeout_s=30,
        ):
            async with aiohttp.ClientSession() as http:
                headers = await open_session(http, url)
                call = await http.post(url, headers=headers, json=_call(5, 10))
                first, _ = await read_events(call, until=3)
                call.close()
                cursor = next(e.id for e in reversed(first[:3]) if e.id)
                resumed = await http.get(url, headers={**headers, "Last-Event-ID": cursor})
                rest, ended = await read_events(resumed)
                assert ended
            check = await asyncio.create_subprocess_exec(binary, "healthcheck", env=env)
            assert await asyncio.wait_for(check.wait(), 30) == 0
    messages = json_messages(first[:3] + rest)
    indexes = [m["params"]["data"]["index"] for m in messages if m.get("method")]
    assert indexes == list(range(5))
    assert messages[-1]["result"]["content"][0]["text"] == "sent 5 notifications"


def test_the_installed_wheel_carries_the_redis_scripts(image_venv, tmp_path):
    """The Lua scripts are package data: the image's install (not the checkout) finds them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = (
        "import mcp_sse_gateway.store.redis.lua as lua, json; "
        "print(json.dumps([lua.__file__, sorted(lua.sources())]))"
    )
    out = subprocess.run(
        [image_venv / "bin" / "python", "-c", probe],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    where, names = json.loads(out)
    assert str(image_venv) in where
    from mcp_sse_gateway.store.redis.lua import SCRIPT_NAMES

    assert names == sorted(SCRIPT_NAMES)
