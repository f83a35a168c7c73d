"""Every setting sbx reads, in one place: where it keeps its state, who is acting, the store,
the timers, delivery and the service client. Read from the environment (and the settings file)
at use, so a test or a library client changes them without a restart.

Plain functions rather than a pydantic-settings model: `sbx ls` and `sbx reap` load no
pydantic at all, and pydantic-settings would add about 100 ms to every such start. Adapters
read their own variables (SBX_SSH_*, SBX_DOCKER_ALLOW_PLAINTEXT, SBX_ADAPTERS, SBX_FAILPOINT) where they use
them (they do not import the core); the `sbx` launcher reads SBX_HOME, SBX_NO_SERVER,
SBX_URL and the autostart ones with built-in modules only. docs/cli.md lists them all."""

from __future__ import annotations

import functools
import getpass
import os
import socket
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxer.adapters.base import APP_NAME, open_state_file, state_folder

if TYPE_CHECKING:
    import re


def sbx_home() -> Path:
    """`$SBX_HOME`, else the platform's user data folder; created 0700. The rule lives in
    sandboxer.adapters.base, where the adapters (which do not import the core) find it too."""
    return state_folder()


def user_config_dir() -> Path:
    from platformdirs import user_config_path

    return user_config_path(APP_NAME)


def settings_file() -> Path:
    return user_config_dir() / "settings.toml"


def read_settings_file() -> dict:
    """The settings file's tables ({} when there is none); BadInput naming it when invalid."""
    import tomllib

    from sandboxer.core.rules.errors import BadInput

    path = settings_file()
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"{path}: invalid settings: {exc}") from None


def database_url() -> str:
    """`$SBX_DATABASE_URL`, else `[database] url` of the settings file, else SQLite in
    SBX_HOME."""
    if os.environ.get("SBX_DATABASE_URL"):
        return os.environ["SBX_DATABASE_URL"]
    section = read_settings_file().get("database", {})
    url = section.get("url") if isinstance(section, dict) else None
    if url is not None:
        if not isinstance(url, str) or not url:
            from sandboxer.core.rules.errors import BadInput

            raise BadInput(f"{settings_file()}: database.url: must be a database URL string")
        return url
    return f"sqlite:///{sbx_home() / 'sbx.db'}"


def install_id() -> str:
    """This installation's id, kept beside (not inside) the database.

    Backend objects carry it as `sbx.install`, so `sbx reap --orphans` still recognises
    them when the database is lost. A link planted at the file is refused, not followed.
    """
    path = sbx_home() / "install-id"
    found = _read_install_id(path)
    if found is not None:
        return found
    from ulid import ULID

    new = f"inst-{str(ULID()).lower()}"
    tmp = path.with_name(f".install-id.{os.getpid()}.{os.urandom(4).hex()}")
    fd = open_state_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(new)
        os.link(tmp, path)  # atomic: of two first runs, one id wins and both read it
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    found = _read_install_id(path)
    if found is None:
        raise FileNotFoundError(f"{path} vanished as it was written")
    return found


def _read_install_id(path: Path) -> str | None:
    try:
        fd = open_state_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as file:
        return file.read().strip()


def _printable(variable: str, value: str, most: int) -> str:
    """A name from the environment that the records keep: printable, at most `most`
    characters (the column's width), else BadInput naming the variable."""
    if len(value) > most or not value.isprintable():
        from sandboxer.core.rules.errors import BadInput

        raise BadInput(f"bad {variable} {value[:80]!r}: printable text of at most {most} "
                       "characters")
    return value


def host_name() -> str:
    """This machine's name as fleets show it: `$SBX_HOST_NAME`, else the hostname."""
    return _printable("SBX_HOST_NAME", os.environ.get("SBX_HOST_NAME") or socket.gethostname(),
                      255)


# Who acts in the operation running in this context (sandboxer's `acting_as` sets it): many
# callers share one Manager in a service, and each asyncio task keeps its own value.
ACTING_AS: ContextVar[str | None] = ContextVar("sbx_acting_as", default=None)
# Whose records the operation running in this context may see and touch (core/store/tenancy.py):
# a service request made with a read or write key sets it to the key's owner; None sees all.
TENANT: ContextVar[str | None] = ContextVar("sbx_tenant", default=None)


def actor() -> str:
    """Who is acting: `$SBX_ACTOR`, else user@host."""
    raw = os.environ.get("SBX_ACTOR")
    if raw:
        from sandboxer.core.rules.ids import MAX_OWNER

        return _printable("SBX_ACTOR", raw, MAX_OWNER)  # it is the owner unless one is given
    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _duration_env(name: str, default: str):
    from sandboxer.core.rules.durations import parse_duration

    return parse_duration(os.environ.get(name) or default, name)


def lease_ttl():
    """How long a lease holds before another process may take over (`SBX_LEASE_TTL`)."""
    return _duration_env("SBX_LEASE_TTL", "2m")


