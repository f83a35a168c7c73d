"""What `sbx doctor` reports: backends, the database, versions. Never raises for a backend."""

from __future__ import annotations

import os
import platform
import sqlite3
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from adapters import registry
from adapters.base import Capability
from core import settings
from core.db import Database, redact
from core.migrations import SCHEMA_HEAD


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


async def backend_report(name: str) -> dict[str, Any]:
    report: dict[str, Any] = {"name": name, "target": registry.target(name)}
    try:
        cls = registry.load_class(name)
    except Exception as exc:
        report.update(loaded=False, error=str(exc), reachable=False, credentials=False)
        return report
    adapter = cls()
    try:
        health = await adapter.health()
    finally:
        await adapter.close()
    report.update(
        loaded=True,
        test_double=cls.test_double,
        description=cls.description,
        capabilities=sorted(c.value for c in Capability if adapter.supports(c)),
        reachable=health.reachable,
        credentials=health.credentials,
        detail=health.detail,
    )
    return report


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
        "sdks": {dist: _version(dist) for dist in ("docker", "e2b", "modal")},
        "profile_path": os.environ.get("SBX_PROFILE_PATH", ""),
    }
