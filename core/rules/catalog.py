"""Every event type and reason sbx writes, in one place (docs/events.md catalogues them).

They are string enums: the event log stores the plain value, and a webhook consumer reads the
same words. A test checks that the code writes no other type and that docs/events.md lists
each one.
"""

from __future__ import annotations

import enum


class EventType(enum.StrEnum):
    # a sandbox's life (the transitions of core/rules/states.py)
    SANDBOX_CREATING = "sandbox.creating"
    SANDBOX_CREATED = "sandbox.created"
    SANDBOX_FAILED = "sandbox.failed"
    SANDBOX_PAUSED = "sandbox.paused"
    SANDBOX_RESUMED = "sandbox.resumed"
    SANDBOX_DESTROYING = "sandbox.destroying"
    SANDBOX_DESTROYED = "sandbox.destroyed"
    SANDBOX_LOST = "sandbox.lost"
    SANDBOX_ADOPTED = "sandbox.adopted"
    SANDBOX_RESTARTED = "sandbox.restarted"  # the backend started it again (an engine restart)
    SANDBOX_WARMED = "sandbox.warmed"  # a pool member is made and waits to be claimed
    SANDBOX_CLAIMED = "sandbox.claimed"  # a create took a warm pool member
    # what happens to a sandbox without changing its state
    SANDBOX_EXEC = "sandbox.exec"
    SANDBOX_FILE = "sandbox.file"  # a file or tree in or out, a remove, mkdir or rename
    SANDBOX_EXTENDED = "sandbox.extended"
    SANDBOX_TOUCHED = "sandbox.touched"
    SANDBOX_PORT_LINK = "sandbox.port.link"  # a preview link handed out (never the link)
    SANDBOX_EXPIRING = "sandbox.expiring"
    SANDBOX_ATTEMPT_FAILED = "sandbox.attempt-failed"
    SANDBOX_ORPHAN_DESTROYED = "sandbox.orphan-destroyed"
    # background processes (core/lifecycle/processes.py): started, and its end once observed
    SANDBOX_PROCESS_STARTED = "sandbox.process.started"
    SANDBOX_PROCESS_EXITED = "sandbox.process.exited"
    # a port made reachable while it runs (core/lifecycle/ports.py, `expose`)
    SANDBOX_PORT = "sandbox.port"
    # terminals (core/lifecycle/terminals.py): opened, and ended (never keystrokes nor output)
    SANDBOX_PTY_OPENED = "sandbox.pty.opened"
    SANDBOX_PTY_CLOSED = "sandbox.pty.closed"
    # checkpoints
    CHECKPOINT_CREATING = "checkpoint.creating"
    CHECKPOINT_CREATED = "checkpoint.created"
    CHECKPOINT_FAILED = "checkpoint.failed"
    CHECKPOINT_REMOVED = "checkpoint.removed"
    CHECKPOINT_IMPORTED = "checkpoint.imported"
    CHECKPOINT_ORPHAN_REMOVED = "checkpoint.orphan-removed"
    CHECKPOINT_LOST = "checkpoint.lost"  # its artifact is gone from the backend
    # volumes (core/lifecycle/volumes.py): made, removed (by hand or its TTL), and each mount
    # by a sandbox (the sandbox's id; the volume's id and name in the payload)
    VOLUME_CREATED = "volume.created"
    VOLUME_REMOVED = "volume.removed"
    VOLUME_MOUNTED = "volume.mounted"
    VOLUME_FILE = "volume.file"  # a tree into or out of a volume without a sandbox
    # warm pools (about a profile's pool, not one sandbox)
    POOL_RESIZED = "pool.resized"
    POOL_DRAINED = "pool.drained"
    # the service's keys (an admin acts), with the owner's quotas when a create set them
    APIKEY_CREATED = "apikey.created"
    APIKEY_REVOKED = "apikey.revoked"
    # an MCP tool call that records no event of its own (a listing, a look at a process), so
    # that every call an agent makes is in the log (docs/mcp.md)
    MCP_CALL = "mcp.call"


class Reason(enum.StrEnum):
    """Why an event happened, where it is not simply "someone asked"."""

    MANUAL = "manual"  # a person or a program asked (a CLI command, an API call)
    TTL = "ttl"  # the deadline passed
    IDLE = "idle"  # the idle limit passed
    MAX_TTL = "max-ttl"  # the hard deadline passed
    ORPHAN = "orphan"  # a backend object of this installation that no row claimed
    FAILED = "failed"  # cleaning up after a failed create or setup
    RETENTION = "retention"  # a checkpoint past its profile's `keep`
    RESTARTED = "restarted"  # the backend brought it back after its engine restarted
    STOPPED = "stopped"  # lost: its backend object stopped, and nothing started it again
    GONE = "gone"  # lost: its backend object is no longer there
    # a warm pool member retired (core/pools/__init__.py)
    MAX_AGE = "max-age"  # older than its pool's max_age
    POOL_DRAINED = "pool-drained"  # `sbx pool drain`
    POOL_SHRUNK = "pool-shrunk"  # its pool holds more members than its size
    POOL_CHANGED = "pool-changed"  # its profile changed since it was made: it fits no create
    POOL_REMOVED = "pool-removed"  # its profile is gone, or declares no pool any more
