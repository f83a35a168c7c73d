"""Alembic migrations. `SCHEMA_HEAD` lets a start-up skip importing Alembic when the
schema is current; a unit test keeps it equal to Alembic's own head."""

from __future__ import annotations

from pathlib import Path

SCHEMA_HEAD = "0018"
SCRIPT_LOCATION = Path(__file__).parent


def alembic_config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    return config


def upgrade(connection, revision: str = "head") -> None:
    from alembic import command

    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def script_head() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()
