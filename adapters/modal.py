"""The Modal backend, on the `modal` SDK's async (`.aio`) API, with your own Modal token.

The SDK is imported only when a Modal call is about to be made, so `sbx ls`, `sbx reap` and
`sbx --help` never load it, and a missing token is reported (exit 5, naming the variables)
before it is. The token is read from the environment at the moment of each call and handed to
`modal.Client.from_credentials` (never the SDK's process-wide env client); it is written
nowhere. A profile may name another pair, MODAL_TOKEN_ID_<NAME> and MODAL_TOKEN_SECRET_<NAME>;
a backend reference is then the Modal sandbox id followed by the variables' NAMES (never their
values: `sb-...?token_id=MODAL_TOKEN_ID_WORK&token_secret=MODAL_TOKEN_SECRET_WORK`), so a
process without the profile (the reaper) still reaches the sandbox, and the reaper lists
every such pair that is set.

What Modal cannot do, sbx does not claim: it cannot extend a sandbox's timeout (so the Modal
`timeout` is the hard deadline and sbx's reaper enforces the soft one) or pause. Its images
carry no labels, so snapshot images are recorded with theirs in a Modal Dict. See
docs/modal.md.

Volumes (docs/volumes.md) are Modal's own (V2) volumes, named `sbx-<volume id>`, their labels
recorded in another Modal Dict (Modal volumes carry none either); files reach them without a
sandbox through the SDK's volume file API (batch_upload, listdir, read_file), and a sandbox
mounts them through `Sandbox.create(volumes=...)`, read-only through the mount's options.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import math
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlparse

from sandboxer.adapters.base import (
    EXEC_MARK,
    KILL_MARKED,
    LABEL_VOLUME,
    Adapter,
    AdapterError,
    Artifact,
    BackendObject,
    BackendObjectGone,
    BackendUnavailable,
    CallerStdin,
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    Endpoint,
    ExecResult,
    Health,
    InvalidRequest,
    NoSuchPath,
    PtyChannel,
    Stdin,
    one_line,
)

if TYPE_CHECKING:
    import modal as modal_sdk

TOKEN_ID = "MODAL_TOKEN_ID"
TOKEN_SECRET = "MODAL_TOKEN_SECRET"
DEFAULT_APP = "sandboxer"
IDLE_GRACE_S = 60  # Modal's idle_timeout is the profile's ttl.idle plus this
DEFAULT_SERVER = "https://api.modal.com"
OPTIONS = frozenset({"app", "token_id", "token_secret"})
ENV_REF = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]*)")
TOKEN_ID_NAME = re.compile(r"MODAL_TOKEN_ID(_[A-Z0-9_]+)?")
TOKEN_SECRET_NAME = re.compile(r"MODAL_TOKEN_SECRET(_[A-Z0-9_]+)?")
DOMAIN = re.compile(r"(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}", re.IGNORECASE)
MiB = 1024**2
PROBE_TIMEOUT = 10.0  # seconds to open a TCP connection to Modal
TUNNELS_TIMEOUT_S = 50  # how long Modal may take to report a new sandbox's tunnels
MAX_TIMEOUT_S = 24 * 3600  # Modal's longest sandbox timeout
CHECKPOINT_REGISTRY = "sandboxer-checkpoints"  # a Modal Dict: snapshot image id -> labels
VOLUME_REGISTRY = "sandboxer-volumes"  # a Modal Dict: volume name -> labels (sbx's volumes)
VOLUME_PREFIX = "sbx-"  # a volume's Modal name: this and sbx's volume id
VOLUME_HELPER = "volume:"  # open_volume's helper: this and the volume's ref (no object made)
VOLUME_ROOT = "/volume"  # where the core addresses a helper's volume (core/lifecycle/volumes.py)
INSTALL_HINT = "pip install 'sandboxer[modal]'"
TOKEN_HINT = "create one with `modal token new` or in your Modal workspace settings"
EXEC_BACKSTOP_S = 2  # Modal's own exec timeout: this much after sbx's, should sbx's kill fail
STDIN_CHUNK = 1024 * 1024  # per drain (the SDK buffers up to 16 MiB before one)
# An exec with pty=True takes its terminal's size from the caller's own terminal (none, in a
# service), and Modal has no call that resizes one. So the terminal is sized in the sandbox:
# by stty before the program starts (PTY_START: $1 rows, $2 cols, then the program), and on
# a resize by a second exec (PTY_RESIZE: $0 the mark, $1 EXEC_MARK, $2 rows, $3 cols) that
# finds the terminal through a process carrying the mark and sets its size there (the kernel
# tells the program, SIGWINCH). Both need stty and /proc in the sandbox.
PTY_START = 'stty rows "$1" cols "$2" 2>/dev/null; shift 2; exec "$@"'
PTY_RESIZE = r"""for f in $(grep -lzxF "$1=$0" /proc/[0-9]*/environ 2>/dev/null); do
  t=$(readlink "${f%/environ}/fd/0") || continue
  case "$t" in /dev/pts/*) stty -F "$t" rows "$2" cols "$3" && exit 0 ;; esac
done
exit 1"""


@dataclass(frozen=True)
class TokenVariables:
    """Which environment variables hold a token: names only, never values. The default pair,
    or MODAL_TOKEN_ID_<NAME> and MODAL_TOKEN_SECRET_<NAME> (`suffix` "_<NAME>"): the reaper,
    which has no profile, lists the sandboxes of every such pair that is set."""

    suffix: str = ""

    @property
    def id_name(self) -> str:
        return TOKEN_ID + self.suffix

    @property
    def secret_name(self) -> str:
        return TOKEN_SECRET + self.suffix

    @property
    def is_default(self) -> bool:
        return not self.suffix

    def describe(self) -> str:
        return f"${self.id_name} and ${self.secret_name}"

    def read(self) -> tuple[str, str]:
        """The token, read now. BackendUnavailable naming both variables when one is unset."""
        token_id = os.environ.get(self.id_name, "").strip()
        token_secret = os.environ.get(self.secret_name, "").strip()
        if not (token_id and token_secret):
            missing = [n for n, v in ((self.id_name, token_id), (self.secret_name, token_secret))
                       if not v]
            raise BackendUnavailable(
                f"no Modal token: set {self.describe()} ({', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not set); {TOKEN_HINT}")
        return token_id, token_secret

    def present(self) -> bool:
        return bool(os.environ.get(self.id_name, "").strip()
                    and os.environ.get(self.secret_name, "").strip())

    @classmethod
    def from_names(cls, id_name: str, secret_name: str) -> TokenVariables:
        id_match, secret_match = TOKEN_ID_NAME.fullmatch(id_name), TOKEN_SECRET_NAME.fullmatch(
            secret_name)
        if not (id_match and secret_match) or id_match.group(1) != secret_match.group(1):
            raise CapabilityNotSupported(
                f"the modal backend reads a profile's token from MODAL_TOKEN_ID_<NAME> and "
                f"MODAL_TOKEN_SECRET_<NAME> (the same NAME: the reaper looks for tokens under "
                f"those names), not {id_name} and {secret_name}")
        return cls(id_match.group(1) or "")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> TokenVariables:
        """`options: {token_id: env:MODAL_TOKEN_ID_X, token_secret: env:MODAL_TOKEN_SECRET_X}`:
        both or neither."""
        refs = {key: options.get(key) for key in ("token_id", "token_secret")}
        if all(v is None for v in refs.values()):
            return cls()
        names = {}
        for key, ref in refs.items():
            match = ENV_REF.fullmatch(str(ref)) if ref is not None else None
            if match is None:
                raise CapabilityNotSupported(
                    f"the modal backend needs options.token_id and options.token_secret together, "
                    f"each a reference such as env:MODAL_TOKEN_ID_WORK (options.{key} is {ref!r})")
            names[key] = match.group(1)
        return cls.from_names(names["token_id"], names["token_secret"])

    @classmethod
    def all_set(cls) -> list[TokenVariables]:
        """Every pair whose two variables are set: the default first, then by name."""
        suffixes = sorted(m.group(1) for v in os.environ
                          if (m := TOKEN_ID_NAME.fullmatch(v)) and m.group(1))
        pairs = [cls(), *(cls(s) for s in suffixes)]
        return [pair for pair in pairs if pair.present()]


def split_ref(ref: str) -> tuple[str, TokenVariables]:
    """`sb-...` or `sb-...?token_id=A&token_secret=B` -> (Modal id, token variables)."""
    object_id, _, query = ref.partition("?")
    names = dict(parse_qsl(query))
    if not names:
        return object_id, TokenVariables()
    return object_id, TokenVariables.from_names(names.get("token_id", ""),
                                                names.get("token_secret", ""))


def join_ref(object_id: str, tokens: TokenVariables) -> str:
    if tokens.is_default:
        return object_id
    return f"{object_id}?{urlencode({'token_id': tokens.id_name, 'token_secret': tokens.secret_name})}"


def server_url() -> str:
    return os.environ.get("MODAL_SERVER_URL") or DEFAULT_SERVER


def _sdk() -> modal_sdk:
    """The modal SDK, imported on first use. BackendUnavailable (exit 5) when absent."""
    try:
        import modal
        from modal.exception import DeprecationError
    except ImportError as exc:
        raise BackendUnavailable(f"the modal SDK is not installed ({exc}): {INSTALL_HINT}") from exc
    # Listing by tag across the environment (not one app) is what reconcile needs: sandboxes of
    # every profile's app carry this installation's tag. Modal marks it deprecated; say it once
    # here, in the docs, rather than on every `sbx reap`.
    warnings.filterwarnings("ignore", message=".*Listing Sandboxes without an `app_id`",
                            category=DeprecationError)
    return modal


def _status(code: int | None) -> str:
    if code is None:
        return "running"
    return {124: "timed-out", 137: "terminated"}.get(code, f"exited ({code})")


class ModalAdapter(Adapter):
    name = "modal"
    shared = True  # sandboxes live in a Modal workspace: any fleet host reaching it may reap them
    description = "Modal sandboxes with your own token (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET)"
    # files: the base's defaults (tar, find, stat, rm, mkdir, mv through exec with stdin);
    # pty: exec with pty=True, sized in the sandbox (PTY_START, PTY_RESIZE)
    # ports: Modal's tunnels, opened at create for the profile's ports (encrypted_ports)
    # volumes: Modal's own (V2) volumes, their files through its volume API (no sandbox)
    capabilities = frozenset({Capability.EXEC, Capability.SNAPSHOT, Capability.FILES,
                              Capability.PTY, Capability.PORTS, Capability.VOLUMES})

    def __init__(self) -> None:
        # clients by (server, token): in memory for this process only
        self._clients: dict[tuple[str, str, str], modal_sdk.Client] = {}
        self._apps: dict[tuple[int, str], Any] = {}
        self._verified: set[int] = set()  # clients whose token Modal accepted
        self._creating_with: TokenVariables | None = None  # set by validate(), for a create

    # -- plumbing ---------------------------------------------------------------------------

    async def _client(self, tokens: TokenVariables) -> modal_sdk.Client:
        token_id, token_secret = tokens.read()  # before the SDK is imported: exit 5, fast
        modal = _sdk()
        key = (server_url(), token_id, token_secret)
        client = self._clients.get(key)
        if client is None:
            await self._probe(key[0])
            try:
                client = await modal.Client.from_credentials.aio(token_id, token_secret)
            except Exception as exc:
                raise self._translate(exc, tokens, "connect") from exc
            self._clients[key] = client
        return client

    @staticmethod
    async def _probe(url: str, timeout: float = PROBE_TIMEOUT) -> None:
        """Can a connection to Modal be opened at all? The SDK retries a refused connection
        for about a minute; `sbx` says so at once (exit 5). Any one of a comma-separated list
        of server URLs will do, as for the SDK."""
        problems = []
        for one in (u.strip() for u in url.split(",")):
            parsed = urlparse(one)
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(parsed.hostname, port), timeout)
            except (OSError, TimeoutError) as exc:
                problems.append(f"{parsed.hostname}:{port}: {one_line(exc)}")
                continue
            writer.close()
            return
        raise BackendUnavailable(
            f"Modal unreachable at {url} ({'; '.join(problems)}); check your network or "
            "MODAL_SERVER_URL")

    def _translate(self, exc: BaseException, tokens: TokenVariables, doing: str) -> AdapterError:
        """One SDK error as the contract's: unreachable or refused token -> exit 5."""
        from modal import exception as modal_errors

        if isinstance(exc, AdapterError):
            return exc
        if isinstance(exc, modal_errors.AuthError):
            return BackendUnavailable(
                f"Modal at {server_url()} refused the token in {tokens.describe()} "
                f"({one_line(exc)}); check it, or {TOKEN_HINT}")
        if isinstance(exc, modal_errors.ConnectionError | ConnectionError | OSError):
            return BackendUnavailable(
                f"Modal unreachable at {server_url()} ({one_line(exc)}); check your network "
                "or MODAL_SERVER_URL")
        return AdapterError(f"Modal could not {doing}: {one_line(exc)}")

    async def _app(self, client: modal_sdk.Client, name: str) -> Any:
        key = (id(client), name)
        if key not in self._apps:
            self._apps[key] = await _sdk().App.lookup.aio(name, create_if_missing=True,
                                                          client=client)
        return self._apps[key]

    async def _sandbox(self, ref: str, doing: str) -> tuple[modal_sdk.Sandbox | None, TokenVariables]:
        """The sandbox handle (one lookup), or None when Modal does not know it."""
        from modal.exception import NotFoundError

        object_id, tokens = split_ref(ref)
        client = await self._client(tokens)
        try:
            return await _sdk().Sandbox.from_id.aio(object_id, client=client), tokens
        except NotFoundError:
            return None, tokens
        except Exception as exc:
            raise self._translate(exc, tokens, doing) from exc

    # -- contract ---------------------------------------------------------------------------

    def sees(self, ref: str) -> bool:
        """list() covers a sandbox only when its token pair is set in this process."""
        return split_ref(ref)[1].present()

    async def health(self) -> Health:
        """Through the default token, or the first MODAL_TOKEN_ID_<NAME> pair that is set."""
        pairs = TokenVariables.all_set()
        if not pairs:
            return Health(False, False, f"set {TokenVariables().describe()} (your Modal token); "
                                        f"{TOKEN_HINT}")
        tokens = pairs[0]
        try:
            client = await self._client(tokens)
        except AdapterError as exc:  # no SDK, or no server
            return Health(False, True, str(exc))
        try:
            await client.hello.aio()
        except Exception as exc:
            from modal.exception import AuthError

            problem = self._translate(exc, tokens, "answer")
            return Health(isinstance(exc, AuthError), not isinstance(exc, AuthError), str(problem))
        return Health(True, True, f"Modal at {server_url()}, token from {tokens.describe()}")

    async def ensure_available(self) -> None:
        """Before the core writes an intent: the SDK is installed, a token is set and Modal
        accepts it (one ClientHello per token and process). When creating, the core calls
        validate(request) just before, which names the token the profile uses; otherwise the
        default pair is checked, or the first MODAL_TOKEN_ID_<NAME> pair that is set."""
        _sdk()
        tokens, self._creating_with = self._creating_with, None
        if tokens is None:
            pairs = TokenVariables.all_set()
            tokens = pairs[0] if pairs else TokenVariables()
        client = await self._client(tokens)  # unset: exit 5 naming both variables
        if id(client) in self._verified:
            return
        try:
            await client.hello.aio()
        except Exception as exc:
            raise self._translate(exc, tokens, "answer") from exc
        self._verified.add(id(client))

    def validate(self, request: CreateRequest) -> None:
        unknown = set(request.options) - OPTIONS
        if unknown:
            raise CapabilityNotSupported(
                f"the modal backend has no option {', '.join(sorted(unknown))} "
                f"(it knows {', '.join(sorted(OPTIONS))})")
        app = request.options.get("app", DEFAULT_APP)
        if not isinstance(app, str) or not app:
            raise CapabilityNotSupported(f"options.app must be a Modal app name, not {app!r}")
        if not request.image:
            raise CapabilityNotSupported(
                "the modal backend needs an image: a Modal image id (im-...) or a registry "
                "reference such as python:3.12-slim")
        limits = request.resources
        if limits.pids is not None:
            raise CapabilityNotSupported(
                "the modal backend cannot limit processes (resources.pids); set it to null")
        if limits.disk_bytes is not None:
            raise CapabilityNotSupported(
                "the modal backend cannot limit disk for sandboxes (resources.disk)")
        if request.network == "egress":
            self._allow_lists(request.network_allow)
        if self._timeout(request) > MAX_TIMEOUT_S:
            raise CapabilityNotSupported(
                "the modal backend cannot keep a sandbox longer than 24h (Modal's longest "
                "timeout): lower ttl.max")
        tokens = TokenVariables.from_options(request.options)
        for mount in request.mounts:
            if split_ref(mount.ref)[1] != tokens:
                raise InvalidRequest(
                    f"the modal backend mounts a volume only into a sandbox made with the "
                    f"token that made the volume ({split_ref(mount.ref)[1].describe()}); this "
                    f"profile uses {tokens.describe()}")
        tokens.read()  # unset: exit 5 before anything is written
        self._creating_with = tokens  # ensure_available checks Modal accepts it

    async def instance_id(self) -> str | None:
        """The Modal server: sandboxes made through one are never judged through another.
        (Not the token: every token of a workspace sees its sandboxes, and tokens are secret.)"""
        return server_url()

    @staticmethod
    def _allow_lists(allow: Sequence[str]) -> tuple[list[str], list[str]]:
        """Split an egress allow-list into Modal's CIDR and domain allow-lists; refuse what
        is neither (a port, a URL), since Modal could not enforce it."""
        cidrs, domains = [], []
        for entry in allow:
            try:
                cidrs.append(str(ipaddress.ip_network(entry, strict=False)))
                continue
            except ValueError:
                pass
            if DOMAIN.fullmatch(entry):
                domains.append(entry.lower())
                continue
            raise CapabilityNotSupported(
                f"the modal backend can allow only CIDRs (10.0.0.0/8, 1.2.3.4) or domains "
                f"(example.com, *.example.com) in network.allow, not {entry!r}")
        return cidrs, domains

    async def restore(self, artifact: str, request: CreateRequest) -> BackendObject:
        """A new sandbox whose filesystem is the snapshot image's."""
        image_id, _ = split_ref(artifact)
        return await self.create(replace(request, image=image_id))

    async def create(self, request: CreateRequest) -> BackendObject:
        modal = _sdk()
        tokens = TokenVariables.from_options(request.options)
        client = await self._client(tokens)
        image_ref = request.image or ""
        # a Modal image id (a snapshot, say) as it is; anything else is a registry reference
        image = (modal.Image.from_id(image_ref, client=client) if image_ref.startswith("im-")
                 else modal.Image.from_registry(image_ref))
        limits = request.resources
        network: dict[str, Any] = {"block_network": request.network == "none"}
        if request.network == "egress":
            cidrs, domains = self._allow_lists(request.network_allow)
            network["outbound_cidr_allowlist"] = cidrs
            if domains:
                network["outbound_domain_allowlist"] = domains
        memory_mib = math.ceil(limits.memory_bytes / MiB) if limits.memory_bytes else None
        volumes = {mount.path: modal.Volume.from_name(split_ref(mount.ref)[0], client=client)
                   .with_mount_options(read_only=mount.read_only) for mount in request.mounts}
        try:
            app = await self._app(client, request.options.get("app", DEFAULT_APP))
            sandbox = await modal.Sandbox.create.aio(
                *(request.command or ()),
                app=app,
                image=image,
                timeout=self._timeout(request),
                # past sbx's own idle limit, so sbx's reaper ends it first, with the reason
                idle_timeout=(math.ceil(request.idle.total_seconds()) + IDLE_GRACE_S
                              if request.idle else None),
                cpu=(limits.cpu, limits.cpu) if limits.cpu else None,  # request = hard limit
                memory=(memory_mib, memory_mib) if memory_mib else None,
                gpu=limits.gpu,
                tags=dict(request.labels),
                env=dict(request.env) or None,
                client=client,
                encrypted_ports=list(request.ports),  # a TLS tunnel for each (https)
                **({"volumes": volumes} if volumes else {}),
                **network,
            )
        except Exception as exc:
            raise self._translate(exc, tokens, "create the sandbox") from exc
        return BackendObject(ref=join_ref(sandbox.object_id, tokens), labels=dict(request.labels),
                             status="running", running=True, created_at=datetime.now(UTC))

    async def port_endpoints(self, ref: str) -> dict[int, Endpoint]:
        """Modal's tunnels (`sandbox.tunnels()`): one https host for each of the profile's
        ports, opened at create."""
        sandbox, tokens = await self._sandbox(ref, "look up the sandbox")
        if sandbox is None:
            raise BackendObjectGone(f"Modal no longer has sandbox {split_ref(ref)[0]}")
        try:
            tunnels = await sandbox.tunnels.aio(timeout=TUNNELS_TIMEOUT_S)
        except Exception as exc:
            raise self._translate(exc, tokens, "read the sandbox's tunnels") from exc
        return {int(port): Endpoint(int(port), t.host, int(t.port), "https")
                for port, t in tunnels.items()}

    async def expose_port(self, ref: str, port: int) -> Endpoint:
        raise CapabilityNotSupported(
            f"the modal backend cannot open a tunnel to port {port} while the sandbox runs "
            f"(Modal opens them at create): add {port} to the profile's ports: and create "
            "the sandbox again")

    @staticmethod
    def _timeout(request: CreateRequest) -> int:
        """Modal's own timeout, in whole seconds from now: the hard deadline, which Modal
        enforces even if sbx never runs again (it cannot be extended later)."""
        if request.hard_deadline is None:
            raise CapabilityNotSupported("the modal backend needs a hard deadline (ttl.max)")
        return max(1, math.ceil(request.hard_deadline.timestamp() - time.time()))

    async def destroy(self, ref: str, *, services: bool = True) -> None:
        from modal.exception import NotFoundError

        sandbox, tokens = await self._sandbox(ref, "look up the sandbox")
        if sandbox is None:
            return  # Modal no longer knows it: gone already is success
        try:
            await sandbox.terminate.aio()
        except NotFoundError:
            return
        except Exception as exc:
            raise self._translate(exc, tokens, f"terminate {split_ref(ref)[0]}") from exc

    async def get(self, ref: str) -> BackendObject | None:
        """None also for a sandbox that has ended (timed out, terminated, exited): Modal keeps
        only its record, and an ended sandbox cannot run again."""
        sandbox, tokens = await self._sandbox(ref, "look up the sandbox")
        if sandbox is None or sandbox.returncode is not None:  # from the lookup itself
            return None
        try:
            labels = await sandbox.get_tags.aio()
        except Exception as exc:
            raise self._translate(exc, tokens, "read the sandbox's tags") from exc
        return BackendObject(ref=ref, labels=labels, status="running", running=True)

    async def list(self, labels: Mapping[str, str]) -> list[BackendObject]:
        """Running sandboxes carrying all `labels` (tags), every page, under every token pair
        that is set (a process without profiles, the reaper, knows no other). One pair that
        fails fails the listing: a partial one would make sandboxes look lost."""
        pairs = TokenVariables.all_set()  # first: with no token, `sbx reap` never imports the SDK
        if not pairs:
            TokenVariables().read()  # exit 5 naming both variables
        modal = _sdk()
        found: dict[str, BackendObject] = {}
        for tokens in pairs:
            client = await self._client(tokens)
            try:
                sandboxes = [s async for s in modal.Sandbox.list.aio(tags=dict(labels),
                                                                      client=client)]
                tags = await asyncio.gather(*(s.get_tags.aio() for s in sandboxes))
            except Exception as exc:
                raise self._translate(exc, tokens, "list sandboxes") from exc
            for sandbox, sandbox_tags in zip(sandboxes, tags, strict=True):
                found.setdefault(sandbox.object_id, BackendObject(
                    ref=join_ref(sandbox.object_id, tokens), labels=sandbox_tags,
                    status=_status(sandbox.returncode), running=sandbox.returncode is None))
        return list(found.values())

    async def touch(self, ref: str) -> None:
        """Modal's idle clock counts commands: run a no-op one."""
        await self.exec(ref, ["true"], timeout_s=30)

    async def exec(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                   user: str | None = None, stdin: Stdin = None) -> ExecResult:
        out, err = bytearray(), bytearray()
        async for item in self.exec_stream(ref, argv, timeout_s, env, cwd=cwd, user=user,
                                           stdin=stdin):
            if isinstance(item, ExecResult):
                return ExecResult(item.exit_code, bytes(out), bytes(err),
                                  item.duration_s, item.timed_out)
            (out if item[0] == "stdout" else err).extend(item[1])
        raise AssertionError("unreachable: the stream ends with its result")

    async def exec_stream(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                          env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                          user: str | None = None, stdin: Stdin = None,
                          ) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        """`Sandbox.exec` with `workdir=` and `env=`; stdin written through the process's
        stdin (write, drain, then write_eof: without stdin, at once, so a command that reads
        it sees it empty); the output as the command router sends it. sbx keeps the deadline
        itself: at `timeout_s` every process carrying the exec's mark (EXEC_MARK) is killed
        by a second exec, and the output so far is kept. Modal's own exec timeout, a little
        later, is the backstop."""
        from modal.exception import ConflictError, NotFoundError

        if user is not None:
            raise CapabilityNotSupported(
                f"the modal backend cannot run a command as {user!r}: Modal's exec runs as "
                "the image's user (remove user)")
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        sandbox, process, tokens, mark = await self._exec_marked(
            ref, argv, env or {}, cwd, "run the command",
            timeout=math.ceil(timeout_s) + EXEC_BACKSTOP_S if timeout_s else None)
        queue: asyncio.Queue[tuple[str, bytes] | BaseException | None] = asyncio.Queue(16)

        async def pump(reader: Any, name: str) -> None:
            try:
                async for chunk in reader:
                    if chunk:
                        await queue.put((name, bytes(chunk)))
            except Exception as exc:
                await queue.put(exc)
            await queue.put(None)

        given = CallerStdin(stdin)  # a failure of the caller's is raised once the command ends

        async def feed() -> None:
            try:
                async for chunk in given:
                    for at in range(0, len(chunk), STDIN_CHUNK):
                        process.stdin.write(chunk[at:at + STDIN_CHUNK])
                        await process.stdin.drain.aio()
                process.stdin.write_eof()
                await process.stdin.drain.aio()
            except Exception:  # noqa: S110 (the command ended or stopped reading: its exit says)
                pass

        tasks = [asyncio.create_task(pump(process.stdout, "stdout")),
                 asyncio.create_task(pump(process.stderr, "stderr")),
                 asyncio.create_task(feed())]
        open_streams, timed_out = 2, False
        try:
            while open_streams:
                left = None if deadline is None else deadline - loop.time()
                try:
                    if left is not None and left <= 0:
                        raise TimeoutError
                    item = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    timed_out = True
                    break
                if item is None:
                    open_streams -= 1
                elif isinstance(item, BaseException):
                    raise self._translate(item, tokens, "read the command's output") from item
                else:
                    yield item
            if timed_out:
                killed = await self._kill_marked(sandbox, mark)
                while not queue.empty():  # what was read before the deadline is kept
                    item = queue.get_nowait()
                    if isinstance(item, tuple):
                        yield item
                note = "" if killed else " (the command may still run in the sandbox)"
                yield "stderr", f"sbx: timed out after {timeout_s:g}s{note}\n".encode()
                yield ExecResult(124, b"", b"", time.perf_counter() - started, timed_out=True)
                return
            try:
                code = await process.wait.aio()
            except (NotFoundError, ConflictError) as exc:
                raise BackendObjectGone(
                    f"Modal sandbox {split_ref(ref)[0]} has ended ({one_line(exc)})") from exc
            except Exception as exc:
                raise self._translate(exc, tokens, "run the command") from exc
            given.raise_if_failed()
        finally:
            for task in tasks:
                task.cancel()
        yield ExecResult(code, b"", b"", time.perf_counter() - started)

    async def open_pty(self, ref: str, argv: Sequence[str], *, cols: int = 80, rows: int = 24,
                       env: Mapping[str, str] | None = None, cwd: str | None = None,
                       ) -> PtyChannel:
        """`Sandbox.exec(..., pty=True)` with `workdir=` and `env=` (TERM among them), the
        program started by PTY_START at `cols` x `rows`; keystrokes through its stdin, its
        terminal's output on stdout; resized by PTY_RESIZE; closed by killing every process
        carrying its mark."""
        sandbox, process, tokens, mark = await self._exec_marked(
            ref, ["sh", "-c", PTY_START, "sbx-pty", str(rows), str(cols), *argv],
            {"TERM": "xterm-256color", **(env or {})}, cwd, "open a terminal", pty=True)
        return _ModalPty(self, sandbox, process, mark, tokens)

    async def _exec_marked(self, ref: str, argv: Sequence[str], env: Mapping[str, str],
                           cwd: str | None, what: str, **options: Any,
                           ) -> tuple[Any, Any, Any, str]:
        """`Sandbox.exec` of `argv` (text=False, `options` besides) with `env` and a new mark
        (EXEC_MARK) in its environment, in `cwd` if given: (sandbox, process, tokens, mark).
        BackendObjectGone when the sandbox is gone or has ended; else the SDK's failure
        translated, saying it could not `what`."""
        from modal.exception import ConflictError, NotFoundError

        sandbox, tokens = await self._sandbox(ref, "look up the sandbox")
        if sandbox is None:
            raise BackendObjectGone(f"Modal sandbox {split_ref(ref)[0]} is gone")
        mark = uuid.uuid4().hex
        try:
            process = await sandbox.exec.aio(
                *argv, text=False, env={**env, EXEC_MARK: mark},
                **({"workdir": cwd} if cwd is not None else {}), **options)
        except (NotFoundError, ConflictError) as exc:
            raise BackendObjectGone(
                f"Modal sandbox {split_ref(ref)[0]} has ended ({one_line(exc)})") from exc
        except Exception as exc:
            raise self._translate(exc, tokens, what) from exc
        return sandbox, process, tokens, mark

    @staticmethod
    async def _kill_marked(sandbox: Any, mark: str) -> bool:
        """Kill, inside the sandbox, every process whose environment carries the mark."""
        try:
            killer = await sandbox.exec.aio("sh", "-c", KILL_MARKED, mark, EXEC_MARK,
                                            timeout=10, text=False)
            return await asyncio.wait_for(killer.wait.aio(), 10) == 0
        except Exception:
            return False

    async def _checkpoint_registry(self, client: modal_sdk.Client) -> Any:
        """The Modal Dict that records each snapshot image's labels: Modal images carry none
        and cannot be listed, and reconcile needs both (docs/modal.md, "Checkpoints")."""
        return _sdk().Dict.from_name(CHECKPOINT_REGISTRY, create_if_missing=True, client=client)

    async def snapshot(self, ref: str, labels: Mapping[str, str]) -> Artifact:
        """`snapshot_filesystem`: the filesystem as a Modal image (not memory), recorded with
        its labels in the checkpoint registry. An image that cannot be recorded is deleted."""
        from modal.exception import ConflictError, NotFoundError

        sandbox, tokens = await self._sandbox(ref, "look up the sandbox")
        if sandbox is None:
            raise BackendObjectGone(f"Modal sandbox {split_ref(ref)[0]} is gone")
        try:
            image = await sandbox.snapshot_filesystem.aio()
        except (NotFoundError, ConflictError) as exc:
            raise BackendObjectGone(
                f"Modal sandbox {split_ref(ref)[0]} has ended ({one_line(exc)})") from exc
        except Exception as exc:
            raise self._translate(exc, tokens, "snapshot the sandbox") from exc
        artifact = Artifact(join_ref(image.object_id, tokens), dict(labels))
        try:
            registry = await self._checkpoint_registry(await self._client(tokens))
            await registry.put.aio(image.object_id, dict(labels))
        except BaseException as exc:
            try:
                await self.delete_artifact(artifact.ref)
            except Exception:
                pass  # Modal expires snapshot images after 30 days by itself
            if not isinstance(exc, Exception):
                raise
            raise self._translate(exc, tokens, "record the snapshot") from exc
        return artifact

    async def delete_artifact(self, artifact: str) -> None:
        """Delete the snapshot image (the SDK's `modal.experimental.image_delete`), then its
        registry entry. Already gone is success."""
        from modal.exception import NotFoundError
        from modal.experimental import image_delete

        image_id, tokens = split_ref(artifact)
        client = await self._client(tokens)
        try:
            try:
                await image_delete.aio(image_id, client=client)
            except NotFoundError:
                pass
            registry = await self._checkpoint_registry(client)
            await registry.pop.aio(image_id, None)
        except Exception as exc:
            raise self._translate(exc, tokens, f"delete image {image_id}") from exc

    async def list_artifacts(self, labels: Mapping[str, str]) -> list[Artifact]:
        """Snapshot images recorded with all of `labels`, under every token pair set."""
        pairs = TokenVariables.all_set()  # first: with no token, `sbx reap` never imports the SDK
        if not pairs:
            TokenVariables().read()
        want = dict(labels).items()
        found: dict[str, Artifact] = {}
        for tokens in pairs:
            client = await self._client(tokens)
            try:
                registry = await self._checkpoint_registry(client)
                entries = [entry async for entry in registry.items.aio()]
            except Exception as exc:
                raise self._translate(exc, tokens, "list snapshot images") from exc
            for image_id, image_labels in entries:
                if isinstance(image_labels, dict) and want <= image_labels.items():
                    found.setdefault(image_id, Artifact(join_ref(image_id, tokens), image_labels))
        return list(found.values())

    # -- volumes (Capability.VOLUMES, docs/volumes.md) ---------------------------------------

    @staticmethod
    def _volume_tokens() -> TokenVariables:
        """A volume has no profile: the token ensure_available checked (the default pair, or
        the first MODAL_TOKEN_ID_<NAME> pair that is set)."""
        pairs = TokenVariables.all_set()
        return pairs[0] if pairs else TokenVariables()

    @staticmethod
    def _volume_registry(client: modal_sdk.Client) -> Any:
        """The Modal Dict recording sbx's volumes with their labels: Modal volumes carry no
        labels, and only a volume recorded here is ever deleted."""
        return _sdk().Dict.from_name(VOLUME_REGISTRY, create_if_missing=True, client=client)

    @staticmethod
    async def _modal_volume(name: str, client: modal_sdk.Client) -> Any:
        """The hydrated Modal volume of that name, or None when Modal has none."""
        from modal.exception import NotFoundError

        volume = _sdk().Volume.from_name(name, client=client)
        try:
            await volume.hydrate.aio()
        except NotFoundError:
            return None
        return volume

    async def create_volume(self, volume_id: str, labels: Mapping[str, str]) -> str:
        """A Modal V2 volume named `sbx-<volume id>` (never one that exists already), then
        its entry in the volume registry; a volume that cannot be recorded is deleted."""
        modal = _sdk()
        tokens = self._volume_tokens()
        client = await self._client(tokens)
        name = VOLUME_PREFIX + volume_id
        try:
            await modal.Volume.objects.create.aio(name, version=2, client=client)
        except Exception as exc:
            raise self._translate(exc, tokens, f"create volume {name}") from exc
        try:
            await self._volume_registry(client).put.aio(name, dict(labels))
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await modal.Volume.objects.delete.aio(name, allow_missing=True, client=client)
            if not isinstance(exc, Exception):
                raise
            raise self._translate(exc, tokens, f"record volume {name}") from exc
        return join_ref(name, tokens)

    async def remove_volume(self, ref: str) -> None:
        """Delete the Modal volume, then its registry entry. A volume the registry does not
        record as sbx's is left alone (AdapterError); already gone is success."""
        name, tokens = split_ref(ref)
        client = await self._client(tokens)
        try:
            registry = self._volume_registry(client)
            labels = await registry.get.aio(name)
            if not (isinstance(labels, dict) and LABEL_VOLUME in labels):
                if await self._modal_volume(name, client) is None:
                    return
                raise AdapterError(f"Modal volume {name} is not one of sbx's (the "
                                   f"{VOLUME_REGISTRY} Dict does not record it): left alone")
            await _sdk().Volume.objects.delete.aio(name, allow_missing=True, client=client)
            await registry.pop.aio(name, None)
        except Exception as exc:
            raise self._translate(exc, tokens, f"delete volume {name}") from exc

    async def volume_size(self, ref: str) -> int | None:
        """The sizes of the volume's files, as Modal lists them (None: the volume is gone)."""
        from modal.types import FileEntryType

        name, tokens = split_ref(ref)
        client = await self._client(tokens)
        try:
            volume = await self._modal_volume(name, client)
            if volume is None:
                return None
            entries = await volume.listdir.aio("/", recursive=True)
        except Exception as exc:
            raise self._translate(exc, tokens, f"list volume {name}") from exc
        return sum(e.size for e in entries if e.type == FileEntryType.FILE)

    async def list_volumes(self, labels: Mapping[str, str]) -> list[str]:
        """Volumes recorded with all of `labels`, under every token pair set."""
        pairs = TokenVariables.all_set()
        if not pairs:
            TokenVariables().read()  # exit 5 naming both variables
        want = dict(labels).items()
        found: list[str] = []
        for tokens in pairs:
            client = await self._client(tokens)
            try:
                entries = [e async for e in self._volume_registry(client).items.aio()]
            except Exception as exc:
                raise self._translate(exc, tokens, "list volumes") from exc
            for name, volume_labels in entries:
                ref = join_ref(name, tokens)
                if isinstance(volume_labels, dict) and want <= volume_labels.items() \
                        and ref not in found:
                    found.append(ref)
        return found

    async def open_volume(self, ref: str, labels: Mapping[str, str]) -> str:
        """No object is made: Modal's volume API reaches the files (put_archive and
        get_archive of the helper ref go to it)."""
        name, tokens = split_ref(ref)
        client = await self._client(tokens)
        try:
            volume = await self._modal_volume(name, client)
        except Exception as exc:
            raise self._translate(exc, tokens, f"look up volume {name}") from exc
        if volume is None:
            raise BackendObjectGone(f"Modal no longer has volume {name}")
        return VOLUME_HELPER + ref

    async def close_volume(self, helper: str) -> None:
        """Nothing to remove (open_volume made nothing)."""

    async def put_archive(self, ref: str, path: str, tar: AsyncIterator[bytes]) -> None:
        if not ref.startswith(VOLUME_HELPER):
            return await super().put_archive(ref, path, tar)
        await self._put_volume_tree(ref[len(VOLUME_HELPER):], _volume_path(path), tar)

    async def get_archive(self, ref: str, path: str) -> AsyncIterator[bytes]:
        if not ref.startswith(VOLUME_HELPER):
            async for chunk in super().get_archive(ref, path):
                yield chunk
            return
        async for chunk in self._get_volume_tree(ref[len(VOLUME_HELPER):], path):
            yield chunk

    async def _put_volume_tree(self, ref: str, into: str, tar: AsyncIterator[bytes]) -> None:
        """The tar stream unpacked here (a temp folder: files and folders only, refused
        whole otherwise), then its files uploaded under `into` in one batch (Modal's
        VolumePutFiles2, overwriting). Modal's volume API uploads files: a folder with
        nothing in it is not kept."""
        name, tokens = split_ref(ref)
        client = await self._client(tokens)
        with tempfile.TemporaryDirectory(prefix="sbx-modal-volume-") as scratch:
            archive = os.path.join(scratch, "tree.tar")
            with open(archive, "wb") as out:  # noqa: ASYNC230 (a local temp file)
                async for chunk in tar:
                    out.write(chunk)
            files = await asyncio.to_thread(_unpack_files, archive,
                                            os.path.join(scratch, "tree"))
            try:
                volume = await self._modal_volume(name, client)
                if volume is None:
                    raise BackendObjectGone(f"Modal no longer has volume {name}")
                if files:
                    async with volume.batch_upload.aio(force=True) as batch:
                        for local, inside, mode in files:
                            batch.put_file(local, posixpath.join(into, inside), mode)
            except Exception as exc:
                raise self._translate(exc, tokens, f"write to volume {name}") from exc

    async def _get_volume_tree(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """`path` (under VOLUME_ROOT) as a tar stream whose one top entry is its base name,
        packed here from Modal's listing and file reads (a file at a time). Symlinks made in
        a sandbox are left out (Modal's listing does not say where they point)."""
        from modal.exception import NotFoundError
        from modal.types import FileEntryType

        name, tokens = split_ref(ref)
        client = await self._client(tokens)
        inside = _volume_path(path)
        top = posixpath.normpath(path)
        try:
            volume = await self._modal_volume(name, client)
            if volume is None:
                raise BackendObjectGone(f"Modal no longer has volume {name}")
            entries = await volume.listdir.aio(inside, recursive=True)
        except NotFoundError as exc:
            raise NoSuchPath(f"{inside} does not exist in the volume") from exc
        except Exception as exc:
            raise self._translate(exc, tokens, f"list volume {name}") from exc
        parent = posixpath.dirname(top)
        is_file = (inside != "/" and len(entries) == 1
                   and entries[0].path.strip("/") == inside.strip("/")
                   and entries[0].type != FileEntryType.DIRECTORY)
        if not is_file:
            header = tarfile.TarInfo(posixpath.basename(top))
            header.type, header.mode, header.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
            yield header.tobuf(format=tarfile.PAX_FORMAT)
        for entry in sorted(entries, key=lambda e: e.path):
            if entry.type not in (FileEntryType.FILE, FileEntryType.DIRECTORY):
                continue
            header = tarfile.TarInfo(posixpath.relpath(
                posixpath.join(VOLUME_ROOT, entry.path.lstrip("/")), parent))
            header.mtime = entry.mtime
            if entry.type == FileEntryType.DIRECTORY:
                header.type, header.mode = tarfile.DIRTYPE, 0o755
                yield header.tobuf(format=tarfile.PAX_FORMAT)
                continue
            header.size, header.mode = entry.size, 0o644
            yield header.tobuf(format=tarfile.PAX_FORMAT)
            sent = 0
            try:
                async for chunk in volume.read_file.aio(entry.path):
                    chunk = chunk[:entry.size - sent]  # it grew since it was listed
                    sent += len(chunk)
                    if chunk:
                        yield chunk
            except Exception as exc:
                raise self._translate(exc, tokens, f"read {entry.path} of volume {name}") from exc
            if sent < entry.size:  # it shrank since it was listed: the header holds
                yield b"\0" * (entry.size - sent)
            if entry.size % tarfile.BLOCKSIZE:
                yield b"\0" * (tarfile.BLOCKSIZE - entry.size % tarfile.BLOCKSIZE)
        yield b"\0" * (2 * tarfile.BLOCKSIZE)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        self._apps.clear()
        self._verified.clear()
        for client in clients:
            try:
                await client.close.aio()
            except Exception:
                pass


def _volume_path(path: str) -> str:
    """A helper's path (under VOLUME_ROOT, as the core gives it) as the volume's own."""
    path = posixpath.normpath(path)
    if path == VOLUME_ROOT:
        return "/"
    if not path.startswith(VOLUME_ROOT + "/"):
        raise InvalidRequest(f"{path} is not in the volume ({VOLUME_ROOT})")
    return path[len(VOLUME_ROOT):]


def _unpack_files(archive: str, into: str) -> list[tuple[str, str, int]]:
    """The tar's regular files written under `into`: (local path, path in the tree, mode)
    for each. Folders are made; any other entry (a link, a device) or a name leaving the
    tree refuses the whole archive, before anything is uploaded."""
    files: dict[str, tuple[str, str, int]] = {}
    os.makedirs(into)
    with tarfile.open(archive, mode="r|") as tar:
        for member in tar:
            inside = posixpath.normpath(member.name.lstrip("/"))
            if inside in (".", "") or inside.startswith("../") or inside == "..":
                if member.isdir():
                    continue
                raise InvalidRequest(f"the archive's entry {member.name!r} leaves its folder")
            local = os.path.join(into, *inside.split("/"))
            if member.isdir():
                os.makedirs(local, exist_ok=True)
            elif member.isfile():
                os.makedirs(os.path.dirname(local), exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file has data
                with source, open(local, "wb") as out:
                    shutil.copyfileobj(source, out)
                files[inside] = (local, inside, member.mode & 0o7777 or 0o644)
            else:
                raise InvalidRequest(
                    f"the modal backend keeps files and folders in a volume, not "
                    f"{member.name!r} (a link or special file: Modal's volume API has none)")
    return list(files.values())


class _ModalPty(PtyChannel):
    """A Modal exec on a pseudo-terminal: its stdout read as it comes, b"" at its end (then
    the exit code from `wait`)."""

    def __init__(self, adapter: ModalAdapter, sandbox: Any, process: Any, mark: str,
                 tokens: Any) -> None:
        self._adapter, self._sandbox, self._process = adapter, sandbox, process
        self._mark, self._tokens = mark, tokens
        self._queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(64)
        self._pump = asyncio.create_task(self._read_all())
        self._writing = asyncio.Lock()
        self._ended = self._closed = False

    async def _read_all(self) -> None:
        try:
            async for chunk in self._process.stdout:
                if chunk and not self._closed:  # closed: no one reads it any more
                    await self._queue.put(bytes(chunk))
        except Exception as exc:
            if not self._closed:
                await self._queue.put(exc)
        if not self._closed:
            await self._queue.put(None)

    async def read(self) -> bytes:
        if self._ended:
            return b""
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._ended = True
            raise self._adapter._translate(item, self._tokens, "read the terminal") from item
        if item is None:
            self._ended = True
            if not self._closed:
                try:
                    self.exit_code = await self._process.wait.aio()
                except Exception:
                    self.exit_code = None  # the backend cannot tell
            return b""
        return item

    async def write(self, data: bytes) -> None:
        if self._ended or self._closed or not data:
            return
        try:
            async with self._writing:
                for at in range(0, len(data), STDIN_CHUNK):
                    self._process.stdin.write(data[at:at + STDIN_CHUNK])
                    await self._process.stdin.drain.aio()
        except Exception as exc:
            if self._pump.done():
                return  # the program ended: its exit code says the rest
            raise self._adapter._translate(exc, self._tokens, "write to the terminal") from exc

    async def resize(self, cols: int, rows: int) -> None:
        if self._ended or self._closed:
            return
        try:
            sizer = await self._sandbox.exec.aio("sh", "-c", PTY_RESIZE, self._mark, EXEC_MARK,
                                                 str(rows), str(cols), timeout=10, text=False)
            code = await asyncio.wait_for(sizer.wait.aio(), 15)
        except Exception as exc:
            raise self._adapter._translate(exc, self._tokens, "resize the terminal") from exc
        if code != 0 and not self._pump.done():
            raise AdapterError("the modal backend could not resize the terminal: the sandbox "
                               "needs stty and /proc (Modal has no resize call of its own)")

    async def close(self) -> None:
        """Kill every process of the terminal (its mark), then stop reading."""
        if self._closed:
            return
        self._closed = True
        if not self._pump.done():
            await ModalAdapter._kill_marked(self._sandbox, self._mark)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._pump), 10)
        self._pump.cancel()
        while not self._queue.empty():  # a read waiting now ends with b""
            self._queue.get_nowait()
        self._queue.put_nowait(None)
