"""Profiles: the one schema (pydantic), YAML files, the search path and `extends:`.

Search path, later wins by name: built-in `profiles/` -> the user config folder ->
`./.sbx/profiles` (only once trusted, below) -> `$SBX_PROFILE_PATH` folders -> an explicit
file. A profile that `extends:` its own name inherits the one of that name further down the
path. Secrets are references (`env:NAME`) and stay references; the value is read at create time.

The working folder's `.sbx/profiles` comes with whatever folder one stands in (a cloned
repository, say), and a profile there can replace `default` and name any host variable as a
secret. So it is used only while the user trusts it: `sbx profiles trust` records the folder
with a digest of its profile files and of the files they name (as direnv's `allow`), and a
folder that is not recorded, or whose files changed since, is left out with one line on
stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    PlainSerializer,
    PositiveFloat,
    PositiveInt,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from sandboxer.adapters import registry
from sandboxer.core.rules.durations import format_duration, parse_duration
from sandboxer.core.rules.errors import BadInput, NotFound, plain_problems
from sandboxer.core.rules.labels import validate_label

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
SECRET_REF = re.compile(r"env:[A-Za-z_][A-Za-z0-9_]*")
# `user:` as the engine takes it: a uid or a POSIX user name, optionally `:` a gid or group
_ID_OR_NAME = r"(?:[0-9]{1,10}|[a-z_][a-z0-9_-]{0,31})"
USER = re.compile(rf"{_ID_OR_NAME}(?::{_ID_OR_NAME})?")
MAX_ID = 2**32 - 2  # the largest uid or gid Linux gives out (2**32 - 1 means "none")
SUFFIXES = (".yaml", ".yml")
# `ports:`: TCP ports in the sandbox, each published on `publish_address` (loopback unless
# the profile opts into another address) with a host port the backend picks
Port = Annotated[StrictInt, Field(ge=1, le=65535)]
LOOPBACK = "127.0.0.1"


def _duration(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    try:
        return parse_duration(str(value))
    except BadInput as exc:
        raise ValueError(str(exc)) from None


Duration = Annotated[
    timedelta, BeforeValidator(_duration), PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({"type": "string", "pattern": "^([0-9]+[dhms])+$",
                    "description": "a duration: 90s, 15m, 2h, 1d, 1h30m"}),
]
Size = Annotated[ByteSize, PlainSerializer(int, return_type=int)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(_Strict):
    cpu: PositiveFloat = 1.0
    memory: Size | None = ByteSize(512 * 1024**2)
    disk: Size | None = None
    pids: PositiveInt | None = 256
    gpu: str | None = None


class Network(_Strict):
    mode: Literal["none", "egress", "full"] = "none"
    allow: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _allow_only_for_egress(self) -> Network:
        if self.allow and self.mode != "egress":
            raise ValueError("'allow' applies only to mode 'egress'")
        return self


class TTLPolicy(_Strict):
    default: Duration = timedelta(minutes=30)
    max: Duration = timedelta(hours=4)
    idle: Duration | None = None

    @model_validator(mode="after")
    def _default_within_max(self) -> TTLPolicy:
        if self.default > self.max:
            raise ValueError(
                f"default {format_duration(self.default)} is longer than max {format_duration(self.max)}"
            )
        return self


class CheckpointPolicy(_Strict):
    keep: PositiveInt | None = None
    ttl: Duration | None = None
    accept_imports: StrictBool = Field(False, description=(
        "an imported checkpoint that records this profile's name may restore under it "
        "without --profile (docs/security.md, \"Imported checkpoints\")"))


MAX_POOL_SIZE = 100  # warm members one pool may keep (cloud members cost money while they wait)
PoolSize = Annotated[StrictInt, Field(ge=0, le=MAX_POOL_SIZE)]


class PoolPolicy(_Strict):
    """Warm members kept ready, so a create claims one instead of waiting for the backend
    (docs/pools.md). `max_age` is short by default: a member past it is replaced."""

    size: PoolSize
    max_age: Duration = timedelta(minutes=10)


class Service(_Strict):
    """A container beside the sandbox's main one, in its network namespace (as in a pod):
    the main container reaches it on localhost; the pod keeps the profile's network policy."""

    image: str
    command: list[str] | None = None
    environment: dict[str, str] = Field(default_factory=dict)