def expiry_warning():
    """How long before its deadline a sandbox gets `sandbox.expiring` (`SBX_EXPIRY_WARNING`)."""
    return _duration_env("SBX_EXPIRY_WARNING", "5m")


def reconcile_grace():
    """Backend objects younger than this are left alone by reconcile (`SBX_RECONCILE_GRACE`)."""
    return _duration_env("SBX_RECONCILE_GRACE", "60s")


def reconcile_every():
    """How often a reap cycle looks at everything (`SBX_RECONCILE_EVERY`); in between, a
    cycle that finds nothing changed since the last full look reads only what is due."""
    return _duration_env("SBX_RECONCILE_EVERY", "1m")


def metrics_every():
    """At most one stored metric sample per sandbox per this long (`SBX_METRICS_EVERY`)."""
    return _duration_env("SBX_METRICS_EVERY", "5s")


def metrics_retention():
    """Stored samples older than this are dropped (`SBX_METRICS_RETENTION`)."""
    return _duration_env("SBX_METRICS_RETENTION", "7d")


def mask_patterns() -> list[re.Pattern[str]]:
    """`[events] mask` of the settings file: regular expressions whose matches in an exec's
    argv are masked before the event is written. BadInput naming a pattern that does not
    compile, or that matches the empty text (it would mask between every character).
    Read again whenever the file changes (every exec asks)."""
    path = settings_file()
    try:
        st = path.stat()
        version = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        version = None
    return list(_mask_patterns_of(str(path), version))


@functools.lru_cache(maxsize=1)
def _mask_patterns_of(path: str, version: tuple[int, ...] | None) -> tuple[re.Pattern[str], ...]:
    """The patterns of the settings file at `path` as it is in `version` (a refusal is
    raised, and so not kept)."""
    return tuple(_read_mask_patterns())


def _read_mask_patterns() -> list[re.Pattern[str]]:
    import re

    from sandboxer.core.rules.errors import BadInput

    section = read_settings_file().get("events", {})
    if not isinstance(section, dict):
        raise BadInput(f"{settings_file()}: events: must be a table")
    raw = section.get("mask", [])
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise BadInput(f"{settings_file()}: events.mask: must be a list of regular expressions")
    patterns = []
    for text in raw:
        try:
            pattern = re.compile(text)
        except re.error as exc:
            raise BadInput(f"{settings_file()}: events.mask: {text!r} is not a valid regular "
                           f"expression ({exc})") from None
        if pattern.search(""):
            raise BadInput(f"{settings_file()}: events.mask: {text!r} matches the empty text")
        patterns.append(pattern)
    return patterns


def _size_env(name: str, default: str) -> int:
    from pydantic import ByteSize, TypeAdapter, ValidationError

    raw = os.environ.get(name) or default
    try:
        size = int(TypeAdapter(ByteSize).validate_python(raw.strip()))
    except ValidationError:
        size = 0
    if size <= 0:
        from sandboxer.core.rules.errors import BadInput

        raise BadInput(f"{name}: bad size {raw!r}: use bytes or a unit, e.g. 512MiB or 8GiB")
    return size


def import_max_manifest() -> int:
    """The largest manifest a checkpoint archive may hold (`SBX_IMPORT_MAX_MANIFEST`, 1MiB)."""
    return _size_env("SBX_IMPORT_MAX_MANIFEST", "1MiB")


def import_max_artifact() -> int:
    """The largest artifact (image archive) a checkpoint archive may hold
    (`SBX_IMPORT_MAX_ARTIFACT`, 8GiB)."""
    return _size_env("SBX_IMPORT_MAX_ARTIFACT", "8GiB")


def tree_max_bytes() -> int:
    """The most a tree downloaded from a sandbox may unpack, its files' bytes in all, held
    while it is read (`SBX_TREE_MAX_BYTES`, 10GiB; docs/security.md)."""
    return _size_env("SBX_TREE_MAX_BYTES", "10GiB")


def tree_max_entries() -> int:
    """The most entries a tree downloaded from a sandbox may hold (`SBX_TREE_MAX_ENTRIES`,
    1000000; docs/security.md)."""
    return _count_env("SBX_TREE_MAX_ENTRIES", 1_000_000)


def list_max_entries() -> int:
    """The most entries `files.list` returns; a listing with more is refused, saying so
    (`SBX_LIST_MAX_ENTRIES`, 100000; docs/api.md)."""
    return _count_env("SBX_LIST_MAX_ENTRIES", 100_000)


def _count_env(name: str, default: int) -> int:
    raw = os.environ.get(name) or str(default)
    if not raw.strip().isdigit() or int(raw) <= 0:
        from sandboxer.core.rules.errors import BadInput

        raise BadInput(f"{name}: bad count {raw!r}: a whole number above 0, e.g. {default}")
    return int(raw)


# `sbx serve`'s limits (docs/security.md, "The service's limits"), read when it starts.

