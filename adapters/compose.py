"""The compose backend: a sandbox is a Docker Compose project, run by the real Compose
(`docker compose` where the plugin is installed, else `docker-compose`) against the engine
the docker backend reaches (`DOCKER_HOST`, local or `ssh://`).

One project per sandbox, named after its id. Beside the user's compose file sbx hands Compose
an override file of its own (in `$SBX_HOME/compose/<project>/`) that puts sbx's labels on
every service, network and named volume, keeps the project's networks internal under
`network: none`, gives every service the profile's limits, and names the profile's env and
secrets for the named service: their values reach Compose in its environment, never a file.
Every key of the compose file (as `compose config` prints it) must be on an allow-list of
keys known to keep a project inside its sandbox; any other is refused by its key path. What a
listed key asks of the host (binds, privileged mode, host networking, ...) is refused too,
before anything is written, unless the profile allows it.

Everything after `up` goes through the engine's API, as the docker backend does, finding the
project's objects by the `sbx.compose` label alone: get, list, exec and logs (the named
service), pause and resume (every container), snapshot (one image per service, one
checkpoint), metrics (the containers added up). Destroy is `compose down --volumes
--remove-orphans`, then a sweep by label of whatever is left, so an interrupted create or a
lost state folder leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from sandboxer.adapters.base import (
    LABEL_CHECKPOINT,
    LABEL_COMPOSE,
    LABEL_SERVICE,
    AdapterError,
    Artifact,
    BackendObject,
    BackendObjectGone,
    BackendUnavailable,
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    Endpoint,
    ExecResult,
    FileInfo,
    Health,
    InvalidRequest,
    MetricSample,
    PtyChannel,
    Stdin,
    failpoint,
    state_folder,
)
from sandboxer.adapters.base import (
    Adapter as _Adapter,
)
from sandboxer.adapters.docker import (
    BASE_IMAGE,
    GVISOR_RUNTIME,
    DockerAdapter,
    _in_thread,
    _maybe_restarted,
    _parse_time,
    _restarted_at,
    _short,
    build_base_image,
    docker_errors,  # docker-py as sandboxer.adapters.docker imports it: no paramiko for a local engine
    engine_url,
    sample_from_stats,
)

STATE_FOLDER = "compose"  # in SBX_HOME: a folder per project (the override, an inline project)
OVERRIDE_FILE = "sbx-override.json"
INLINE_FILE = "compose.json"
FILES_RECORD = "files.json"  # the files `up` was given, for `down`
CHECKPOINT_REPOSITORY = "sandboxer/compose-checkpoint"  # tags <checkpoint>.<service>
COMPOSE_TIMEOUT_S = 600.0  # `config` and `up` (which may pull or build images)
DOWN_TIMEOUT_S = 120.0  # what `down` leaves after this, the sweep removes
SWEEP_WAIT_S = 30.0
COMPOSE_SERVICE = "com.docker.compose.service"
COMPOSE_NUMBER = "com.docker.compose.container-number"
COMPOSE_ONEOFF = "com.docker.compose.oneoff"
# what the caller's shell may set that would make Compose run another project, other files,
# other services, or check ssh host keys less strictly (docker-compose 1.x's paramiko mode
# accepts unknown host keys; without it it runs the system ssh client, which checks them)
DROPPED_ENV = ("COMPOSE_FILE", "COMPOSE_PROJECT_NAME", "COMPOSE_PROFILES",
               "COMPOSE_PATH_SEPARATOR", "COMPOSE_PARAMIKO_SSH", "DOCKER_CONTEXT")
INSTALL_HINT = ("install Docker Compose: `make test` does (scripts/ensure-compose.sh); on "
                "Debian `apt-get install docker-compose`, or Docker's docker-compose-plugin")


@cache
def _compose_on(path: str | None) -> tuple[str, ...] | None:
    docker_cli = shutil.which("docker", path=path)
    if docker_cli:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run([docker_cli, "compose", "version"], capture_output=True,
                              timeout=30).returncode == 0:
                return (docker_cli, "compose")
    legacy = shutil.which("docker-compose", path=path)
    return (legacy,) if legacy else None


def compose_command() -> tuple[str, ...] | None:
    """`docker compose` when the docker CLI has the plugin, else `docker-compose`, else None."""
    return _compose_on(os.environ.get("PATH"))


def compose_says(err: bytes | str) -> str:
    """Compose's own message in one line: its error lines (from the first `ERROR:`), else
    everything it said."""
    text = err.decode(errors="replace") if isinstance(err, bytes) else err
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines)
                  if line.startswith(("ERROR:", "Error", "error"))), None)
    if first is not None:
        lines = lines[first:]
    said = " ".join(line.removeprefix("ERROR:").strip() for line in lines)
    return said[:1000] or "no message from compose"


# -- what a compose file may ask of the host --------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    service: str  # "" for a key outside any service's own checks
    field: str  # the field, or the whole key path (services.app.build.network)
    what: str
    allowance: str | None  # what compose.allow must list; None: nothing allows it

    def message(self, where: str) -> str:
        if self.allowance is None:
            return (f"{where}: {self.field}: {self.what} is refused: sbx accepts only the "
                    "compose keys and values it knows keep a project inside its sandbox "
                    "(docs/adapters.md lists them)")
        service = f"service {self.service!r}: " if self.service else ""
        return (f"{where}: {service}{self.field}: {self.what} is refused "
                f"(it reaches outside the sandbox); allow it in the profile with "
                f"compose: {{allow: [{self.allowance}]}}")


# The allow-list: every key a compose file may use, level by level, as Compose prints the
# file (`compose config`, 1.x and 2.x). A key not listed is refused, naming its path; what is
# listed is safe in itself or has its value checked by `refusals` below. A key's entry is ANY
# (any value), a mapping (the keys allowed inside it), Each(...) (the keys allowed in each
# mapping of a list; plain strings are checked by `refusals`), Named(...) (a mapping of the
# file's own names, each as given), Only(...) (these values and no other), or Needs(name)
# (allowed when compose.allow lists `name`). Keys starting `x-` are extensions Compose ignores.
ANY = None


@dataclass(frozen=True)
class Each:
    keys: Mapping[str, Any]


@dataclass(frozen=True)
class Named:
    spec: Any


@dataclass(frozen=True)
class Only:
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Needs:
    allowance: str
    what: str


# the checked keys: safe or refused by their value in `refusals` (binds, ports, namespaces...)
_CHECKED = {key: ANY for key in (
    "privileged", "network_mode", "pid", "ipc", "uts", "userns_mode", "cgroup", "cap_add",
    "devices", "device_cgroup_rules", "security_opt", "ports", "volumes_from")}
_HEALTHCHECK = {key: ANY for key in ("test", "interval", "timeout", "retries", "start_period",
                                     "start_interval", "disable")}
SERVICE_KEYS: dict[str, Any] = {
    **_CHECKED,
    # what runs, and as whom, inside the service's own container
    **{key: ANY for key in (
        "image", "command", "entrypoint", "environment", "working_dir", "user", "group_add",
        "init", "tty", "stdin_open", "read_only", "cap_drop", "stop_signal",
        "stop_grace_period", "restart", "labels", "annotations", "profiles", "platform",
        "pull_policy", "attach", "hostname", "domainname", "mac_address")},
    "healthcheck": _HEALTHCHECK,
    # limits: they only take from the container (the profile's own are added to each service)
    **{key: ANY for key in (
        "cpus", "cpu_shares", "cpu_quota", "cpu_period", "cpuset", "mem_limit",
        "mem_reservation", "memswap_limit", "mem_swappiness", "pids_limit", "shm_size",
        "ulimits", "tmpfs")},
    # kernel settings of the container's own namespaces (a host namespace is refused above)
    "sysctls": ANY,
    # variables from a file, read by Compose where sbx runs, as `environment:` gives them
    "env_file": ANY,
    # names and order inside the project; the project's networks decide what is reached
    **{key: ANY for key in ("depends_on", "links", "expose", "extra_hosts", "dns", "dns_opt",
                            "dns_search")},
    "networks": Named({key: ANY for key in (
        "aliases", "ipv4_address", "ipv6_address", "link_local_ips", "mac_address", "priority",
        "gw_priority", "interface_name")}),
    "external_links": Needs("external", "links to containers outside the project"),
    # the engine's own log files; a driver that sends logs elsewhere reaches the network
    "logging": {"driver": Only(("json-file", "local", "none")), "options": ANY},
    # volumes, secrets and configs: which source each one is, checked in `refusals`
    "volumes": Each({"type": Only(("volume", "bind", "tmpfs", "npipe")), "source": ANY,
                     "target": ANY, "read_only": ANY, "consistency": ANY, "bind": ANY,
                     "volume": {"nocopy": ANY, "subpath": ANY},
                     "tmpfs": {"size": ANY, "mode": ANY}}),
    **{key: Each({k: ANY for k in ("source", "target", "uid", "gid", "mode")})
       for key in ("secrets", "configs")},
    # deploy: limits and restart only (reservations.devices would hand out the host's GPUs)
    "deploy": {"resources": {"limits": {"cpus": ANY, "memory": ANY, "pids": ANY},
                             "reservations": {"cpus": ANY, "memory": ANY}},
               "restart_policy": ANY, "labels": ANY},
    # a build from the file's context with its own arguments (no host network, secrets, ssh
    # agent, extra contexts, privileged steps or tags over the engine's other images)
    "build": {"context": ANY, "dockerfile": ANY, "dockerfile_inline": ANY, "args": ANY,
              "target": ANY, "labels": ANY, "cache_from": ANY, "shm_size": ANY,
              "no_cache": ANY, "pull": ANY, "network": Only(("default", "none"))},
}
# the project's own networks and volumes: private bridges and local volumes (checked in
# `refusals`); ipam and driver options (bridge names, subnets) would touch the host's
NETWORK_KEYS = {key: ANY for key in ("driver", "external", "name", "internal", "attachable",
                                     "labels", "enable_ipv6", "enable_ipv4")}
VOLUME_KEYS = {key: ANY for key in ("driver", "driver_opts", "external", "name", "labels")}
# a secret's or config's source: a file (binds) or an external one, checked in `refusals`,
# or inline content (`environment:` would read a variable of sbx's own environment)
SECRET_KEYS = {key: ANY for key in ("file", "external", "name", "labels", "content")}
TOP_KEYS: dict[str, Any] = {
    "version": ANY, "name": ANY,
    "services": Named(SERVICE_KEYS), "networks": Named(NETWORK_KEYS),
    "volumes": Named(VOLUME_KEYS), "secrets": Named(SECRET_KEYS), "configs": Named(SECRET_KEYS),
}


def unknown_keys(value: Any, spec: Any = TOP_KEYS, path: str = "") -> list[Refusal]:
    """Every key of `value` the allow-list (`spec`) does not list, or lists with a value or
    an allowance it does not have, by its key path."""
    if spec is ANY:
        return []
    if isinstance(spec, Only):
        said = " ".join(str(value).split())[:80]
        return [] if value in spec.values else [Refusal(
            "", path, f"{said} (accepted: {', '.join(map(str, spec.values))})", None)]
    if isinstance(spec, Needs):
        return [Refusal("", path, spec.what, spec.allowance)] if value else []
    if isinstance(spec, Each):
        items = value if isinstance(value, list) else []
        return [found for index, item in enumerate(items) if isinstance(item, Mapping)
                for found in unknown_keys(item, spec.keys, f"{path}[{index}]")]
    if not isinstance(value, Mapping):
        return []
    if isinstance(spec, Named):
        return [found for key, item in value.items()
                for found in unknown_keys(item, spec.spec, f"{path}.{key}".lstrip("."))]
    found: list[Refusal] = []
    for key, item in value.items():
        where = f"{path}.{key}".lstrip(".")
        if str(key).startswith("x-"):
            continue
        if key not in spec:
            found.append(Refusal("", where, "this key", None))
            continue
        found += unknown_keys(item, spec[key], where)
    return found


HOST_PATH_PREFIXES = ("/", ".", "~", "\\\\")
SAFE_SECURITY_OPTS = ("no-new-privileges",)


def _is_host_path(source: str) -> bool:
    return source.startswith(HOST_PATH_PREFIXES) or (len(source) > 1 and source[1] == ":")


def _own_name(key: str, spec: Mapping[str, Any], project: str) -> bool:
    """A network or volume named by the project (`<project>_<key>`), not one of a fixed name
    that every sandbox made from the file would share."""
    name = spec.get("name")
    return name is None or name == f"{project}_{key}"


def _external(spec: Any) -> bool:
    return isinstance(spec, Mapping) and bool(spec.get("external"))


def refusals(config: Mapping[str, Any], project: str) -> list[Refusal]:
    """What the normalized compose file (`compose config`) asks of the host: any key the
    allow-list does not know first, then service by service, in the order of the file."""
    found: list[Refusal] = unknown_keys(config)
    networks = config.get("networks") or {}
    volumes = config.get("volumes") or {}
    secrets = {**(config.get("configs") or {}), **(config.get("secrets") or {})}
    for name, raw in (config.get("services") or {}).items():
        svc = raw if isinstance(raw, Mapping) else {}

        def refuse(field: str, what: str, allowance: str, name: str = name) -> None:
            found.append(Refusal(name, field, what, allowance))

        if svc.get("privileged"):
            refuse("privileged", "privileged: true", "privileged")
        mode = str(svc.get("network_mode") or "")
        if mode == "host":
            refuse("network_mode", "network_mode: host", "host-network")
        elif mode and mode != "none" and not mode.startswith("service:"):
            refuse("network_mode", f"network_mode: {mode} (a network outside the project)",
                   "external")
        for field in ("pid", "ipc", "uts", "userns_mode", "cgroup"):
            value = str(svc.get(field) or "")
            if value == "host":
                refuse(field, f"{field}: host", "host-namespaces")
            elif value.startswith("container:"):
                refuse(field, f"{field}: {value} (a container outside the project)", "external")
        if svc.get("cap_add"):
            refuse("cap_add", f"cap_add: {list(svc['cap_add'])}", "cap-add")
        for field in ("devices", "device_cgroup_rules"):
            if svc.get(field):
                refuse(field, f"{field}: {list(svc[field])}", "devices")
        weak = [o for o in svc.get("security_opt") or []
                if not str(o).startswith(SAFE_SECURITY_OPTS)]
        if weak:
            refuse("security_opt", f"security_opt: {weak}", "security-opt")
        if svc.get("ports"):
            refuse("ports", "ports published on the host", "ports")
        for volume in svc.get("volumes") or []:
            if isinstance(volume, Mapping):
                kind, source = volume.get("type"), str(volume.get("source") or "")
                if kind in ("bind", "npipe") or (kind is None and _is_host_path(source)):
                    refuse("volumes", f"a bind mount of the host's {source or 'path'}", "binds")
                elif kind == "volume" and source in volumes and _external(volumes[source]):
                    refuse("volumes", f"the external volume {source}", "external")
                continue
            source, sep, _ = str(volume).partition(":")
            if sep and _is_host_path(source):
                refuse("volumes", f"a bind mount of the host's {source}", "binds")
            elif sep and source in volumes and _external(volumes[source]):
                refuse("volumes", f"the external volume {source}", "external")
        for other in svc.get("volumes_from") or []:
            if str(other).startswith("container:"):
                refuse("volumes_from", f"{other} (a container outside the project)", "external")
        for field in ("secrets", "configs"):
            for ref in svc.get(field) or []:
                key = ref.get("source") if isinstance(ref, Mapping) else ref
                spec = secrets.get(key) if isinstance(key, str) else None
                if isinstance(spec, Mapping) and spec.get("file"):
                    refuse(field, f"{key} from the host's file {spec['file']}", "binds")
                elif _external(spec):
                    refuse(field, f"the external {field[:-1]} {key}", "external")
        used = svc.get("networks") or {}
        for key in (used if isinstance(used, Mapping) else {n: None for n in used}):
            spec = networks.get(key) or {}
            if _external(spec):
                refuse("networks", f"the external network {key}", "external")
            elif not _own_name(key, spec, project):
                refuse("networks", f"the network {key} named {spec.get('name')!r} (shared by "
                       "every sandbox of this file)", "external")
            elif str(spec.get("driver") or "bridge") != "bridge":
                refuse("networks", f"the network {key} of driver {spec['driver']} (not a "
                       "private bridge)", "host-network")
        for volume in svc.get("volumes") or []:
            key = (volume.get("source") if isinstance(volume, Mapping)
                   else str(volume).partition(":")[0])
            spec = volumes.get(key) if isinstance(key, str) else None
            if not isinstance(spec, Mapping) or _external(spec):
                continue
            if not _own_name(key, spec, project):
                refuse("volumes", f"the volume {key} named {spec.get('name')!r} (shared by "
                       "every sandbox of this file)", "external")
            elif (spec.get("driver_opts") or {}).get("device"):
                refuse("volumes", f"the volume {key} on the host's "
                       f"{spec['driver_opts']['device']}", "binds")
            elif str(spec.get("driver") or "local") != "local":
                refuse("volumes", f"the volume {key} of driver {spec['driver']}", "external")
    return found


def _networks_used(config: Mapping[str, Any]) -> set[str]:
    used: set[str] = set()
    for raw in (config.get("services") or {}).values():
        svc = raw if isinstance(raw, Mapping) else {}
        if svc.get("network_mode"):
            continue
        networks = svc.get("networks")
        used.update(networks or ["default"])
    return used


# -- the project ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Project:
    """What one sandbox's `compose` invocations are given."""

    name: str  # the project name: the sandbox id
    service: str  # the named service: exec, logs, setup
    file: str | None  # the user's compose file (absolute), or None for an inline project
    inline: Mapping[str, Any] | None
    allow: frozenset[str]
    where: str  # names the compose file in messages

    @property
    def ref(self) -> str:
        return f"{self.name}/{self.service}"

    @classmethod
    def of(cls, request: CreateRequest) -> Project:
        spec = request.compose
        if not spec:
            raise InvalidRequest("the compose backend needs the profile's compose: "
                                 "{file: PATH, service: NAME}")
        file, inline, service = spec.get("file"), spec.get("project"), spec.get("service")
        if not isinstance(service, str) or not service:
            raise InvalidRequest("compose.service: name the service exec and logs go to")
        if file is not None:
            path = Path(str(file))
            if not path.is_absolute() or not path.is_file():
                raise InvalidRequest(f"compose.file: {file} does not exist (a path relative to "
                                     "the profile's file)")
            return cls(request.sandbox_id, service, str(path), None,
                       frozenset(spec.get("allow") or ()), f"compose file {path}")
        if not isinstance(inline, Mapping):
            raise InvalidRequest("compose: give the compose file as file: PATH, or inline "
                                 "as project: {services: ...}")
        return cls(request.sandbox_id, service, None, inline,
                   frozenset(spec.get("allow") or ()), "the profile's compose.project")


