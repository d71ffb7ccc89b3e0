"""deploy/: compose, HAProxy and Kubernetes files, validated offline (no engine, no cluster).

Kubernetes manifests against the API schemas (kubernetes-validate, strict), the HAProxy file
with ``haproxy -c``, every gateway configuration with the gateway's own settings loader, and
the invariants an operator relies on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mcp_sse_gateway.config import DEFAULT_KEEPALIVE_S, load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose"
K8S_VERSION = "1.30.0"


def _manifests() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        document = yaml.safe_load(path.read_text())
        found[document["kind"]] = document
    return found


@pytest.mark.parametrize(
    "path", sorted(p for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")
)
def test_manifest_is_valid_against_the_api_schema(path):
    document = yaml.safe_load(path.read_text())
    kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest_but_the_secret_example():
    listed = set(yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["resources"])
    files = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == files - {"secret.example.yaml"}


def _container() -> dict[str, Any]:
    return _manifests()["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def _deployment_env(placeholders: dict[str, str]) -> dict[str, str]:
    env = {}
    for item in _container()["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = placeholders[item["valueFrom"]["secretKeyRef"]["key"]]
    return env


def _configmap_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    config = tmp_path / "config.toml"
    config.write_text(_manifests()["ConfigMap"]["data"]["config.toml"])
    secret = _manifests()["Secret"]["stringData"]
    for name, value in _deployment_env(secret).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MCP_SSE_GATEWAY_CONFIG")
    return load_settings(config)


def test_configmap_is_valid_for_a_cluster(tmp_path, monkeypatch):
    settings = _configmap_settings(tmp_path, monkeypatch)
    assert settings.server.host == "0.0.0.0"
    assert settings.store.backend == "redis"
    service = _manifests()["Service"]["metadata"]["name"]
    assert service in settings.server.allowed_hosts
    assert f"{service}.default.svc.cluster.local" in settings.server.allowed_hosts
    assert settings.server.trusted_proxies
    assert settings.auth.resume == "upstream"
    assert settings.sse.poll_after_ms == 30000
    # Every section of the file is one the settings know (unknown keys inside are refused
    # by the loader; an unknown section would be ignored silently).
    sections = tomllib.loads(_manifests()["ConfigMap"]["data"]["config.toml"])
    assert set(sections) <= set(type(settings).model_fields)


def test_deployment_probes_drain_and_hardening(tmp_path, monkeypatch):
    deployment = _manifests()["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = _container()
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    drain_s = _configmap_settings(tmp_path, monkeypatch).server.drain_timeout_s
    assert pod["terminationGracePeriodSeconds"] > int(pause[1]) + drain_s
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]
    secrets = {
        item["valueFrom"]["secretKeyRef"]["key"] for item in container["env"] if "valueFrom" in item
    }
    assert secrets == {"redis-url", "digest-key"}  # never in the ConfigMap
    strategy = deployment["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0


def test_service_and_budget_select_the_deployment():
    manifests = _manifests()
    labels = manifests["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget"):
        spec = manifests[kind]["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert selector.items() <= labels.items(), kind
    port_names = {p["name"] for p in _container()["ports"]}
    assert manifests["Service"]["spec"]["ports"][0]["targetPort"] in port_names
    hpa = manifests["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == manifests["Deployment"]["metadata"]["name"]


def _compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())


def test_compose_gateways_are_valid_replicas_on_redis(monkeypatch):
    services = _compose()["services"]
    gateways = [name for name in services if name.startswith("gateway")]
    assert len(gateways) == 3
    for name in gateways:
        environment = dict(services[name]["environment"])
        environment["MCP_SSE_GATEWAY_AUTH__DIGEST_KEY"] = "a-test-secret-of-32-characters!!"
        for key in list(os.environ):
            if key.startswith("MCP_SSE_GATEWAY_"):
                monkeypatch.delenv(key)
        for key, value in environment.items():
            monkeypatch.setenv(key, str(value))
        settings = load_settings()
        assert settings.store.backend == "redis"
        assert "lb" in settings.server.allowed_hosts
        assert settings.sse.poll_after_ms == 30000
        assert settings.server.trusted_proxies == ("172.31.240.0/24",)
        subnet = _compose()["networks"]["default"]["ipam"]["config"][0]["subnet"]
        assert settings.server.trusted_proxies == (subnet,)
        for key in environment:  # every variable names a known section
            section = key.removeprefix("MCP_SSE_GATEWAY_").split("__")[0].lower()
            assert section in type(settings).model_fields, key
        assert services[name]["stop_grace_period"] == "75s"
    assert "--save" in services["redis"]["command"]
    lb = services["lb"]
    assert any("haproxy.cfg" in volume for volume in lb["volumes"])
    for index in (1, 2, 3):
        assert lb["environment"][f"GATEWAY{index}"] == f"gateway{index}:8080"


def _haproxy_cfg() -> str:
    return (COMPOSE / "haproxy.cfg").read_text()


def test_haproxy_settings_are_sse_safe():
    cfg = _haproxy_cfg()
    lines = [line.split("#")[0].strip() for line in cfg.splitlines()]
    directives = [line for line in lines if line]
    assert "balance roundrobin" in directives
    assert not [d for d in directives if d.startswith(("compression", "cookie", "stick"))]
    assert "http-check send meth GET uri /readyz" in directives
    for name in ("client", "server"):
        timeout = next(d for d in directives if d.startswith(f"timeout {name} "))
        seconds = int(re.search(r"(\d+)s", timeout).group(1))
        assert seconds > 4 * DEFAULT_KEEPALIVE_S, timeout


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not installed")
def test_haproxy_accepts_the_shipped_file():
    env = {
        **os.environ,
        "LB_BIND": "127.0.0.1:18080",
        "GATEWAY1": "127.0.0.1:1",
        "GATEWAY2": "127.0.0.1:2",
        "GATEWAY3": "127.0.0.1:3",
    }
    result = subprocess.run(
        ["haproxy", "-c", "-f", str(COMPOSE / "haproxy.cfg")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
