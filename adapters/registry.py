"""Finds adapters through the `sandboxer.adapters` entry-point group.

Names are listed from package metadata without importing anything, so `sbx ls` stays fast
and a broken or absent SDK only matters when its backend is used.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points

from adapters.base import Adapter, BackendUnavailable

GROUP = "sandboxer.adapters"


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def names() -> list[str]:
    """Registered adapter names, without importing them."""
    return sorted(_entry_points())


def is_registered(name: str) -> bool:
    return name in _entry_points()


@cache
def load_class(name: str) -> type[Adapter]:
    """Import one adapter. BackendUnavailable (exit 5) when it cannot be imported."""
    ep = _entry_points().get(name)
    if ep is None:
        raise KeyError(name)
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
    return _entry_points()[name].value
