"""The MCP server (docs/mcp.md): one `MCPServer` of the official `mcp` SDK whose tools and
resources call the public library as the caller's client. Who the caller is comes from the
transport (`Resolve`): the local user over stdio, an API key's owner over HTTP. Every call
acts as "OWNER (mcp: CLIENT)", CLIENT the name the session's initialize gave, so the event log
says which agent did it. A refusal or failure is an MCP tool error carrying the library's
one-line message; the operator's limits (settings.mcp_*) hold for every call."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import ToolAnnotations
from pydantic import Field, ValidationError

from sandboxer import AsyncSandbox, AsyncSandboxer
from sandboxer.core.rules import settings
from sandboxer.core.rules.durations import format_duration, parse_duration
from sandboxer.core.rules.errors import BadInput, SbxError, TimedOut, one_line

log = logging.getLogger("sandboxer.mcp")


@dataclass(frozen=True)
class Acting:
    """The library client one call runs through, and the owner what it creates records."""

    client: AsyncSandboxer
    owner: str | None


Resolve = Callable[[Context, bool], Awaitable[Acting]]
"""The caller of a tool call (`write`: whether it changes anything); raises SbxError (as a
Refused's message) when the caller may not."""


def client_name(ctx: Context) -> str:
    """The name the MCP client gave in its initialize clientInfo (printable, at most 64)."""
    try:
        params = ctx.session.client_params
        name = params.client_info.name if params is not None else ""
    except Exception:
        name = ""
    name = "".join(ch for ch in str(name or "") if ch.isprintable()).strip()[:64]
    return name or "unnamed client"


def actor_of(owner: str, ctx: Context) -> str:
    return f"{owner} (mcp: {client_name(ctx)})"


# -- what the model is told -----------------------------------------------------------------

def _text(data: bytes) -> dict[str, Any]:
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _clipped(data: bytes, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes, cut at a UTF-8 character's start when the text is UTF-8."""
    if len(data) <= limit:
        return data, False
    cut = limit
    while cut > 0 and cut > limit - 4 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return data[:cut], True


def _output(data: bytes) -> str:
    """Output as text for the model: UTF-8, anything else replaced (the bytes are in a file
    or the process's output for a program that needs them)."""
    return data.decode("utf-8", errors="replace")


EXEC_NOTE = ("{stream} was {total} bytes; the first {shown} are shown. To read all of it, send "
             "the output to a file (e.g. `cmd > /tmp/out.txt 2>&1`) and read that file with "
             "read_file (offset, length), or run it with start_process and page through "
             "read_process_output.")


def _command(command: list[str] | str) -> list[str]:
    if isinstance(command, str):
        if not command.strip():
            raise BadInput("command is empty: give a command line or an argv list")
        return ["sh", "-c", command]
    return list(command)


Sandbox = Annotated[str, Field(description="the sandbox: its id, a unique id prefix or its name")]
Command = Annotated[list[str] | str, Field(description=(
    "what to run: an argv list (run as it is, e.g. [\"python3\", \"app.py\"]) or one command "
    "line (run by `sh -c`, so pipes and redirections work)"))]
Env = Annotated[dict[str, str] | None, Field(description=(
    "variables added for this command only (treated as secrets: the event log keeps their "
    "names, never their values)"))]
Cwd = Annotated[str | None, Field(description="an absolute folder to run in")]
Pid = Annotated[int, Field(description="the process's pid (start_process returns it)")]


async def _ttl_within_limit(sbx: AsyncSandboxer, ttl: str | None, profile: str) -> timedelta:
    """The ttl asked for, refused when longer than the operator's limit (settings.mcp_max_ttl);
    without one, the profile's default cut to that limit (create and restore alike)."""
    limit = settings.mcp_max_ttl()
    if ttl is not None:
        asked = parse_duration(ttl, "ttl")
        if asked > limit:
            raise BadInput(f"ttl {ttl}: longer than this server's limit of "
                           f"{format_duration(limit)}")
        return asked
    return min((await sbx.profile(profile)).ttl.default, limit)


def build(resolve: Resolve, *, version: str = "") -> MCPServer:
    """The server: its tools and resources over `resolve`."""
    server = _Server(
        name="sandboxer", version=version, title="Sandboxer",
        instructions=(
            "Short-lived, isolated sandboxes: create one, run commands and read and write "
            "files in it, then destroy it (it is also destroyed when its TTL runs out). Output "
            "longer than the server's limit is cut, with a note saying how to read the rest."),
        log_level="WARNING")

    @contextlib.asynccontextmanager
    async def calling(ctx: Context, write: bool) -> AsyncIterator[AsyncSandboxer]:
        """The caller's client; an SbxError in the call becomes a tool error in one line."""
        try:
            yield (await resolve(ctx, write)).client
        except ToolError:
            raise
        except SbxError as exc:
            raise ToolError(one_line(exc)) from None
        except Exception:
            log.exception("an MCP tool call failed")
            raise ToolError("the call failed inside the server (its log says why)") from None

    async def owner(ctx: Context) -> str | None:
        return (await resolve(ctx, True)).owner

    changes = ToolAnnotations(read_only_hint=False, destructive_hint=False)
    reads = ToolAnnotations(read_only_hint=True)

    # -- sandboxes ------------------------------------------------------------------------

    @server.tool(annotations=changes)
    async def create_sandbox(
            ctx: Context,
            profile: Annotated[str, Field(description=(
                "the profile to make it from (list_profiles names them)"))] = "default",
            ttl: Annotated[str | None, Field(description=(
                "how long it may live, e.g. 15m or 2h (default: the profile's, at most the "
                "server's limit)"))] = None,
            name: Annotated[str | None, Field(description="a name to find it by")] = None,
            task: Annotated[str | None, Field(description=(
                "what it is for, in a few words (kept in its record)"))] = None,
    ) -> dict[str, Any]:
        """Create a sandbox from a profile and wait until it runs. Returns its record (id,
        state, deadline). Destroy it with destroy_sandbox when done."""
        async with calling(ctx, True) as sbx:
            allowed = settings.mcp_profiles()
            if allowed is not None and profile not in allowed:
                raise BadInput(f"profile {profile!r} is not one this server lets MCP create "
                               f"from: {', '.join(allowed)}")
            asked = await _ttl_within_limit(sbx, ttl, profile)
            box = await sbx.create(profile, ttl=asked, name=name, task=task,
                                   owner=await owner(ctx))
            return box.to_dict()

    @server.tool(annotations=reads)
    async def list_sandboxes(
            ctx: Context,
            state: Annotated[str | None, Field(description=(
                "only these: running, paused, creating, failed, destroyed"))] = None,
            include_destroyed: Annotated[bool, Field(description=(
                "also the destroyed ones"))] = False,
    ) -> dict[str, Any]:
        """The sandboxes this caller may see, newest first: id, name, state, deadline."""
        async with calling(ctx, False) as sbx:
            boxes = await sbx.list(state=state, include_destroyed=include_destroyed)
            await _note(sbx, "list_sandboxes")
            return {"sandboxes": [b.to_dict() for b in boxes]}

    @server.tool(annotations=reads)
    async def list_profiles(ctx: Context) -> dict[str, Any]:
        """The profiles a sandbox can be made from (those this server lets MCP use)."""
        async with calling(ctx, False) as sbx:
            allowed = settings.mcp_profiles()
            infos = [p.to_dict() for p in await sbx.profiles()]
            await _note(sbx, "list_profiles")
            return {"profiles": [p for p in infos
                                 if allowed is None or p.get("name") in allowed]}

    @server.tool(annotations=changes)
    async def extend_sandbox(
            ctx: Context, sandbox: Sandbox,
            by: Annotated[str, Field(description="how much longer, e.g. 10m")],
    ) -> dict[str, Any]:
        """Move its deadline later (never past its profile's hard limit). Returns the
        record and whether the hard limit capped it."""
        async with calling(ctx, True) as sbx:
            delta = parse_duration(by, "by")
            limit = settings.mcp_max_ttl()
            if delta > limit:
                raise BadInput(f"by {by}: longer than this server's limit of "
                               f"{format_duration(limit)}")
            box = await sbx.get(sandbox)
            capped = await box.extend(delta)
            return {"sandbox": box.to_dict(), "capped": capped}

    @server.tool(annotations=changes)
    async def snapshot_sandbox(
            ctx: Context, sandbox: Sandbox,
            name: Annotated[str | None, Field(description="a name for the checkpoint")] = None,
    ) -> dict[str, Any]:
        """Save its filesystem as a checkpoint; restore_checkpoint makes a new sandbox
        from it. Returns the checkpoint's record."""
        async with calling(ctx, True) as sbx:
            box = await sbx.get(sandbox)
            return (await box.snapshot(name)).to_dict()

    @server.tool(annotations=changes)
    async def restore_checkpoint(
            ctx: Context,
            checkpoint: Annotated[str, Field(description="the checkpoint's id or name")],
            ttl: Annotated[str | None, Field(description=(
                "how long the new sandbox may live (default: its profile's, at most the "
                "server's limit)"))] = None,
            name: Annotated[str | None, Field(description="a name for the new sandbox")] = None,
    ) -> dict[str, Any]:
        """A new sandbox from a checkpoint (snapshot_sandbox makes one). Returns its record."""
        async with calling(ctx, True) as sbx:
            point = await sbx.checkpoint(checkpoint)
            allowed = settings.mcp_profiles()
            if allowed is not None and point.profile not in allowed:
                raise BadInput(f"checkpoint {checkpoint!r} is of profile {point.profile!r}, "
                               f"not one this server lets MCP create from")
            asked = await _ttl_within_limit(sbx, ttl, point.profile)
            box = await point.restore(ttl=asked, name=name)
            return box.to_dict()

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                             idempotent_hint=True))
    async def destroy_sandbox(ctx: Context, sandbox: Sandbox) -> dict[str, Any]:
        """Destroy it and everything in it. Destroying one already destroyed is fine."""
        async with calling(ctx, True) as sbx:
            box = await sbx.get(sandbox)
            done = await box.destroy()
            return {"id": box.id, "destroyed": True, "already_destroyed": not done}

    # -- commands -------------------------------------------------------------------------

    @server.tool(name="exec", annotations=changes)
    async def exec_command(
            ctx: Context, sandbox: Sandbox, command: Command, env: Env = None, cwd: Cwd = None,
            stdin: Annotated[str | None, Field(description=(
                "text written to the command's standard input, then closed"))] = None,
            timeout: Annotated[str | None, Field(description=(
                "the longest it may run, e.g. 30s or 5m; then it is stopped (exit code "
                "124) and the output so far returned"))] = None,
    ) -> dict[str, Any]:
        """Run a command in the sandbox and wait for it: exit code, stdout and stderr (as
        text), duration. Output over the server's limit is cut, with a note."""
        async with calling(ctx, True) as sbx:
            argv = _command(command)
            box = await sbx.get(sandbox)
            result = await box.exec(argv, timeout, env=env, cwd=cwd, stdin=stdin)
            limit = settings.mcp_max_output()
            doc: dict[str, Any] = {"exit_code": result.exit_code,
                                   "duration": result.duration.total_seconds(),
                                   "timed_out": result.timed_out}
            notes = []
            for stream, data in (("stdout", result.stdout), ("stderr", result.stderr)):
                shown, cut = _clipped(data, limit)
                doc[stream] = _output(shown)
                if cut:
                    doc[f"{stream}_bytes"] = len(data)
                    notes.append(EXEC_NOTE.format(stream=stream, total=len(data),
                                                  shown=len(shown)))
            if notes:
                doc["note"] = " ".join(notes)
            return doc

    # -- files ----------------------------------------------------------------------------

    @server.tool(annotations=changes)
    async def write_file(
            ctx: Context, sandbox: Sandbox,
            path: Annotated[str, Field(description="an absolute path; its folder is made")],
            content: Annotated[str, Field(description="the file's content")],
            encoding: Annotated[Literal["utf-8", "base64"], Field(description=(
                "how content is written: utf-8 text, or base64 for bytes"))] = "utf-8",
            mode: Annotated[int | None, Field(description=(
                "permission bits, e.g. 493 (0o755) for a script; default 420 (0o644)"),
                ge=0, le=0o7777)] = None,
    ) -> dict[str, Any]:
        """Write (or replace) a file in the sandbox. Returns its size and SHA-256."""
        async with calling(ctx, True) as sbx:
            if encoding == "base64":
                try:
                    data = base64.b64decode(content, validate=True)
                except (binascii.Error, ValueError):
                    raise BadInput("content is not base64 (encoding: base64)") from None
            else:
                data = content.encode()
            box = await sbx.get(sandbox)
            return (await box.files.write(path, data, mode=mode)).to_dict()

    @server.tool(annotations=reads)
    async def read_file(
            ctx: Context, sandbox: Sandbox,
            path: Annotated[str, Field(description="an absolute path")],
            offset: Annotated[int, Field(description="the first byte to return", ge=0)] = 0,
            length: Annotated[int | None, Field(description=(
                "at most this many bytes (and never more than the server's limit)"),
                gt=0)] = None,
    ) -> dict[str, Any]:
        """A file's content: text when it is UTF-8, else base64. A long file comes in
        pieces: the reply says the next offset to read from."""
        async with calling(ctx, False) as sbx:
            box = await sbx.get(sandbox)
            data = await box.files.read(path)
            limit = settings.mcp_max_output()
            want = limit if length is None else min(length, limit)
            piece, _ = _clipped(data[offset:], want)
            end = offset + len(piece)
            doc: dict[str, Any] = {"path": path, "size": len(data), "offset": offset,
                                   **_text(piece)}
            if end < len(data):
                doc["next_offset"] = end
                doc["note"] = (f"the file is {len(data)} bytes; bytes {offset} to {end} are "
                               f"shown: call read_file again with offset={end} for more")
            return doc

    @server.tool(annotations=reads)
    async def list_files(
            ctx: Context, sandbox: Sandbox,
            path: Annotated[str, Field(description="an absolute folder")] = "/",
            depth: Annotated[int, Field(description="levels down to list", ge=1, le=8)] = 1,
    ) -> dict[str, Any]:
        """What is in a folder: name, kind, size, mode, modified time."""
        async with calling(ctx, False) as sbx:
            box = await sbx.get(sandbox)
            entries = [f.to_dict() for f in await box.files.list(path, depth)]
            await _note(sbx, "list_files", box.id)
            return {"entries": entries}

    # -- background processes -------------------------------------------------------------

    @server.tool(annotations=changes)
    async def start_process(
            ctx: Context, sandbox: Sandbox, command: Command, env: Env = None, cwd: Cwd = None,
            stdin: Annotated[str | None, Field(description=(
                "text written to its standard input, which is then closed"))] = None,
    ) -> dict[str, Any]:
        """Start a command in the background (a server, a long build) and return at once
        with its pid. read_process_output reads what it prints; kill_process stops it."""
        async with calling(ctx, True) as sbx:
            argv = _command(command)
            box = await sbx.get(sandbox)
            proc = await box.processes.start(argv, env=env, cwd=cwd, stdin=stdin is not None)
            if stdin is not None:
                await proc.write(stdin)
                await proc.close_stdin()
            return proc.to_dict()

    @server.tool(annotations=reads)
    async def inspect_process(
            ctx: Context, sandbox: Sandbox,
            pid: Annotated[int | None, Field(description=(
                "one process; without it, every process started in the sandbox"))] = None,
    ) -> dict[str, Any]:
        """Whether a background process still runs, and its exit code once it ended."""
        async with calling(ctx, False) as sbx:
            box = await sbx.get(sandbox)
            if pid is None:
                doc = {"processes": [p.to_dict() for p in await box.processes.list()]}
            else:
                doc = (await box.processes.get(pid)).to_dict()
            await _note(sbx, "inspect_process", box.id)
            return doc

    @server.tool(annotations=reads)
    async def read_process_output(
            ctx: Context, sandbox: Sandbox, pid: Pid,
            stdout_offset: Annotated[int, Field(description=(
                "read stdout from this byte (the last reply's stdout_next_offset)"), ge=0)] = 0,
            stderr_offset: Annotated[int, Field(description=(
                "read stderr from this byte (the last reply's stderr_next_offset)"), ge=0)] = 0,
            wait: Annotated[str | None, Field(description=(
                "first wait this long for it to end, e.g. 10s"))] = None,
    ) -> dict[str, Any]:
        """What a background process printed, from the offsets given, as it is now; the
        reply's *_next_offset say where to read on from, and whether it still runs."""
        async with calling(ctx, False) as sbx:
            box = await sbx.get(sandbox)
            proc = await box.processes.get(pid)
            if wait is not None:
                limit_wait = parse_duration(wait, "wait")
                with contextlib.suppress(TimedOut):
                    await proc.wait(limit_wait)
            limit = settings.mcp_max_output()
            kept = {"stdout": bytearray(), "stderr": bytearray()}
            nxt = {"stdout": stdout_offset, "stderr": stderr_offset}
            more = {"stdout": False, "stderr": False}
            output = proc.output(stdout_offset, stderr_offset, follow=False)
            async with contextlib.aclosing(output) as chunks:
                async for chunk in chunks:
                    buf = kept[chunk.stream]
                    room = limit - len(buf)
                    data = chunk.data[max(0, nxt[chunk.stream] - chunk.offset):]
                    if room <= 0 or not data:
                        more[chunk.stream] = more[chunk.stream] or bool(data)
                        continue
                    buf += data[:room]
                    nxt[chunk.stream] += min(room, len(data))
                    if len(data) > room:
                        more[chunk.stream] = True
            await proc.refresh()
            await _note(sbx, "read_process_output", box.id)
            doc: dict[str, Any] = {"pid": pid, "running": proc.running,
                                   "exit_code": proc.exit_code}
            for stream in ("stdout", "stderr"):
                doc[stream] = _output(bytes(kept[stream]))
                doc[f"{stream}_next_offset"] = nxt[stream]
            if more["stdout"] or more["stderr"]:
                doc["note"] = (f"more output than the server's limit of {limit} bytes: call "
                               f"read_process_output again with stdout_offset="
                               f"{nxt['stdout']} and stderr_offset={nxt['stderr']}")
            return doc

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    async def kill_process(
            ctx: Context, sandbox: Sandbox, pid: Pid,
            signal: Annotated[int, Field(description=(
                "the signal number: 15 (SIGTERM) asks it to end, 9 (SIGKILL) ends it"),
                ge=1, le=64)] = 9,
    ) -> dict[str, Any]:
        """Send a signal to a background process (SIGKILL unless told)."""
        async with calling(ctx, True) as sbx:
            box = await sbx.get(sandbox)
            proc = await box.processes.get(pid)
            await proc.kill(signal)
            return proc.to_dict()

    # -- resources ------------------------------------------------------------------------

    async def reading(ctx: Context, ref: str) -> AsyncSandbox:
        try:
            sbx = (await resolve(ctx, False)).client
            return await sbx.get(ref)
        except (SbxError, ToolError) as exc:  # a refused key is a ToolError of resolve
            raise ResourceError(one_line(exc)) from None

    async def resource(ctx: Context, work: Awaitable[Any]) -> str:
        try:
            return json.dumps(await work, default=str, indent=1)
        except SbxError as exc:
            raise ResourceError(one_line(exc)) from None

    @server.resource("sandbox://{ref}", name="sandbox", mime_type="application/json",
                     description="A sandbox's record: state, profile, backend, deadlines.")
    async def sandbox_record(ref: str, ctx: Context) -> str:
        box = await reading(ctx, ref)
        return json.dumps(box.to_dict(), default=str, indent=1)

    @server.resource("sandbox://{ref}/events", name="sandbox events",
                     mime_type="application/json",
                     description="A sandbox's events, oldest first: who did what, when.")
    async def sandbox_events(ref: str, ctx: Context) -> str:
        box = await reading(ctx, ref)

        async def events() -> list[dict[str, Any]]:
            return [e.to_dict() for e in await box.events()]

        return await resource(ctx, events())

    @server.resource("sandbox://{ref}/evidence", name="sandbox evidence",
                     mime_type="application/json",
                     description="A sandbox's supervision evidence bundle (docs/evidence.md).")
    async def sandbox_evidence(ref: str, ctx: Context) -> str:
        box = await reading(ctx, ref)
        return await resource(ctx, box.evidence())

    return server


class _Server(MCPServer):
    """MCPServer whose refusal of arguments that do not fit the schema is one line too."""

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context | None = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            said = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                for err in cause.errors(include_url=False, include_input=False))
            raise ToolError(f"Error executing tool {name}: bad arguments: {said}") from cause


async def _note(sbx: AsyncSandboxer, tool: str, sandbox: str | None = None) -> None:
    """`mcp.call` for a call that records no event of its own; a client of a service
    (`sbx mcp` under SBX_URL) cannot record one, and its reads go unrecorded."""
    try:
        await sbx.record_mcp_call(tool, sandbox)
    except BadInput:
        pass