ComposeAllowance = Literal["binds", "privileged", "host-network", "host-namespaces", "cap-add",
                           "devices", "security-opt", "ports", "external"]


class Compose(_Strict):
    """A Docker Compose project as the sandbox (`backend: compose`): one project per sandbox;
    exec, logs and the profile's setup go to `service`. What a compose file may ask of the
    host is refused unless listed in `allow` (docs/adapters.md)."""

    file: str | None = Field(None, description="the compose file; relative to the profile's file")
    project: dict[str, Any] | None = Field(None, description="the compose file's content, inline")
    service: str = Field(description="the service exec, logs and setup run in")
    allow: list[ComposeAllowance] = Field(
        default_factory=list, description="what the compose file may ask of the host")

    @model_validator(mode="after")
    def _file_or_project(self) -> Compose:
        if (self.file is None) == (self.project is None):
            raise ValueError("give the compose file as file: PATH or inline as project: "
                             "{services: ...}, one of them")
        return self


class VolumeMount(_Strict):
    """A volume mounted into the sandbox (docs/volumes.md): made beforehand with `sbx volume
    create`, looked up by name among the creator's own."""

    name: str = Field(description="the volume's name (sbx volume create NAME)")
    path: str = Field(description="where it appears in the sandbox: an absolute path, not /")
    read_only: StrictBool = False

    @field_validator("name")
    @classmethod
    def _volume_name(cls, v: str) -> str:
        from sandboxer.core.rules.ids import validate_name

        try:
            return validate_name(v, "volume name")
        except BadInput as exc:
            raise ValueError(str(exc)) from None

    @field_validator("path")
    @classmethod
    def _mount_path(cls, v: str) -> str:
        parts = v.split("/")
        if not v.startswith("/") or v == "/" or ".." in parts or "\0" in v or len(v) > 4096:
            raise ValueError(f"{v[:80]!r} is not a mount path: give an absolute path in the "
                             "sandbox other than / (without ..)")
        return "/" + "/".join(part for part in parts if part)


