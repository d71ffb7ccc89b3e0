"""Settings: sources and their precedence, validation messages, redaction, the CLI's exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_sse_gateway.cli import main
from mcp_sse_gateway.config import DEFAULT_RETRY_MS, load_settings, redact_url
from mcp_sse_gateway.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path


def test_defaults_match_the_design_table():
    settings = load_settings()
    assert settings.sse.retry_ms == DEFAULT_RETRY_MS == 1000
    assert settings.sse.poll_after_ms is None
    assert settings.sse.keepalive_s == 15
    assert settings.store.backend == "memory"
    assert settings.store.max_events_per_stream == 10_000
    assert settings.store.finished_stream_ttl_s == 300
    assert settings.store.session_idle_ttl_s == 3600
    assert settings.store.max_streams_per_session == 100
    assert settings.store.max_event_bytes == 16 * 1024 * 1024
    assert settings.server.max_body_bytes == 16 * 1024 * 1024
    assert settings.store.memory_max_bytes == 256 * 1024 * 1024
    assert (settings.store.heartbeat_s, settings.store.heartbeat_expiry_s) == (5, 15)
    assert settings.server.drain_timeout_s == 60
    assert settings.upstream.connect_timeout_s == 10
    assert settings.upstream.headers_timeout_s == 300
    assert (settings.store.replay_batch_events, settings.store.replay_max_passes) == (1000, 16)
    assert settings.sse.slow_reader_cut_s == 10
    assert settings.upstream.max_connections == 0


def test_flags_over_environment_over_file(tmp_path, monkeypatch):
    path = _toml(
        tmp_path,
        '[upstream]\nurl = "http://127.0.0.1:1/mcp"\n[server]\nport = 1000\nhost = "::1"\n'
        "[sse]\nretry_ms = 5\n",
    )
    monkeypatch.setenv("MCP_SSE_GATEWAY_SERVER__PORT", "2000")
    monkeypatch.setenv("MCP_SSE_GATEWAY_SSE__POLL_AFTER_MS", "0")
    settings = load_settings(path, {"server": {"port": 3000}})
    assert settings.server.port == 3000
    assert settings.server.host == "::1"
    assert settings.sse.retry_ms == 5
    assert settings.sse.poll_after_ms == 0
    assert load_settings(path).server.port == 2000
    monkeypatch.setenv("MCP_SSE_GATEWAY_CONFIG", str(path))
    assert str(load_settings().upstream.url) == "http://127.0.0.1:1/mcp"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[server]\nport = 70000\n", "server.port"),
        ("[sse]\nretry_ms = -1\n", "sse.retry_ms"),
        ('[upstream]\nurl = "ftp://x"\n', "upstream.url"),
        ('[store]\nbackend = "redis"\n', "store"),
        ('[store]\nredis_url = "http://x"\n', "store.redis_url"),
        ("[server]\nbogus = 1\n", "server.bogus"),
        ('[server]\ntrusted_proxies = ["10.0.0.0/33"]\n', "server.trusted_proxies"),
        ('[server]\npath = "mcp"\n', "server.path"),
    ],
)
def test_invalid_values_name_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as caught:
        load_settings(_toml(tmp_path, text))
    assert key in str(caught.value)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(_toml(tmp_path, "[server\n"))


def test_secrets_are_redacted(tmp_path, capsys):
    path = _toml(
        tmp_path,
        '[upstream]\nurl = "http://127.0.0.1:1/mcp"\n'
        '[store]\nredis_url = "rediss://user:hunter2@redis:6380/0"\n',
    )
    assert main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out
    # The host shows (which Redis is configured can be checked); the password does not.
    assert json.loads(out)["store"]["redis_url"] == "rediss://user:***@redis:6380/0"
    assert "hunter2" not in repr(load_settings(path))


def test_cli_exit_code_2_on_invalid_config(tmp_path, capsys):
    assert main(["serve", "--config", str(_toml(tmp_path, "[server]\nport = -1\n"))]) == 2
    assert "server.port" in capsys.readouterr().err
    assert main(["serve"]) == 2
    assert "upstream.url" in capsys.readouterr().err


def test_example_config_is_valid_and_documents_every_key():
    settings = load_settings(EXAMPLE)
    text = EXAMPLE.read_text()
    for section, values in settings.model_dump().items():
        assert f"[{section}]" in text, section
        for key in values:
            assert f"{key} =" in text or f"# {key} =" in text, f"{section}.{key}"


def test_upstream_credentials_are_redacted(capsys):
    url = "http://127.0.0.1:3000/mcp?api_key=abc&flag"
    assert main(["check-config", "--upstream", url]) == 0
    out = capsys.readouterr().out
    assert "abc" not in out
    assert json.loads(out)["upstream"]["url"] == "http://127.0.0.1:3000/mcp?api_key=***&***"


def test_upstream_url_with_userinfo_is_refused(capsys):
    url = "http://user:hunter2@127.0.0.1:3000/mcp"
    assert main(["check-config", "--upstream", url]) == 2
    err = capsys.readouterr().err
    assert "upstream.url" in err
    assert "credentials" in err
    assert "hunter2" not in err


def test_non_json_list_in_environment_names_the_fix(monkeypatch):
    monkeypatch.setenv("MCP_SSE_GATEWAY_SERVER__ALLOWED_HOSTS", "mcp.example.com")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "ALLOWED_HOSTS" in str(caught.value)
    assert "JSON" in str(caught.value)
    assert "config file" not in str(caught.value)


def test_a_variable_of_no_section_is_warned_about(monkeypatch, capsys):
    # A misspelt section would be ignored by the settings without a word.
    monkeypatch.setenv("MCP_SSE_GATEWAY_SERVERS__PORT", "9999")
    # Kubernetes' service links for a Service named mcp-sse-gateway are not ours to report.
    for name, value in [
        ("MCP_SSE_GATEWAY_SERVICE_HOST", "10.0.0.1"),
        ("MCP_SSE_GATEWAY_SERVICE_PORT", "8080"),
        ("MCP_SSE_GATEWAY_SERVICE_PORT_HTTP", "8080"),
        ("MCP_SSE_GATEWAY_PORT", "tcp://10.0.0.1:8080"),
        ("MCP_SSE_GATEWAY_PORT_8080_TCP_ADDR", "10.0.0.1"),
    ]:
        monkeypatch.setenv(name, value)
    assert main(["check-config", "--upstream", "http://127.0.0.1:1/mcp"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1
    assert "MCP_SSE_GATEWAY_SERVERS__PORT" in warnings[0]
    assert "9999" not in captured.err
    assert json.loads(captured.out)["server"]["port"] != 9999


def test_check_config_into_a_closed_pipe_exits_without_a_traceback():
    # `check-config | head -1`: the reader is gone before the settings are written (a pipe
    # whose read end is closed before the command starts).
    read_end, write_end = os.pipe()
    os.close(read_end)
    command = [sys.executable, "-m", "mcp_sse_gateway", "check-config"]
    command += ["--upstream", "http://127.0.0.1:1/mcp"]
    try:
        done = subprocess.run(
            command,
            stdout=write_end,
            capture_output=False,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 1
    assert b"Traceback" not in done.stderr
    assert b"BrokenPipeError" not in done.stderr


def test_check_config_refuses_what_serve_refuses(capsys):
    assert main(["check-config"]) == 2
    assert "upstream.url" in capsys.readouterr().err


def test_one_redaction_for_upstream_and_redis_urls():
    assert redact_url("redis://app:p%40ss@h:6379/0") == "redis://app:***@h:6379/0"
    assert redact_url("rediss://:pw@h/1?ssl_ca_certs=/ca.pem&ssl_password=k") == (
        "rediss://:***@h/1?ssl_ca_certs=***&ssl_password=***"
    )
    assert redact_url("redis://h:6379") == "redis://h:6379"
    assert redact_url("unix:///run/redis.sock?db=2") == "unix:///run/redis.sock?db=***"
    assert redact_url("https://u:t0k@[::1]:8443/mcp?key=abc&bare#frag") == (
        "https://u:***@[::1]:8443/mcp?key=***&***"
    )
    assert redact_url("redis://:@h:1/0") == "redis://:***@h:1/0"  # an empty password
    assert redact_url("http://[::1/broken") == "***"


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[store]\nstall_timeout_s = inf\n", "store.stall_timeout_s"),
        ("[store]\nstall_timeout_s = nan\n", "store.stall_timeout_s"),
        ("[store]\nstall_timeout_s = 0.01\n", "store.stall_timeout_s"),
        ("[store]\nmax_queued_calls = 0\n", "store.max_queued_calls"),
        ("[sse]\nkeepalive_s = inf\n", "sse.keepalive_s"),
    ],
)
def test_store_queue_settings_are_finite_and_sane(tmp_path, toml, key):
    path = tmp_path / "gateway.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(path)
