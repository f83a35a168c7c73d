"""The asyncio core of sbx: state, profiles, lifecycle. Imports no UI, CLI or backend SDK."""