class Profile(_Strict):
    name: str
    description: str = ""
    backend: str
    image: str | None = None
    template: str | None = None
    command: list[str] | None = None
    resources: Resources = Resources()
    network: Network = Network()
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict)
    ttl: TTLPolicy = TTLPolicy()
    labels: dict[str, str] = Field(default_factory=dict)
    setup: list[str] = Field(default_factory=list)
    checkpoints: CheckpointPolicy = CheckpointPolicy()
    services: dict[str, Service] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)
    # hardening of the sandbox itself (not its services); a backend that cannot enforce it
    # refuses the profile at create
    read_only: StrictBool = False  # a read-only root filesystem, with a writable /tmp
    user: str | None = None  # the main process and every exec run as this user
    compose: Compose | None = None  # backend: compose: the project the sandbox is
    # a sandbox's TCP ports reachable from this host (docs/terminals-and-ports.md, "Ports")
    ports: list[Port] = Field(default_factory=list, description=(
        "TCP ports in the sandbox to publish (1-65535, each once); the backend picks the host "
        "port. Needs a network (not mode: none) and a backend with the ports capability"))
    publish_address: str = Field(LOOPBACK, description=(
        "the host address `ports:` are published on: loopback unless you opt into another "
        "(0.0.0.0: every interface of the host)"))
    # how the sandbox is contained (docs/security.md, "Isolation levels"); a backend that
    # cannot run gvisor (no isolation-gvisor capability) refuses the profile, exit 2
    isolation: Literal["container", "gvisor"] = Field("container", description=(
        "container: the backend's own container (Docker's runc); gvisor: under gVisor's runsc "
        "runtime, a kernel of its own between the sandbox and the host (docker and compose "
        "backends; `make gvisor` registers it)"))

    @field_validator("ports")
    @classmethod
    def _unique_ports(cls, v: list[int]) -> list[int]:
        twice = sorted({port for port in v if v.count(port) > 1})
        if twice:
            raise ValueError(f"port {twice[0]} is listed twice: list each port once")
        return v

    @field_validator("publish_address")
    @classmethod
    def _an_address(cls, v: str) -> str:
        import ipaddress

        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            raise ValueError(f"{v[:60]!r} is not an IP address: give one such as 127.0.0.1 "
                             "(the default), ::1 or 0.0.0.0") from None

    @model_validator(mode="after")
    def _ports_need_a_network(self) -> Profile:
        if self.ports and self.network.mode == "none":
            raise ValueError(
                f"ports: {self.ports} cannot be published: the profile's network is "
                "{mode: none}, which has no network to publish on; choose network: "
                "{mode: full} (on Docker, the installation's own private bridge)")
        return self

    @model_validator(mode="after")
    def _compose_with_its_backend(self) -> Profile:
        if self.compose is not None and self.backend != "compose":
            raise ValueError("compose: applies only to backend: compose")
        if self.compose is None and self.backend == "compose":
            raise ValueError("backend: compose needs compose: {file: PATH, service: NAME}")
        return self
    # warm members of this profile kept ready (core/pools/__init__.py); not inherited by a profile
    # of another name that extends this one
    pool: PoolPolicy | None = None
    # volumes that outlive the sandbox, mounted into it (docs/volumes.md)
    volumes: list[VolumeMount] = Field(default_factory=list)

    @model_validator(mode="after")
    def _volumes_not_pooled(self) -> Profile:
        if self.volumes and self.pool is not None:
            raise ValueError("a profile with volumes cannot keep a pool: a warm member would "
                             "hold its mounts before anyone claimed it")
        return self

    @field_validator("volumes")
    @classmethod
    def _one_mount_each(cls, v: list[VolumeMount]) -> list[VolumeMount]:
        for what in ("name", "path"):
            seen = [getattr(m, what) for m in v]
            twice = sorted({x for x in seen if seen.count(x) > 1})
            if twice:
                raise ValueError(f"volume {what} {twice[0]!r} is listed twice: mount each "
                                 "volume once, at a path of its own")
        return v

    @field_validator("pool")
    @classmethod
    def _poolable(cls, v: PoolPolicy | None, info: ValidationInfo) -> PoolPolicy | None:
        if v is not None and info.data.get("secrets"):
            raise ValueError("a profile with secrets cannot keep a pool: its members would "
                             "carry the secret values of the process that made them")
        return v

    @field_validator("user", mode="before")
    @classmethod
    def _user(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)  # `user: 1000` in YAML
        if v is None:
            return v
        if (not isinstance(v, str) or not USER.fullmatch(v)
                or any(part.isdigit() and int(part) > MAX_ID for part in v.split(":"))):
            raise ValueError(f"{v!r} is not a user: give a uid or user name, optionally "
                             "followed by ':' and a gid or group (1000, 1000:1000, nobody)")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError("use lower-case letters, digits, '.', '_' or '-' (at most 63)")
        return v

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if not registry.is_registered(v):
            if registry.is_installed(v):
                raise ValueError(f"backend {v!r} is left out by SBX_ADAPTERS "
                                 f"({','.join(registry.selection())})")
            raise ValueError(f"unknown backend {v!r} (known: {', '.join(registry.names())})")
        return v

    @field_validator("secrets")
    @classmethod
    def _references_only(cls, v: dict[str, str]) -> dict[str, str]:
        for key, ref in v.items():
            if not SECRET_REF.fullmatch(str(ref)):
                raise ValueError(
                    f"secret {key!r} must be a reference such as env:VARIABLE, never the value"
                )
        return v

    @field_validator("services")
    @classmethod
    def _service_names(cls, v: dict[str, Service]) -> dict[str, Service]:
        for key in v:
            if not _NAME.fullmatch(key):
                raise ValueError(f"service name {key!r}: use lower-case letters, digits, "
                                 "'.', '_' or '-' (at most 63)")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        try:
            return dict(validate_label(str(k), str(val)) for k, val in v.items())
        except BadInput as exc:
            raise ValueError(str(exc)) from None

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "description": self.description}


