"""`sbx server` and its clients: the launchers (launcher.py, launcher.c), the server
(resident.py) and what its spare child prepares (prepared.py). docs/server.md has the
protocol. Empty on purpose: the launcher imports only built-in modules."""
