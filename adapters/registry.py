"""Finds adapters through the `sandboxer.adapters` entry-point group.

Names are listed from package metadata without importing anything, so `sbx ls` stays fast
and a broken or absent SDK only matters when its backend is used. Third-party packages
register the same way as the built-ins (docs/adapters.md). `SBX_ADAPTERS` (names separated
by commas) limits which adapters this process sees at all; it is read at each call, so a
process forked from `sbx server` follows its caller's environment.
"""

from __future__ import annotations

import os
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from sandboxer.adapters.base import Adapter, BackendUnavailable

GROUP = "sandboxer.adapters"
SELECT_ENV = "SBX_ADAPTERS"
BUILT_IN_DIST = "sandboxer"


@cache
def _scan() -> tuple[dict[str, EntryPoint], dict[str, list[EntryPoint]]]:
    """Every registered adapter, and the entry points that lost a name to another. A name
    registered twice keeps sbx's own (a plugin cannot replace a built-in), else the first."""
    chosen: dict[str, EntryPoint] = {}
    shadowed: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=GROUP):
        current = chosen.get(ep.name)
        if current is None:
            chosen[ep.name] = ep
            continue
        if _dist(ep) == BUILT_IN_DIST and _dist(current) != BUILT_IN_DIST:
            chosen[ep.name], ep = ep, current
        shadowed.setdefault(ep.name, []).append(ep)
    return chosen, shadowed


def _dist(ep: EntryPoint) -> str | None:
    return ep.dist.name if getattr(ep, "dist", None) is not None else None


def is_installed(name: str) -> bool:
    """Registered by an installed package, whether or not SBX_ADAPTERS leaves it out."""
    return name in _scan()[0]


def selection() -> list[str] | None:
    """The names `SBX_ADAPTERS` asks for, or None when it does not limit anything."""
    raw = os.environ.get(SELECT_ENV, "")
    wanted = [name.strip() for name in raw.split(",") if name.strip()]
    return wanted or None


def _entry_points() -> dict[str, EntryPoint]:
    registered = _scan()[0]
    wanted = selection()
    if wanted is None:
        return registered
    return {name: ep for name, ep in registered.items() if name in wanted}


def names() -> list[str]:
    """Registered adapter names (as limited by SBX_ADAPTERS), without importing them."""
    return sorted(_entry_points())


def is_registered(name: str) -> bool:
    return name in _entry_points()


def load_class(name: str) -> type[Adapter]:
    """Import one adapter. KeyError if no such adapter is registered; BackendUnavailable
    (exit 5) when SBX_ADAPTERS leaves it out or it cannot be imported."""
    if name not in _entry_points():
        if name in _scan()[0]:
            raise BackendUnavailable(f"backend {name!r} is not loaded: {SELECT_ENV}="
                                     f"{os.environ.get(SELECT_ENV, '')} leaves it out")
        raise KeyError(name)
    return _load(name)


@cache
def _load(name: str) -> type[Adapter]:
    ep = _scan()[0][name]
    try:
        cls = ep.load()
    except Exception as exc:  # an adapter's import failure is a report, never a crash
        raise BackendUnavailable(
            f"backend {name!r} cannot be loaded ({ep.value}): {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise BackendUnavailable(f"backend {name!r} ({ep.value}) is not an Adapter subclass")
    return cls


def target(name: str) -> str:
    return _scan()[0][name].value


def distribution(name: str) -> str | None:
    """The installed package that registers the adapter (None if unknown)."""
    return _dist(_scan()[0][name])


def shadowed() -> dict[str, list[str]]:
    """Names registered by more than one package: name -> the targets that were not used."""
    return {name: [f"{ep.value} ({_dist(ep) or 'unknown package'})" for ep in eps]
            for name, eps in _scan()[1].items()}


def unknown_selected() -> list[str]:
    """Names SBX_ADAPTERS asks for that no installed package registers."""
    return [name for name in selection() or [] if name not in _scan()[0]]