class ProfileError(BadInput):
    """A profile file that cannot be used: names the file, the field and the reason."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(_one_line(problems))


def _one_line(problems: list[str]) -> str:
    """Several problems of one file as one line, the file named once."""
    where = problems[0].split(": ", 1)[0] + ": "
    if len(problems) > 1 and all(p.startswith(where) for p in problems):
        return where + "; ".join(p[len(where):] for p in problems)
    return "; ".join(problems)


def _builtin_dir() -> Path:
    from importlib.resources import files

    return Path(str(files("sandboxer.profiles")))


# -- trusting a working folder's profiles ----------------------------------------------------

TRUST_FILE = "trusted-profile-folders.json"  # in the user config folder, mode 0600
_announced: set[tuple[str, str]] = set()  # (folder, digest) told about in this process


def project_folder() -> Path:
    """The working folder's `.sbx/profiles`."""
    return Path.cwd() / ".sbx" / "profiles"


def trust_file() -> Path:
    from sandboxer.core.rules.settings import user_config_dir

    return user_config_dir() / TRUST_FILE


def profile_files(folder: Path) -> dict[str, bytes]:
    """The profile files of a folder (file name -> content), read once: what is digested is
    what is loaded, so a file changed after the check is never used unchecked."""
    files: dict[str, bytes] = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return files
    for path in entries:
        if path.suffix in SUFFIXES and path.is_file():
            try:
                files[path.name] = path.read_bytes()
            except OSError:
                continue
    return files