def parse_ref(ref: str) -> tuple[str, str]:
    project, _, service = ref.partition("/")
    return project, service


def _literal(text: str) -> str:
    """`text` as Compose reads it back: it interpolates `$NAME` in every value of a file."""
    return text.replace("$", "$$")


def _project_labels(request: CreateRequest, ref: str) -> dict[str, str]:
    return {k: _literal(v) for k, v in {**request.labels, LABEL_COMPOSE: ref}.items()}


def build_override(config: Mapping[str, Any], project: Project, request: CreateRequest, *,
                   version: Any = None, images: Mapping[str, str] | None = None,
                   deploy_limits: bool = False) -> dict[str, Any]:
    """sbx's override file: labels everywhere, the profile's limits on every service, its
    env (names only: the values are in Compose's environment) and command for the named
    service, internal networks under `network: none`, checkpoint images on restore."""
    labels = _project_labels(request, project.ref)
    limits = request.resources
    services: dict[str, Any] = {}
    for name, raw in (config.get("services") or {}).items():
        svc: dict[str, Any] = {"labels": {**labels, LABEL_SERVICE: _literal(name)}}
        own_deploy = ((raw or {}).get("deploy") or {}).get("resources", {}).get("limits")
        if deploy_limits and own_deploy:  # Compose v2 refuses both spellings at once
            cap: dict[str, Any] = {}
            if limits.cpu:
                cap["cpus"] = str(limits.cpu)
            if limits.memory_bytes:
                cap["memory"] = str(limits.memory_bytes)
            if limits.pids:
                cap["pids"] = limits.pids
            if cap:
                svc["deploy"] = {"resources": {"limits": cap}}
        else:
            if limits.cpu:
                svc["cpus"] = limits.cpu
            if limits.memory_bytes:
                svc["mem_limit"] = limits.memory_bytes
                svc["memswap_limit"] = limits.memory_bytes  # no swap beyond the limit
            if limits.pids:
                svc["pids_limit"] = limits.pids
        if name == project.service:
            if request.env:
                svc["environment"] = {key: None for key in request.env}
            if request.command is not None:
                svc["command"] = [_literal(arg) for arg in request.command]
            if request.mounts:  # sbx's named volumes (docs/volumes.md), outside the project
                svc["volumes"] = [{"type": "volume", "source": m.ref, "target": m.path,
                                   "read_only": m.read_only, "volume": {"nocopy": True}}
                                  for m in request.mounts]
        if images and name in images:
            svc["image"] = images[name]
        if request.isolation == "gvisor":  # every service: a file cannot set runtime: itself
            svc["runtime"] = GVISOR_RUNTIME
        services[name] = svc
    override: dict[str, Any] = {"services": services}
    if version is not None:
        override["version"] = version  # docker-compose 1.x merges files of one version only
    networks: dict[str, Any] = {}
    declared = config.get("networks") or {}
    for key in sorted(_networks_used(config) | set(declared)):
        if _external(declared.get(key)):
            continue
        networks[key] = {"labels": labels}
        if request.network == "none":
            networks[key]["internal"] = True  # services reach each other, nothing beyond
    if networks:
        override["networks"] = networks
    named = config.get("volumes") or {}
    volumes = {key: {"labels": labels} for key, spec in sorted(named.items())
               if not _external(spec)}
    for mount in request.mounts:  # external: `down --volumes` never removes them
        volumes[mount.ref] = {"external": True, "name": mount.ref}
    if volumes:
        override["volumes"] = volumes
    return override


