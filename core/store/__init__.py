"""The store: the database, its tables and migrations, the event log and its anchor, the
reads of the inventory, tenants, references, API keys."""