def named_files(folder: Path, files: dict[str, bytes]) -> dict[str, bytes | None]:
    """Every other file the folder's profiles have sbx or a backend read (absolute path ->
    content, None when absent or unreadable), resolved as the backends resolve them, so that
    trusting the folder covers them too: a profile's `compose.file` (relative to the profile)
    or inline `compose.project`, and what a compose file reads (`env_file:`, `extends:` and
    `include:` files, secret and config files, the `.env` beside it); an ssh inventory or
    Packer manifest (`options.inventory`, `options.packer_manifest`, relative to the working
    folder the profiles are used from) and the `key` and `known_hosts` files in it."""
    found: dict[str, bytes | None] = {}
    root = folder.parent.parent  # the folder is <working folder>/.sbx/profiles

    def read(path: Path | None) -> bytes | None:
        if path is None:
            return None
        if str(path) not in found:
            try:
                found[str(path)] = path.read_bytes() if path.is_file() else None
            except OSError:
                found[str(path)] = None
        return found[str(path)]

    def at(base: Path | None, value: Any, variables: bool = False) -> Path | None:
        if not isinstance(value, str) or not value:
            return None
        path = Path(os.path.expandvars(value) if variables else value).expanduser()
        if not path.is_absolute():
            if base is None:  # an inline project's relative path names nothing
                return None
            path = base / path
        return Path(os.path.abspath(path))

    def parsed(content: bytes | None, as_json: bool = False) -> Any:
        try:
            return (json.loads(content) if as_json else yaml.load(content, Loader=_SAFE_LOADER)
                    ) if content else None
        except (ValueError, yaml.YAMLError):
            return None

    def compose_file(path: Path | None, depth: int) -> None:
        if path is not None and depth < 8 and str(path) not in found:
            content = read(path)
            read(path.parent / ".env")  # Compose's variables for the file
            compose(parsed(content), path.parent, depth)

    def compose(doc: Any, base: Path | None, depth: int = 0) -> None:
        if not isinstance(doc, dict):
            return
        services = doc.get("services")
        for svc in services.values() if isinstance(services, dict) else ():
            envs = svc.get("env_file") if isinstance(svc, dict) else None
            for item in envs if isinstance(envs, list) else [envs]:
                read(at(base, item.get("path") if isinstance(item, dict) else item, True))
            extends = svc.get("extends") if isinstance(svc, dict) else None
            if isinstance(extends, dict):
                compose_file(at(base, extends.get("file"), True), depth + 1)
        for section in ("secrets", "configs"):
            specs = doc.get(section)
            for spec in specs.values() if isinstance(specs, dict) else ():
                if isinstance(spec, dict):
                    read(at(base, spec.get("file"), True))
        includes = doc.get("include")
        for item in includes if isinstance(includes, list) else ():
            paths = item.get("path") if isinstance(item, dict) else item
            for path in paths if isinstance(paths, list) else [paths]:
                compose_file(at(base, path, True), depth + 1)

    def hosts(path: Path | None, manifest: bool) -> None:
        if path is None:
            return
        doc = parsed(read(path), as_json=manifest)
        base = path.resolve().parent  # as the ssh backend reads an entry's key files
        entries = (doc or {}).get("builds" if manifest else "hosts") if isinstance(doc, dict) \
            else doc
        for entry in entries if isinstance(entries, list) else ():
            entry = entry.get("custom_data") if manifest and isinstance(entry, dict) else entry
            if isinstance(entry, dict):
                read(at(base, entry.get("key")))
                read(at(base, entry.get("known_hosts")))

    for name, content in files.items():
        data = parsed(content)
        if not isinstance(data, dict):
            continue
        spec = _anchor_compose_file(data, folder / name).get("compose")
        if isinstance(spec, dict):
            compose_file(at(folder, spec.get("file")), 0)
            compose(spec.get("project"), None)
        options = data.get("options")
        if isinstance(options, dict):
            hosts(at(root, options.get("inventory")), manifest=False)
            hosts(at(root, options.get("packer_manifest")), manifest=True)
    return found


def folder_digest(folder: Path, files: dict[str, bytes]) -> str:
    """What trust records of a folder: one digest of its profile files' names and contents
    and of every file they name (`named_files`), so a change to any of them shows."""
    return digest_of({**files, **named_files(folder, files)})


def digest_of(files: dict[str, bytes | None]) -> str:
    """One digest of every file's name and content (None: the file is absent)."""
    sha = hashlib.sha256()
    for name in sorted(files):
        data = files[name]
        if data is None:
            sha.update(f"{name}\0absent\0".encode())
            continue
        sha.update(f"{name}\0{len(data)}\0".encode())
        sha.update(data)
    return f"sha256:{sha.hexdigest()}"


def _trusted() -> dict[str, str]:
    """The trusted folders (resolved path -> digest). A trust file another user could have
    written counts for nothing."""
    path = trust_file()
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            return {}
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    folders = data.get("folders") if isinstance(data, dict) else None
    if not isinstance(folders, dict):
        return {}
    return {k: v for k, v in folders.items() if isinstance(k, str) and isinstance(v, str)}


def _write_trusted(folders: dict[str, str]) -> None:
    path = trust_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump({"folders": dict(sorted(folders.items()))}, out, indent=1)
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def _profiles_folder(folder: Path | None) -> Path:
    folder = (folder or project_folder()).expanduser()
    if not folder.is_dir():
        raise BadInput(f"{folder}: no such folder (give the folder that holds the profiles, "
                       "by default ./.sbx/profiles)")
    return folder.resolve()


def trust(folder: Path | None = None) -> tuple[Path, list[str], str]:
    """Trust a folder's profiles as they are now: (the folder, its profile names, digest).
    BadInput (nothing written) for a folder that is missing or holds no profiles."""
    folder = _profiles_folder(folder)
    files = profile_files(folder)
    if not files:
        raise BadInput(f"{folder}: holds no profiles (*.yaml, *.yml): nothing to trust")
    digest = folder_digest(folder, files)
    _write_trusted({**_trusted(), str(folder): digest})
    return folder, sorted(Path(n).stem for n in files), digest