def _main_container(containers: Sequence[Mapping[str, Any]],
                    service: str) -> Mapping[str, Any] | None:
    mine = [c for c in containers if (c.get("Labels") or {}).get(LABEL_SERVICE) == service
            and (c.get("Labels") or {}).get(COMPOSE_ONEOFF, "False") != "True"]
    mine.sort(key=lambda c: int((c.get("Labels") or {}).get(COMPOSE_NUMBER) or 1))
    return mine[0] if mine else None


def _per_service(containers: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The first container of each service."""
    found: dict[str, Mapping[str, Any]] = {}
    for name in sorted({(c.get("Labels") or {}).get(LABEL_SERVICE) or "" for c in containers}):
        if name:
            main = _main_container(containers, name)
            if main is not None:
                found[name] = main
    return found


def _total(values: Sequence[float | int | None]) -> Any:
    return None if not values or any(v is None for v in values) else sum(values)  # type: ignore[arg-type]


def add_up(samples: Sequence[MetricSample]) -> MetricSample:
    """The project's figure: each measure added up over its containers, unknown (None) if
    any container's is."""
    cpu = _total([s.cpu_pct for s in samples])
    return MetricSample(
        time=max(s.time for s in samples),
        cpu_pct=round(cpu, 2) if cpu is not None else None,
        memory_bytes=_total([s.memory_bytes for s in samples]),
        memory_limit=_total([s.memory_limit for s in samples]),
        net_rx_bytes=_total([s.net_rx_bytes for s in samples]),
        net_tx_bytes=_total([s.net_tx_bytes for s in samples]),
        pids=_total([s.pids for s in samples]),
    )


VOLUME_HELPER = "volume-helper:"  # open_volume's reference: a helper container, not a project


class ComposeAdapter(_Adapter):
    name = "compose"
    description = "Docker Compose projects on a Docker engine (local socket or DOCKER_HOST)"
    capabilities = frozenset({Capability.EXEC, Capability.LOGS, Capability.METRICS,
                              Capability.PAUSE, Capability.SNAPSHOT, Capability.FILES,
                              Capability.PROCESSES, Capability.PTY, Capability.PORTS,
                              Capability.ISOLATION_GVISOR, Capability.VOLUMES})

    def __init__(self, base_url: str | None = None, timeout: float = 60) -> None:
        self.base_url = base_url or engine_url()
        self.docker = DockerAdapter(self.base_url, timeout)
        self._configs: dict[str, dict[str, Any]] = {}  # validated, by sandbox id

    # -- volumes (docs/volumes.md): the engine's named volumes, as the docker backend keeps them

    async def create_volume(self, volume_id: str, labels: Mapping[str, str]) -> str:
        return await self.docker.create_volume(volume_id, labels)

    async def remove_volume(self, ref: str) -> None:
        await self.docker.remove_volume(ref)

    async def volume_size(self, ref: str) -> int | None:
        return await self.docker.volume_size(ref)

    async def list_volumes(self, labels: Mapping[str, str]) -> list[str]:
        return await self.docker.list_volumes(labels)

    async def open_volume(self, ref: str, labels: Mapping[str, str]) -> str:
        """The docker backend's helper container, marked so that put_archive and
        get_archive below take it for itself, not for a project."""
        return VOLUME_HELPER + await self.docker.open_volume(ref, labels)

    async def close_volume(self, helper: str) -> None:
        await self.docker.close_volume(helper.removeprefix(VOLUME_HELPER))

    async def _files_target(self, ref: str) -> str:
        if ref.startswith(VOLUME_HELPER):
            return ref.removeprefix(VOLUME_HELPER)
        return await self._main_id(ref)

    # -- running compose ----------------------------------------------------------------------

    @staticmethod
    def _command() -> tuple[str, ...]:
        command = compose_command()
        if command is None:
            raise BackendUnavailable(f"no Docker Compose (`docker compose` or "
                                     f"`docker-compose`) on PATH; {INSTALL_HINT}")
        return command

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        env["DOCKER_HOST"] = self.base_url  # this adapter's engine, whatever a context says
        env.update(extra or {})
        return env

    def _argv(self, project: str, files: Sequence[str], *args: str) -> list[str]:
        argv = [*self._command(), "-p", project]
        for file in files:
            argv += ["-f", file]
        return [*argv, *args]

    def _config(self, project: Project, request: CreateRequest) -> dict[str, Any]:
        """`compose config`: Compose's own check of the file, and the file as Compose reads
        it (relative paths made absolute, `extends` and variables resolved). A bad file is
        InvalidRequest (exit 2) with Compose's message."""
        import yaml

        with tempfile.TemporaryDirectory(prefix="sbx-compose-") as scratch:
            if project.file is not None:
                file, cwd = project.file, str(Path(project.file).parent)
            else:
                file, cwd = str(Path(scratch) / INLINE_FILE), scratch
                Path(file).write_text(json.dumps(project.inline))
            try:
                done = subprocess.run(self._argv(project.name, [file], "config"), cwd=cwd,
                                      env=self._env(request.env), capture_output=True,
                                      timeout=COMPOSE_TIMEOUT_S, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                raise AdapterError(f"{project.where}: `compose config` did not finish within "
                                   f"{COMPOSE_TIMEOUT_S:g}s") from None
            except OSError as exc:
                raise BackendUnavailable(f"cannot run Docker Compose: {exc}; {INSTALL_HINT}") from None
        if done.returncode != 0:
            said = compose_says(done.stderr or done.stdout).replace(file, "(inline project)")
            raise InvalidRequest(f"{project.where}: {said}")
        try:
            config = yaml.safe_load(done.stdout)
        except yaml.YAMLError as exc:
            raise AdapterError(f"{project.where}: cannot read what `compose config` printed: "
                               f"{exc}") from None
        if not isinstance(config, dict) or not isinstance(config.get("services"), dict) \
                or not config["services"]:
            raise InvalidRequest(f"{project.where}: it has no services")
        return config

    def _raw_version(self, project: Project) -> Any:
        """The file's own `version:`, which docker-compose 1.x wants the override to repeat."""
        if project.inline is not None:
            return project.inline.get("version")
        import yaml

        try:
            raw = yaml.safe_load(Path(project.file or "").read_text())
        except (OSError, yaml.YAMLError):
            return None
        return raw.get("version") if isinstance(raw, dict) else None

    async def _run(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
                   timeout_s: float = COMPOSE_TIMEOUT_S) -> tuple[int, bytes]:
        """A compose command: (exit status, its stderr). Killed with its group on timeout."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)
        except OSError as exc:
            raise BackendUnavailable(f"cannot run Docker Compose: {exc}; {INSTALL_HINT}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return 124, f"did not finish within {timeout_s:g}s".encode()
        return proc.returncode or 0, err or out

    def _folder(self, project: str, make: bool = False) -> Path:
        folder = state_folder() / STATE_FOLDER / project
        if make:
            folder.parent.mkdir(mode=0o700, exist_ok=True)
            folder.mkdir(mode=0o700, exist_ok=True)
        return folder

    # -- the contract -------------------------------------------------------------------------

    def validate(self, request: CreateRequest) -> None:
        project = Project.of(request)
        if request.image:
            raise CapabilityNotSupported("the compose backend takes its images from the compose "
                                         "file; remove image/template from the profile")
        if request.network == "egress":
            raise CapabilityNotSupported(
                "the compose backend cannot restrict egress (network mode 'egress'); use "
                "'none' (the project's networks internal) or 'full'")
        if request.resources.disk_bytes is not None:
            raise CapabilityNotSupported("the compose backend cannot limit disk (resources.disk)")
        if request.resources.gpu is not None:
            raise CapabilityNotSupported("the compose backend offers no GPU (resources.gpu)")
        if request.options:
            raise CapabilityNotSupported(
                f"the compose backend has no options (got {', '.join(sorted(request.options))})")
        if request.ports:  # the project's own file says what it publishes
            raise InvalidRequest(
                f"{project.where}: the compose backend publishes what the compose file's ports: "
                f"say (with compose: {{allow: [ports]}}), not the profile's ports: "
                f"{list(request.ports)}; move them to the compose file")
        config = self._config(project, request)
        services = config["services"]
        if project.service not in services:
            raise InvalidRequest(f"{project.where}: compose.service {project.service!r} is not "
                                 f"one of its services ({', '.join(services)})")
        for refusal in refusals(config, project.name):
            if refusal.allowance not in project.allow:
                raise InvalidRequest(refusal.message(project.where))
        if len(self._configs) > 64:
            self._configs.clear()
        self._configs[request.sandbox_id] = config

    async def health(self) -> Health:
        health = await self.docker.health()
        command = await asyncio.to_thread(compose_command)
        if command is None:
            return Health(False, health.credentials, f"no Docker Compose on PATH; {INSTALL_HINT}")
        said = " ".join([Path(command[0]).name, *command[1:]])
        return replace(health, detail=f"{said} ({command[0]}); {health.detail}")

    async def ensure_available(self) -> None:
        await self.docker.ensure_available()
        await asyncio.to_thread(self._command)

    async def instance_id(self) -> str | None:
        return await self.docker.instance_id()

    async def ensure_isolation(self, isolation: str) -> None:
        await self.docker.ensure_isolation(isolation)

    async def create(self, request: CreateRequest) -> BackendObject:
        return await self._up(request, images=None)

    async def restore(self, artifact: str, request: CreateRequest) -> BackendObject:
        images = await self.docker._call(lambda api: _checkpoint_images(api, artifact))
        if not images:
            raise BackendObjectGone(f"the images of checkpoint artifact {artifact} are gone")
        return await self._up(request, images=images)

    async def _up(self, request: CreateRequest, images: Mapping[str, str] | None) -> BackendObject:
        project = Project.of(request)
        config = self._configs.pop(request.sandbox_id, None)
        if config is None:  # not validated in this process: as the core would have
            await asyncio.to_thread(self.validate, request)
            config = self._configs.pop(request.sandbox_id)
        await self.docker.ensure_available()  # refuses a plaintext engine before compose runs
        wanted = {str(svc.get("image")) for svc in config["services"].values()
                  if isinstance(svc, Mapping)}
        if BASE_IMAGE in wanted:
            await self.docker._call(_provide_base_image)
        command = self._command()
        override = build_override(config, project, request, version=self._raw_version(project),
                                  images=images, deploy_limits=len(command) > 1)
        folder = self._folder(project.name, make=True)
        if project.file is not None:
            file, cwd = project.file, str(Path(project.file).parent)
        else:
            file, cwd = str(folder / INLINE_FILE), str(folder)
            _write(folder / INLINE_FILE, project.inline)
        _write(folder / OVERRIDE_FILE, override)
        files = [file, str(folder / OVERRIDE_FILE)]
        _write(folder / FILES_RECORD, {"files": files, "cwd": cwd})
        code, err = await self._run(self._argv(project.name, files, "up", "-d"), cwd=cwd,
                                    env=self._env(request.env))
        if code != 0:
            with contextlib.suppress(Exception):
                await self.destroy(project.ref)
            raise AdapterError(f"compose up failed for {project.where}: {compose_says(err)}")
        failpoint("compose.after-up")
        got = await self.get(project.ref)
        if got is None or not got.running:
            said = "made no container for it" if got is None else f"left it {got.status}"
            with contextlib.suppress(Exception):
                await self.destroy(project.ref)
            raise AdapterError(f"compose up {said}: service {project.service!r} of "
                               f"{project.where} must keep running (exec and logs go to it)")
        return replace(got, labels={**got.labels, **request.labels})

    async def destroy(self, ref: str, *, services: bool = True) -> None:
        project, _ = parse_ref(ref)
        if not project:
            return
        await self.docker.ensure_available()  # an unreachable engine: exit 5 at once
        folder = self._folder(project)
        record = _read(folder / FILES_RECORD)
        files = [f for f in (record or {}).get("files") or [] if os.path.isfile(f)]
        command = compose_command()
        if record and command is not None and len(files) == len(record.get("files") or []):
            # Compose's own way out (the containers are stopped gently); what it leaves, the
            # sweep below removes
            await self._run(self._argv(project, files, "down", "--volumes", "--remove-orphans"),
                            cwd=str(record.get("cwd") or folder), env=self._env(),
                            timeout_s=DOWN_TIMEOUT_S)
        await self.docker._call(lambda api: _sweep(api, ref))
        shutil.rmtree(folder, ignore_errors=True)

    async def change_marker(self, labels: Mapping[str, str], since: float) -> str | None:
        """The engine's (DockerAdapter.change_marker): a project's containers carry the
        installation's labels too."""
        return await self.docker.change_marker(labels, since)

    async def _objects(self, labels: Sequence[str]) -> tuple[list[dict], list[dict], list[dict]]:
        filters = {"label": list(labels)}

        def read(api: Any) -> tuple[list[dict], list[dict], list[dict]]:
            containers = api.containers(all=True, filters=filters)
            networks = api.networks(filters=filters)
            volumes = (api.volumes(filters=filters) or {}).get("Volumes") or []
            return containers, networks, volumes

        return await self.docker._call(read)

    async def get(self, ref: str) -> BackendObject | None:
        project, service = parse_ref(ref)
        if not project or not service:
            return None
        containers, networks, volumes = await self._objects([f"{LABEL_COMPOSE}={ref}"])
        main = _main_container(containers, service)
        if main is not None:
            try:
                info = await self.docker._call(lambda api: api.inspect_container(main["Id"]))
            except docker_errors.NotFound:
                info = None
            if info is not None:
                state = info.get("State", {})
                return BackendObject(
                    ref=ref, labels=info["Config"].get("Labels") or {},
                    status=state.get("Status", "unknown"), running=bool(state.get("Running")),
                    created_at=_parse_time(info.get("Created")), restarted_at=_restarted_at(state))
        return _leftover(ref, [*containers, *networks, *volumes])

    async def list(self, labels: Mapping[str, str]) -> list[BackendObject]:
        """One object per project: its named service's container, or, when that is gone,
        whatever the project left (reported as exited, so reconcile removes it)."""
        wanted = [f"{k}={v}" for k, v in labels.items()] + [LABEL_COMPOSE]
        containers, networks, volumes = await self._objects(wanted)
        by_ref: dict[str, list[dict]] = {}
        for item in [*containers, *networks, *volumes]:
            by_ref.setdefault((item.get("Labels") or {})[LABEL_COMPOSE], []).append(item)
        now, objects = time.time(), []
        for ref, items in sorted(by_ref.items()):
            main = _main_container([i for i in items if "Names" in i], parse_ref(ref)[1])
            if main is None:
                objects.append(_leftover(ref, items))
                continue
            restarted = None
            if main.get("State") == "running" and _maybe_restarted(main, now):
                with contextlib.suppress(docker_errors.NotFound):
                    state = (await self.docker._call(
                        lambda api, cid=main["Id"]: api.inspect_container(cid))).get("State", {})
                    restarted = _restarted_at(state)
            created = main.get("Created")
            objects.append(BackendObject(
                ref=ref, labels=main.get("Labels") or {}, status=main.get("State", "unknown"),
                running=main.get("State") == "running", restarted_at=restarted,
                created_at=datetime.fromtimestamp(created, UTC) if created else None))
        return objects

    async def _main_id(self, ref: str) -> str:
        project, service = parse_ref(ref)
        containers = (await self._objects([f"{LABEL_COMPOSE}={ref}"]))[0] if service else []
        main = _main_container(containers, service)
        if main is None:
            raise BackendObjectGone(f"compose project {project}: service {service!r} has no "
                                    "container")
        return main["Id"]

    async def exec(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                   user: str | None = None, stdin: Stdin = None) -> ExecResult:
        """In the named service's container, through the docker backend (stdin streamed,
        the timeout's kill of the whole process tree); `user` is refused, as for the
        profile: the project's file says whom each service runs as."""
        if user is not None:
            raise self._unsupported("run a command as another user (the compose file says "
                                    "whom each service runs as)")
        return await self.docker.exec(await self._main_id(ref), argv, timeout_s, env=env,
                                      cwd=cwd, stdin=stdin)

    async def exec_stream(self, ref: str, argv: Sequence[str], timeout_s: float | None = None,
                          env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                          user: str | None = None, stdin: Stdin = None,
                          ) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        if user is not None:
            raise self._unsupported("run a command as another user (the compose file says "
                                    "whom each service runs as)")
        async for item in self.docker.exec_stream(await self._main_id(ref), argv, timeout_s,
                                                  env=env, cwd=cwd, stdin=stdin):
            yield item

    async def open_pty(self, ref: str, argv: Sequence[str], *, cols: int = 80, rows: int = 24,
                       env: Mapping[str, str] | None = None, cwd: str | None = None,
                       ) -> PtyChannel:
        """A terminal in the named service's container, through the docker backend (an exec
        with a TTY, resized by the engine)."""
        return await self.docker.open_pty(await self._main_id(ref), argv, cols=cols, rows=rows,
                                          env=env, cwd=cwd)

    async def port_endpoints(self, ref: str) -> dict[int, Endpoint]:
        """What the project's containers publish (its file's `ports:`, with compose: {allow:
        [ports]}), by the port inside the container; the named service's own first, then
        another service's port that no earlier one has."""
        containers = (await self._objects([f"{LABEL_COMPOSE}={ref}"]))[0]
        main = _main_container(containers, parse_ref(ref)[1])
        found: dict[int, Endpoint] = {}
        for container in sorted(containers, key=lambda c: c is not main):
            if container.get("State") != "running":
                continue
            with contextlib.suppress(BackendObjectGone):
                for port, endpoint in (await self.docker.port_endpoints(container["Id"])).items():
                    found.setdefault(port, endpoint)
        return found

    async def expose_port(self, ref: str, port: int) -> Endpoint:
        raise CapabilityNotSupported(
            f"the compose backend cannot publish port {port} while the project runs: publish "
            "it in the compose file's ports: (with compose: {allow: [ports]}) and create the "
            "sandbox again")

    # files: the named service's container, through the docker backend (its archive API);
    # list, remove, mkdir and rename are the base's, run through exec above

    async def put_archive(self, ref: str, path: str, tar: AsyncIterator[bytes]) -> None:
        await self.docker.put_archive(await self._files_target(ref), path, tar)

    async def get_archive(self, ref: str, path: str) -> AsyncIterator[bytes]:
        async for chunk in self.docker.get_archive(await self._files_target(ref), path):
            yield chunk

    async def stat_file(self, ref: str, path: str) -> FileInfo | None:
        return await self.docker.stat_file(await self._main_id(ref), path)

    async def logs(self, ref: str, follow: bool = False,
                   tail: int | None = None) -> AsyncIterator[bytes]:
        async for chunk in self.docker.logs(await self._main_id(ref), follow, tail):
            yield chunk

    async def _each_container(self, ref: str, verb: str,
                              fn: Callable[[Any, Mapping[str, Any]], None]) -> None:
        containers = (await self._objects([f"{LABEL_COMPOSE}={ref}"]))[0]
        if not containers:
            raise BackendObjectGone(f"compose project {parse_ref(ref)[0]} has no containers")

        def each(api: Any) -> None:
            for info in containers:
                fn(api, info)

        try:
            await self.docker._call(each)
        except docker_errors.NotFound as exc:
            raise BackendObjectGone(f"a container of compose project {ref} is gone") from exc
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker could not {verb} compose project {ref}: "
                               f"{_short(exc)}") from exc

    async def pause(self, ref: str) -> None:
        def pause(api: Any, info: Mapping[str, Any]) -> None:
            if info.get("State") == "running":
                api.pause(info["Id"])

        await self._each_container(ref, "pause", pause)

    async def resume(self, ref: str) -> None:
        def resume(api: Any, info: Mapping[str, Any]) -> None:
            if info.get("State") == "paused":
                api.unpause(info["Id"])

        await self._each_container(ref, "resume", resume)

    async def snapshot(self, ref: str, labels: Mapping[str, str]) -> Artifact:
        """One committed image per service (`docker commit`: filesystems, not memory or
        volumes), tagged `<checkpoint>.<service>`: one checkpoint, restored together."""
        checkpoint = labels.get(LABEL_CHECKPOINT) or f"sbx-{int(time.time() * 1000)}"
        containers = (await self._objects([f"{LABEL_COMPOSE}={ref}"]))[0]
        services = _per_service(containers)
        if not services:
            raise BackendObjectGone(f"compose project {parse_ref(ref)[0]} has no containers")

        def commit(api: Any) -> Artifact:
            made: list[str] = []
            size = 0
            try:
                for service, info in services.items():
                    marks = {**labels, LABEL_CHECKPOINT: checkpoint, LABEL_SERVICE: service,
                             LABEL_COMPOSE: ref}
                    changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in marks.items()]
                    tag = f"{checkpoint}.{service}"
                    api.commit(info["Id"], repository=CHECKPOINT_REPOSITORY, tag=tag,
                               changes=changes)
                    made.append(f"{CHECKPOINT_REPOSITORY}:{tag}")
                    size += api.inspect_image(made[-1]).get("Size") or 0
            except BaseException:
                for image in made:
                    with contextlib.suppress(docker_errors.APIError):
                        api.remove_image(image, force=True)
                raise
            return Artifact(f"{CHECKPOINT_REPOSITORY}:{checkpoint}",
                            {**labels, LABEL_CHECKPOINT: checkpoint}, size)

        try:
            return await self.docker._call(commit)
        except docker_errors.NotFound as exc:
            raise BackendObjectGone(f"a container of compose project {ref} is gone") from exc
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker could not snapshot compose project {ref}: "
                               f"{_short(exc)}") from exc

    async def missing_artifacts(self, artifacts: Sequence[str]) -> set[str]:
        """Checkpoints none of whose service images is left (a restore would have nothing
        of the checkpoint to start from)."""
        def check(api: Any) -> set[str]:
            return {ref for ref in set(artifacts) if not _checkpoint_images(api, ref)}

        try:
            return await self.docker._call(check)
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker could not look up checkpoint images: "
                               f"{_short(exc)}") from exc

    async def delete_artifact(self, artifact: str) -> None:
        def remove(api: Any) -> None:
            for image in _checkpoint_images(api, artifact).values():
                with contextlib.suppress(docker_errors.NotFound):
                    api.remove_image(image, force=True)

        try:
            await self.docker._call(remove)
        except docker_errors.APIError as exc:
            raise AdapterError(f"docker could not remove checkpoint {artifact}: "
                               f"{_short(exc)}") from exc

    async def list_artifacts(self, labels: Mapping[str, str]) -> list[Artifact]:
        """The project checkpoints' images carrying `labels`: of the engine's checkpoint
        images (DockerAdapter.checkpoint_images, one listing for both backends)."""
        wanted = dict(labels).items()
        grouped: dict[str, Artifact] = {}
        for image in await self.docker.checkpoint_images():
            marks = image.get("Labels") or {}
            if LABEL_COMPOSE not in marks or not wanted <= marks.items():
                continue
            checkpoint = marks.get(LABEL_CHECKPOINT)
            prefix = f"{CHECKPOINT_REPOSITORY}:{checkpoint}."
            if not checkpoint or not any(t.startswith(prefix) for t in image.get("RepoTags") or []):
                continue
            ref = f"{CHECKPOINT_REPOSITORY}:{checkpoint}"
            before = grouped.get(ref)
            size = (before.size_bytes or 0 if before else 0) + (image.get("Size") or 0)
            grouped[ref] = Artifact(ref, {k: v for k, v in marks.items() if k != LABEL_SERVICE},
                                    size)
        return list(grouped.values())

    async def metrics(self, ref: str) -> AsyncIterator[MetricSample]:
        """The engine's stats streams of the project's running containers, read in step (a
        sample a second), added up; the first has no CPU figure."""
        containers = [c for c in (await self._objects([f"{LABEL_COMPOSE}={ref}"]))[0]
                      if c.get("State") == "running"]
        if not containers:
            raise BackendObjectGone(f"compose project {parse_ref(ref)[0]} has no running "
                                    "containers")
        try:
            streams = await self.docker._call(lambda api: [
                api.stats(c["Id"], stream=True, decode=True) for c in containers])
        except docker_errors.NotFound as exc:
            raise BackendObjectGone(f"a container of compose project {ref} is gone") from exc
        readers = [_in_thread(stream) for stream in streams]
        while readers:
            readings = await asyncio.gather(*(anext(r, None) for r in readers))
            alive, samples = [], []
            for reader, stats in zip(readers, readings, strict=True):
                if stats is None or str(stats.get("read", "")).startswith("0001-"):
                    continue  # that container stopped
                alive.append(reader)
                samples.append(sample_from_stats(stats))
            readers = alive
            if samples:
                yield add_up(samples)

    async def close(self) -> None:
        await self.docker.close()


