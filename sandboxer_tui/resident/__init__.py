"""`sbx server`: the resident server (resident.py), which runs each command in a forked
child that has the libraries imported, and the `sbx` entry point that hands commands to it
(launcher.py). docs/server.md has the protocol. Empty on purpose: the launcher imports only
built-in modules."""