def untrust(folder: Path | None = None) -> tuple[Path, bool]:
    """Forget a folder's trust: (the folder, whether it was trusted)."""
    raw = (folder or project_folder()).expanduser()
    folder = raw.resolve() if raw.exists() else Path(os.path.abspath(raw))
    trusted = _trusted()
    if str(folder) not in trusted:
        return folder, False
    del trusted[str(folder)]
    _write_trusted(trusted)
    return folder, True


def trusted_project_files() -> tuple[Path, dict[str, bytes]] | None:
    """The working folder's profiles when the folder is trusted and unchanged since; else
    None, with one line on stderr (once per process) when it holds profiles."""
    folder = project_folder()
    files = profile_files(folder)
    if not files:
        return None
    resolved = folder.resolve()
    digest = folder_digest(resolved, files)
    recorded = _trusted().get(str(resolved))
    if recorded == digest:
        return resolved, files
    if (str(resolved), digest) not in _announced:
        _announced.add((str(resolved), digest))
        why = ("its profiles or a file they name changed since you trusted them" if recorded
               else "the folder is not trusted")
        print(f"sbx: ignoring the profiles in {resolved}: {why}; review them, then run "
              f"`sbx profiles trust {resolved}` to use them", file=sys.stderr)
    return None


def _search() -> tuple[list[Path], dict[Path, dict[str, bytes]]]:
    """The folders in increasing precedence, and the content of the trusted working folder's
    profiles as checked."""
    from sandboxer.core.rules.settings import user_config_dir

    folders = [_builtin_dir(), user_config_dir() / "profiles"]
    pinned: dict[Path, dict[str, bytes]] = {}
    project = trusted_project_files()
    if project is not None:
        folders.append(project[0])
        pinned[project[0]] = project[1]
    from sandboxer.core.rules.settings import profile_path

    folders += [Path(p).expanduser() for p in profile_path()]
    return folders, pinned


def search_path() -> list[Path]:
    """Folders in increasing precedence (the working folder's only while trusted)."""
    return _search()[0]