# -- on the engine (in a worker thread) ---------------------------------------------------------


def _provide_base_image(api: Any) -> None:
    try:
        api.inspect_image(BASE_IMAGE)
    except docker_errors.ImageNotFound:
        build_base_image(api)


def _checkpoint_images(api: Any, artifact: str) -> dict[str, str]:
    """service -> image of a checkpoint artifact (`<repository>:<checkpoint>`)."""
    repository, _, checkpoint = artifact.rpartition(":")
    if repository != CHECKPOINT_REPOSITORY or not checkpoint:
        return {}
    prefix = f"{artifact}."
    found = api.images(filters={"label": [f"{LABEL_CHECKPOINT}={checkpoint}", LABEL_COMPOSE]})
    return {tag.removeprefix(prefix): tag for image in found
            for tag in image.get("RepoTags") or [] if tag.startswith(prefix)}


def _sweep(api: Any, ref: str) -> None:
    """Remove every container, network and volume labelled with the project's ref; already
    gone (or being removed by another process) is fine. Raises if something stays."""
    filters = {"label": [f"{LABEL_COMPOSE}={ref}"]}
    deadline = time.monotonic() + SWEEP_WAIT_S
    while True:
        containers = api.containers(all=True, filters=filters)
        for info in containers:
            with contextlib.suppress(docker_errors.NotFound, docker_errors.APIError):
                api.remove_container(info["Id"], force=True, v=True)
        networks = api.networks(filters=filters)
        for info in networks:
            with contextlib.suppress(docker_errors.NotFound, docker_errors.APIError):
                api.remove_network(info["Id"])
        volumes = (api.volumes(filters=filters) or {}).get("Volumes") or []
        for info in volumes:
            with contextlib.suppress(docker_errors.NotFound, docker_errors.APIError):
                api.remove_volume(info["Name"], force=True)
        left = (len(api.containers(all=True, filters=filters)) + len(api.networks(filters=filters))
                + len((api.volumes(filters=filters) or {}).get("Volumes") or []))
        if not left:
            return
        if time.monotonic() > deadline:
            raise AdapterError(f"compose project {ref}: {left} object(s) could not be removed "
                               f"within {SWEEP_WAIT_S:g}s")
        time.sleep(0.2)


def _leftover(ref: str, items: Sequence[Mapping[str, Any]]) -> BackendObject | None:
    """A project whose named service has no container: what is left of it, as an exited
    object (reconcile then removes it)."""
    if not items:
        return None
    labels = dict(items[0].get("Labels") or {})
    times = []
    for item in items:
        raw = item.get("Created") or item.get("CreatedAt")
        moment = (datetime.fromtimestamp(raw, UTC) if isinstance(raw, int | float)
                  else _parse_time(raw) if isinstance(raw, str) else None)
        if moment is not None:
            times.append(moment)
    return BackendObject(ref=ref, labels=labels, status="exited", running=False,
                         created_at=min(times) if times else None)


def _write(path: Path, data: Any) -> None:
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(scratch, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
