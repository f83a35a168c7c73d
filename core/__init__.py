"""The engine of sbx, installed as `sandboxer.core` and reached through the library.

Rooms, each importing only those below it (import-linter contracts in pyproject.toml):
reconcile > pools | follow > lifecycle > observe > store > rules.
Imports no UI, CLI or backend SDK."""