# libyaml's safe loader where PyYAML was built with it: the same documents, a seventh of the
# time (the pure-Python one was most of a create's own cost)
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path, pinned: dict[Path, dict[str, bytes]] | None = None) -> dict[str, Any]:
    held = (pinned or {}).get(path.parent, {}).get(path.name)
    try:
        text = held.decode() if held is not None else path.read_text()
    except UnicodeDecodeError as exc:
        raise ProfileError([f"{path}: cannot read: {exc}"]) from None
    except OSError as exc:
        raise ProfileError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    try:
        data = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ProfileError([f"{path}:{where}: invalid YAML: {problem}"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError([f"{path}: a profile must be a mapping of fields, not {type(data).__name__}"])
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _anchor_compose_file(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A relative `compose.file` is relative to the profile file that names it (an absolute
    path from here on, as the resolved profile is stored)."""
    compose = data.get("compose")
    file = compose.get("file") if isinstance(compose, dict) else None
    if not isinstance(file, str) or not file:
        return data
    where = Path(file).expanduser()
    if not where.is_absolute():
        where = Path(os.path.abspath(path.parent / where))
    return {**data, "compose": {**compose, "file": str(where)}}


def check_profile_name(name: Any, what: str = "profile") -> str:
    """A profile is named, never a path: a name on the search path is the only way a caller
    (a service request above all) picks one, so `/etc/x` or `../x` reads no file."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = repr(name)[:80]
        raise BadInput(f"bad {what} name {shown}: a profile is named by lower-case letters, "
                       "digits, '.', '_' or '-' (at most 63), never by a path")
    return name


# Fields of a profile that name a file on the host that runs sbx. A document sent to the
# service (docs/service.md) may name none of them: the service's files are not the caller's.
HOST_FILE_FIELDS = (("compose", "file"), ("options", "inventory"),
                    ("options", "packer_manifest"))


def refuse_host_files(document: Any) -> None:
    """BadInput naming the first field of `document` that names a host file (compose.file,
    options.inventory, options.packer_manifest; in an inline compose project, env files,
    builds, included, extended, secret and config files, and bind mounts, with
    `compose.allow: [binds]`), or an `extends:` that is not a name."""
    if not isinstance(document, dict):
        return
    if "extends" in document:
        check_profile_name(document["extends"], "extends: profile")
    found = [f"{section}.{field}" for section, field in HOST_FILE_FIELDS
             if isinstance(document.get(section), dict)
             and document[section].get(field) is not None]
    compose = document.get("compose")
    if isinstance(compose, dict):
        if "binds" in (compose.get("allow") or []):
            found.append("compose.allow: binds")
        found += _project_host_files(compose.get("project"))
    if found:
        raise BadInput(f"{found[0]}: a profile sent to the service may not name a file or "
                       "folder of the service's host; put the profile on its search path")


def _project_host_files(project: Any) -> list[str]:
    """The keys of an inline compose project that would read the host's files."""
    if not isinstance(project, dict):
        return []
    found = [f"compose.project.{key}" for key in ("include",) if key in project]
    for section in ("secrets", "configs"):
        specs = project.get(section)
        found += [f"compose.project.{section}.{name}.file"
                  for name, spec in (specs.items() if isinstance(specs, dict) else ())
                  if isinstance(spec, dict) and "file" in spec]
    services = project.get("services")
    for name, svc in services.items() if isinstance(services, dict) else ():
        if not isinstance(svc, dict):
            continue
        where = f"compose.project.services.{name}"
        found += [f"{where}.{key}" for key in ("env_file", "build", "extends") if key in svc]
        for volume in svc.get("volumes") or []:
            source = volume.get("source") if isinstance(volume, dict) else \
                str(volume).split(":")[0]
            kind = volume.get("type") if isinstance(volume, dict) else None
            if kind == "bind" or (isinstance(source, str) and source.startswith(("/", ".", "~"))):
                found.append(f"{where}.volumes")
    return found


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The fields a profile allows at `loc` (a path into Profile's models), for a hint."""
    import typing

    model: Any = Profile
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return []
        todo, model = [field.annotation], None
        while todo and model is None:
            kind = todo.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                model = kind
            todo += list(typing.get_args(kind))
        if model is None:
            return []
    return [f.alias or name for name, f in model.model_fields.items()]


class ProfileLoader:
    """Resolves names along the search path; one instance per command."""

    def __init__(self, folders: list[Path] | None = None) -> None:
        if folders is None:
            self.folders, self._pinned = _search()
        else:
            self.folders, self._pinned = folders, {}

    def _has(self, path: Path) -> bool:
        held = self._pinned.get(path.parent)
        return path.name in held if held is not None else path.is_file()

    def _find(self, name: str, below: int | None = None) -> tuple[int, Path] | None:
        top = len(self.folders) if below is None else below
        for index in range(top - 1, -1, -1):
            for suffix in SUFFIXES:
                candidate = self.folders[index] / f"{name}{suffix}"
                if self._has(candidate):
                    return index, candidate
        return None

    def names(self) -> dict[str, Path]:
        """Every profile name and the file it comes from (the one that wins)."""
        found: dict[str, Path] = {}
        for folder in self.folders:
            if folder in self._pinned:
                for file in self._pinned[folder]:
                    found[Path(file).stem] = folder / file
            elif folder.is_dir():
                for path in sorted(folder.iterdir()):
                    if path.suffix in SUFFIXES and path.is_file():
                        found[path.stem] = path
        return dict(sorted(found.items()))

    def source(self, name: str) -> Path | None:
        """The file the profile `name` is read from, if any."""
        hit = self._find(name)
        return hit[1] if hit else None

    def _resolve(self, data: dict[str, Any], path: Path, layer: int | None,
                 name: str, stack: tuple[str, ...]) -> dict[str, Any]:
        """`data` with its `extends:` chain merged underneath it."""
        own = _anchor_compose_file({k: v for k, v in data.items() if k != "extends"}, path)
        parent = data.get("extends")
        if parent is None:
            return own
        if not isinstance(parent, str) or not _NAME.fullmatch(parent):
            raise ProfileError([f"{path}: extends: must be a profile name (lower-case "
                                "letters, digits, '.', '_' or '-'), never a path"])
        if parent != name and parent in stack:
            raise ProfileError([f"{path}: extends: cycle {' -> '.join((*stack, parent))}"])
        hit = self._find(parent, below=layer if parent == name else None)
        if hit is None or hit[1] == path:
            raise ProfileError([f"{path}: extends: no profile named {parent!r} to inherit from"])
        parent_layer, parent_path = hit
        base = self._resolve(_read_yaml(parent_path, self._pinned), parent_path, parent_layer,
                             parent, (*stack, parent))
        base.pop("name", None)
        if parent != name:
            base.pop("pool", None)  # a pool is a profile's own (docs/pools.md)
        return _merge(base, own)

    def _validate(self, merged: dict[str, Any], path: Path, name: str) -> Profile:
        merged.setdefault("name", name)
        try:
            return Profile.model_validate(merged)
        except ValidationError as exc:
            problems = [f"{path}: {problem}"
                        for problem in plain_problems(exc.errors(), _fields_at)]
            raise ProfileError(problems) from None

    def load(self, name: str) -> Profile:
        """The named profile, resolved. BadInput (exit 2) for a name that is not one (a
        path), NotFound (exit 3) when no file has that name."""
        check_profile_name(name)
        hit = self._find(name)
        if hit is None:
            raise NotFound(
                f"no profile named {name!r} (known: {', '.join(self.names()) or 'none'})"
            )
        layer, path = hit
        return self.load_file(path, layer=layer, name=name)

    def load_file(self, path: Path, layer: int | None = None, name: str | None = None) -> Profile:
        """A profile from an explicit file; its `extends:` resolves along the search path."""
        data = _read_yaml(path, self._pinned)
        name = name or str(data.get("name") or path.stem)
        merged = self._resolve(data, path, layer, name, (name,))
        return self._validate(merged, path, name)

    def load_mapping(self, data: dict[str, Any], where: str = "the profile document") -> Profile:
        """A profile given as a mapping (from a program, or a service request); its
        `extends:` resolves along the search path."""
        if not isinstance(data, dict):
            raise ProfileError([f"{where}: a profile is a mapping of fields"])
        name = str(data.get("name") or "inline")
        merged = self._resolve(dict(data), Path(where), None, name, (name,))
        return self._validate(merged, Path(where), name)


def json_schema() -> dict[str, Any]:
    """The profile file's JSON Schema (`sbx profiles schema`, docs/profile.schema.json):
    what editors and CI check a profile against before sbx reads it."""
    from pydantic.json_schema import GenerateJsonSchema

    class Schema(GenerateJsonSchema):
        def encode_default(self, dft: Any) -> Any:
            if isinstance(dft, timedelta):  # as a profile writes it, not ISO 8601
                return format_duration(dft)
            return super().encode_default(dft)

    schema = Profile.model_json_schema(schema_generator=Schema)
    schema["properties"]["name"]["description"] = (
        "the profile's name (default: the file's name without .yaml)")
    schema["required"] = [r for r in schema.get("required", []) if r != "name"]
    schema["properties"]["extends"] = {
        "type": "string", "description": "a profile to inherit (mappings merge, lists replace)"}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def dump(profile: Profile) -> dict[str, Any]:
    """The resolved profile as stored and shown: durations as `30m`, sizes in bytes."""
    return profile.model_dump(mode="json")
