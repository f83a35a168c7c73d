"""What `sbx doctor` reports: backends, the database, versions. Never raises for a backend."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import sqlite3
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from sandboxer.adapters import registry
from sandboxer.adapters.base import AdapterError, Capability, one_line
from sandboxer.core.rules import settings
from sandboxer.core.store.db import Database, redact
from sandboxer.core.store.migrations import SCHEMA_HEAD


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


async def backend_report(name: str, health_timeout_s: float = 20.0) -> dict[str, Any]:
    """One backend: loaded? reachable? A third-party adapter that fails to import, to start
    or to answer is reported here and never stops the others."""
    report: dict[str, Any] = {"name": name, "target": registry.target(name),
                              "package": registry.distribution(name)}
    try:
        cls = registry.load_class(name)
        adapter = cls()
    except Exception as exc:
        report.update(loaded=False, error=_one_line(exc), reachable=False, credentials=False)
        return report
    report.update(loaded=True, test_double=cls.test_double, description=cls.description)
    try:
        health = await asyncio.wait_for(adapter.health(), health_timeout_s)
        report["capabilities"] = sorted(c.value for c in Capability if adapter.supports(c))
        if health.reachable:
            report["isolation"] = await isolation_report(adapter, health_timeout_s)
    except Exception as exc:  # health() must never raise: say so, go on with the others
        why = (f"health() did not answer within {health_timeout_s:g}s"
               if isinstance(exc, TimeoutError) else f"health() raised {_one_line(exc)}")
        report.update(capabilities=[], reachable=False, credentials=False,
                      detail=f"broken adapter: {why}")
        return report
    finally:
        with contextlib.suppress(Exception):
            await adapter.close()
    report.update(reachable=health.reachable, credentials=health.credentials,
                  detail=health.detail)
    return report


async def isolation_report(adapter: Any, timeout_s: float) -> dict[str, dict[str, Any]]:
    """Each isolation level a profile may ask for (docs/security.md): available on this
    backend's engine, or the one line that makes it so."""
    levels: dict[str, dict[str, Any]] = {"container": {"available": True, "detail": "ok"}}
    if not adapter.supports(Capability.ISOLATION_GVISOR):
        levels["gvisor"] = {"available": False,
                            "detail": f"the {adapter.name} backend cannot run gVisor"}
        return levels
    try:
        await asyncio.wait_for(adapter.ensure_isolation("gvisor"), timeout_s)
        levels["gvisor"] = {"available": True, "detail": "ok"}
    except Exception as exc:  # BackendUnavailable names the fix (`make gvisor`)
        levels["gvisor"] = {"available": False, "detail": _one_line(exc)}
    return levels


def _one_line(exc: BaseException) -> str:
    text = one_line(exc)
    return text if isinstance(exc, AdapterError) and text else f"{type(exc).__name__}: {text}"


def adapters_report() -> dict[str, Any]:
    """How the adapter list was made: SBX_ADAPTERS, names it asks for that nothing
    registers, and names registered twice (the second package's adapter is not used)."""
    return {"selected": registry.selection(), "unknown": registry.unknown_selected(),
            "shadowed": registry.shadowed()}


def database_report(db: Database) -> dict[str, Any]:
    report: dict[str, Any] = {"url": redact(db.url), "dialect": db.dialect,
                              "schema_head": SCHEMA_HEAD}
    try:
        db.migrate()
        report["schema"] = db.schema_version()
        report["ok"] = report["schema"] == SCHEMA_HEAD
    except Exception as exc:
        report.update(ok=False, error=str(exc))
    if db.dialect == "sqlite" and db.engine.url.database:
        path = Path(db.engine.url.database)
        if path.exists():
            report["file_mode"] = oct(path.stat().st_mode & 0o777)
    return report


async def report(db: Database) -> dict[str, Any]:
    return {
        "sbx": _version("sandboxer"),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "home": str(settings.sbx_home()),
        "install": settings.install_id(),
        "database": database_report(db),
        "backends": [await backend_report(name) for name in registry.names()],
        "adapters": adapters_report(),
        "sdks": {dist: _version(dist) for dist in ("docker", "e2b", "modal")},
        "profile_path": os.pathsep.join(settings.profile_path()),
    }
