"""`sbx db copy` carries every table the schema has: a table added without joining
`dbcopy.TABLES` would be dropped silently by a move to PostgreSQL (docs/cli.md, `sbx db copy`)."""

from sqlmodel import SQLModel

import sandboxer.core.store.models  # noqa: F401 (the tables register themselves)
from sandboxer.core.store.dbcopy import TABLES


def test_db_copy_names_every_table_of_the_schema() -> None:
    assert set(TABLES) == set(SQLModel.metadata.tables), (
        "tables db copy leaves out: " + ", ".join(sorted(set(SQLModel.metadata.tables) - set(TABLES))))
