"""The registry of targets: which proxies (and baselines) a benchmark run compares.

Modules are imported if present: ``direct`` and ``gateway`` always; ``nginx``, ``aiohttp_relay``
and ``mcp_persist`` (the baselines) when their files exist. A module that fails to import, or
whose ``available()`` gives a reason, is listed with that reason and skipped.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from bench.targets.base import Running, Target

__all__ = ["ORDER", "Running", "Target", "load_targets"]

#: Module names, in the order the tables list their targets.
MODULES = ("direct", "gateway", "nginx", "aiohttp_relay", "mcp_persist")
#: Target names, table order; the baselines the ratios are taken against come first after direct.
ORDER = ("direct", "nginx", "aiohttp-relay", "mcp-persist", "gateway-memory", "gateway-redis")
#: Targets answering GET + Last-Event-ID themselves, when the module does not say.
DEFAULT_RESUMABLE = frozenset({"gateway-memory", "gateway-redis", "mcp-persist"})


def _targets_of(module: ModuleType) -> list[Target]:
    default_name = module.__name__.rsplit(".", 1)[-1].replace("_", "-")
    variants = getattr(module, "TARGETS", None)
    descriptions = getattr(module, "DESCRIPTIONS", {})
    if variants is None:
        name = getattr(module, "NAME", default_name)
        variants = {name: (module.available, module.start)}
        descriptions = {
            name: getattr(module, "DESCRIPTION", (module.__doc__ or "").strip().split("\n")[0])
        }
    targets = []
    for name, (available, start) in variants.items():
        resumable = getattr(module, "RESUMABLE", name in DEFAULT_RESUMABLE)
        targets.append(
            Target(
                name=name,
                available=available,
                start=start,
                resumable=bool(resumable),
                description=descriptions.get(name, ""),
                events_stored=getattr(module, "events_stored", None),
            )
        )
    return targets


def load_targets() -> tuple[dict[str, Target], dict[str, str]]:
    """Every target that can run here, and the reasons the others cannot (by name)."""
    usable: dict[str, Target] = {}
    skipped: dict[str, str] = {}
    for module_name in MODULES:
        try:
            module = importlib.import_module(f"bench.targets.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"bench.targets.{module_name}":
                skipped[module_name.replace("_", "-")] = "not written yet (no module)"
                continue
            skipped[module_name.replace("_", "-")] = f"import failed: {exc}"
            continue
        except Exception as exc:
            skipped[module_name.replace("_", "-")] = f"import failed: {type(exc).__name__}: {exc}"
            continue
        for target in _targets_of(module):
            try:
                reason = target.available()
            except Exception as exc:
                reason = f"available() failed: {type(exc).__name__}: {exc}"
            if reason is None:
                usable[target.name] = target
            else:
                skipped[target.name] = reason
    return usable, skipped


def sort_names(names: list[str]) -> list[str]:
    """*names* in table order (known targets first, the rest alphabetically)."""
    rank = {name: index for index, name in enumerate(ORDER)}
    return sorted(names, key=lambda name: (rank.get(name, len(ORDER)), name))
