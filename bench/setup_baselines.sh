#!/usr/bin/env bash
# Installs what the benchmark's baseline targets need; safe to run again (it skips what is there).
#
#   - nginx (Debian's nginx-light, or nginx where light is not packaged) and redis-server, via
#     apt-get: bench/targets/nginx.py runs the nginx binary with a config of its own, never the
#     system service; bench/targets/mcp_persist.py starts a private redis-server.
#   - bench/.venv-peer: a separate virtualenv holding mcp-persist (the peer proxy) at the exact
#     version the baseline was tested with, so its dependencies never touch the project's .venv.
#
# Usage: bash bench/setup_baselines.sh   (as root, or with passwordless sudo; PYTHON=... picks the
# interpreter the peer venv is made from, default python3)
set -euo pipefail

MCP_PERSIST_VERSION="2.2.0"
# The rest of the tested set: pinned so a rerun measures the same peer.
# httptools: uvicorn's C HTTP parser (the "uvicorn[standard]" one), so the peer does not pay for
# pure-Python h11 where the gateway (aiohttp) parses HTTP in C. uvloop is left out on purpose: the
# gateway runs on the stock asyncio loop, and so does the peer (see bench/targets/mcp_persist.py).
PEER_PINS=(
    "mcp-persist[redis]==${MCP_PERSIST_VERSION}"
    "mcp==2.3.0"
    "mcp-types==2.3.0"
    "httpx2==2.16.2"
    "httpcore2==2.16.2"
    "redis==8.1.0"
    "uvicorn==0.54.0"
    "starlette==1.10.0"
    "pydantic==2.14.4"
    "httptools==0.9.0"
)

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PEER_VENV="${BENCH_DIR}/.venv-peer"

if [[ "$(id -u)" -eq 0 ]]; then
    SUDO=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    SUDO=(false)  # as_root fails with a message below
fi

as_root() {
    if [[ "${SUDO[0]:-}" == "false" ]]; then
        echo "setup_baselines: need root or passwordless sudo for: $*" >&2
        return 1
    fi
    "${SUDO[@]}" "$@"
}

APT_UPDATED=0
apt_install() {
    if [[ "${APT_UPDATED}" -eq 0 ]]; then
        as_root apt-get update -qq
        APT_UPDATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# --- nginx --------------------------------------------------------------------------------------
if command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]]; then
    echo "setup_baselines: nginx already installed: $( (/usr/sbin/nginx -v || nginx -v) 2>&1)"
else
    as_root apt-get update -qq
    APT_UPDATED=1
    if apt-cache show nginx-light >/dev/null 2>&1; then
        apt_install nginx-light
    else
        apt_install nginx
    fi
    echo "setup_baselines: installed $(/usr/sbin/nginx -v 2>&1)"
fi

# --- redis-server -------------------------------------------------------------------------------
if command -v redis-server >/dev/null; then
    echo "setup_baselines: redis-server already installed: $(redis-server --version | cut -d' ' -f1-3)"
else
    apt_install redis-server
    echo "setup_baselines: installed $(redis-server --version | cut -d' ' -f1-3)"
fi

# --- mcp-persist in its own venv ----------------------------------------------------------------
installed_version() {
    "${PEER_VENV}/bin/python" -c \
        'import importlib.metadata as m; print(m.version("mcp-persist"))' 2>/dev/null || true
}

# True when the venv holds every pinned distribution at its pinned version.
pins_satisfied() {
    [[ -x "${PEER_VENV}/bin/python" ]] || return 1
    "${PEER_VENV}/bin/python" - "${PEER_PINS[@]}" <<'PY' 2>/dev/null
import importlib.metadata as m
import re
import sys

for pin in sys.argv[1:]:
    name, version = pin.split("==")
    name = re.sub(r"\[.*\]", "", name)
    if m.version(name) != version:
        sys.exit(1)
PY
}

if pins_satisfied; then
    echo "setup_baselines: ${PEER_VENV} already has mcp-persist $(installed_version) and its pins"
else
    PYTHON="${PYTHON:-python3}"
    if [[ ! -x "${PEER_VENV}/bin/python" ]]; then
        "${PYTHON}" -m venv "${PEER_VENV}"
    fi
    "${PEER_VENV}/bin/python" -m pip install -q --disable-pip-version-check "${PEER_PINS[@]}"
    echo "setup_baselines: installed mcp-persist $(installed_version) into ${PEER_VENV}"
fi
"${PEER_VENV}/bin/python" -c 'import mcp_persist.proxy, redis.asyncio, uvicorn' \
    || { echo "setup_baselines: the peer venv cannot import mcp-persist's proxy" >&2; exit 1; }
echo "setup_baselines: done"