def terminal_replay_bytes() -> int:
    """The output of a terminal kept for a client that reconnects (`SBX_TERMINAL_REPLAY`,
    1MiB: the last that many bytes; docs/terminals-and-ports.md)."""
    return _size_env("SBX_TERMINAL_REPLAY", "1MiB")


def serve_max_body() -> int:
    """The largest request body the service reads, but an archive to import
    (`SBX_SERVE_MAX_BODY`, 1MiB)."""
    return _size_env("SBX_SERVE_MAX_BODY", "1MiB")


def serve_max_input() -> int:
    """The largest body of a command's input through the service: `POST
    /v1/sandboxes/{ref}/exec` (stdin as base64 in the JSON) and a process's `POST .../stdin`
    (`SBX_SERVE_MAX_INPUT`, 16MiB: about 12 MiB of exec stdin; more goes in as a file)."""
    return _size_env("SBX_SERVE_MAX_INPUT", "16MiB")


def serve_max_upload() -> int:
    """The largest archive `POST /v1/checkpoints/import` takes, and the largest file or tree
    body of `PUT /v1/sandboxes/{ref}/files[/tree]` (`SBX_SERVE_MAX_UPLOAD`, 4GiB)."""
    return _size_env("SBX_SERVE_MAX_UPLOAD", "4GiB")


def serve_max_exec_output() -> int:
    """The stdout, and the stderr, an exec answered in one reply keeps
    (`SBX_SERVE_MAX_EXEC_OUTPUT`, 1MiB each); the rest is counted, not kept."""
    return _size_env("SBX_SERVE_MAX_EXEC_OUTPUT", "1MiB")


def serve_max_streams() -> int:
    """Open event streams of the service in all (`SBX_SERVE_MAX_STREAMS`, 128)."""
    return _count_env("SBX_SERVE_MAX_STREAMS", 128)


def serve_max_streams_per_key() -> int:
    """Open event streams of one API key (`SBX_SERVE_MAX_STREAMS_PER_KEY`, 16)."""
    return _count_env("SBX_SERVE_MAX_STREAMS_PER_KEY", 16)


def serve_max_connections() -> int:
    """Open connections the service serves in full (`SBX_SERVE_MAX_CONNECTIONS`, 512); past
    them only /healthz and /readyz answer."""
    return _count_env("SBX_SERVE_MAX_CONNECTIONS", 512)


def serve_header_timeout():
    """How long a connection has to send a request's headers (`SBX_SERVE_HEADER_TIMEOUT`,
    10s)."""
    return _duration_env("SBX_SERVE_HEADER_TIMEOUT", "10s")


def serve_max_link_ttl():
    """The longest a signed preview link of the service's proxy may last
    (`SBX_SERVE_MAX_LINK_TTL`, 24h; docs/terminals-and-ports.md)."""
    return _duration_env("SBX_SERVE_MAX_LINK_TTL", "24h")


# The MCP server's limits (`sbx mcp`, `/mcp` of `sbx serve`: docs/mcp.md), read at each call.

def mcp_profiles() -> list[str] | None:
    """The profiles an MCP client may create from (`SBX_MCP_PROFILES`, comma-separated);
    None (unset): any profile on the search path."""
    raw = os.environ.get("SBX_MCP_PROFILES", "").strip()
    return [p.strip() for p in raw.split(",") if p.strip()] or None


def mcp_max_ttl():
    """The longest TTL (and extension) an MCP client may ask for (`SBX_MCP_MAX_TTL`, 2h)."""
    return _duration_env("SBX_MCP_MAX_TTL", "2h")


def mcp_max_output() -> int:
    """The output (each stream of an exec, a file, a process's output) a tool hands the
    model in one reply (`SBX_MCP_MAX_OUTPUT`, 64KiB); the rest is said in a note."""
    return _size_env("SBX_MCP_MAX_OUTPUT", "64KiB")


def clock_offset() -> str:
    """`SBX_CLOCK_OFFSET`: a duration, optionally `-`, that shifts this process's clock (tests)."""
    return os.environ.get("SBX_CLOCK_OFFSET", "").strip()


def profile_path() -> list[str]:
    """`SBX_PROFILE_PATH`: extra profile folders, `:`-separated, in order."""
    return [p for p in os.environ.get("SBX_PROFILE_PATH", "").split(os.pathsep) if p]


def webhook_url() -> str | None:
    """`SBX_WEBHOOK_URL`: overrides the settings file's `[sinks.webhook] url`."""
    return os.environ.get("SBX_WEBHOOK_URL") or None


def webhook_secret() -> str:
    """`SBX_WEBHOOK_SECRET`: the webhook's signing key; read when sending, kept nowhere."""
    return os.environ.get("SBX_WEBHOOK_SECRET", "")


def service_url() -> str | None:
    """`SBX_URL`: every command is a client of this `sbx serve`."""
    return os.environ.get("SBX_URL") or None


def service_token() -> str | None:
    """`SBX_TOKEN`: the API key for `SBX_URL`."""
    return os.environ.get("SBX_TOKEN") or None
