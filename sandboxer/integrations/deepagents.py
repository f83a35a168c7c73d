"""A sandboxer sandbox as LangChain deepagents' sandbox backend (docs/integrations.md,
"deepagents"): `SandboxerBackend(box)` is a `deepagents.backends.sandbox.BaseSandbox`, so
an agent's `execute` tool and its file tools run in the sandbox.

deepagents calls the backend from worker threads (its async methods wrap the sync ones), so
the backend holds the sync handle (`sandboxer.Sandbox`), which is safe to call from any
thread. Errors come back as deepagents' own results (an `ExecuteResponse` with a one-line
"Error: ..." and no exit code, a `FileOperationError` code per file), never as a raised
exception: an agent reads them and tries something else."""

from __future__ import annotations

import asyncio
import base64

try:
    import deepagents  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "deepagents":
        raise
    # an extra, not a dependency of sbx: say which extra brings it, not just its name
    raise ModuleNotFoundError(
        "sandboxer.integrations.deepagents needs deepagents: "
        "pip install 'sandboxer[deepagents]'", name="deepagents") from None

from deepagents.backends.protocol import (
    EditResult,
    ExecuteResponse,
    FileData,
    FileDownloadResponse,
    FileInfo,
    FileUploadResponse,
    LsResult,
    ReadResult,
    WriteResult,
)
from deepagents.backends.sandbox import (
    MAX_BINARY_BYTES,
    MAX_OUTPUT_BYTES,
    TRUNCATION_MSG,
    BaseSandbox,
)
from deepagents.backends.utils import (
    _get_backend_read_file_type,
    normalize_read_bounds,
    perform_string_replacement,
)

import sandboxer
from sandboxer.core.rules.errors import one_line

__all__ = ["SandboxerBackend"]

DEFAULT_TIMEOUT_S = 120  # deepagents' own default for a command (its LocalShellBackend)
MAX_EXECUTE_BYTES = 100_000  # what reaches the model; the rest is cut with a note


class SandboxerBackend(BaseSandbox):
    """deepagents' `BaseSandbox` over one sandboxer sandbox. `execute` runs the command
    line with `sh -c` (stdout and stderr as one stream, in the order written), in `cwd`
    when given (else the image's working folder); uploads and downloads go through the
    sandbox's file API (`box.files`), byte for byte, with no shell in between, and so do
    `ls`, `read`, `write` and `edit` (deepagents' defaults of those run `python3` in the
    sandbox). `grep` and `glob` are deepagents' defaults: they need `python3` in the
    image."""

    def __init__(self, box: sandboxer.Sandbox, *, cwd: str | None = None,
                 timeout: int = DEFAULT_TIMEOUT_S,
                 max_output_bytes: int = MAX_EXECUTE_BYTES) -> None:
        if not isinstance(box, sandboxer.Sandbox):
            raise TypeError("SandboxerBackend takes a sandboxer.Sandbox (the sync handle); "
                            "from async code, make one with sandboxer.Sandboxer")
        self._box = box
        self._cwd = cwd
        self._timeout = timeout
        self._max_output_bytes = max_output_bytes

    @property
    def id(self) -> str:
        """The sandbox's id (`sbx show ID`)."""
        return self._box.id

    @property
    def sandbox(self) -> sandboxer.Sandbox:
        return self._box

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run `command` with `sh -c`: its output (stdout and stderr interleaved, cut at
        `max_output_bytes` with a note) and exit code; 124 with a note on a timeout."""
        if not isinstance(command, str) or not command.strip():
            return ExecuteResponse(output="Error: the command must be a non-empty string.",
                                   exit_code=1)
        limit = self._timeout if timeout is None else timeout
        if limit is not None and limit <= 0:
            limit = None  # deepagents: 0 may mean "no timeout" where the backend allows it
        try:
            # one stream, in the order written: the shell's stderr goes to its stdout
            done = self._box.exec(["sh", "-c", "exec 2>&1\n" + command],
                                  timeout=limit, cwd=self._cwd)
        except sandboxer.Error as e:
            return ExecuteResponse(output=f"Error: {one_line(e)}", exit_code=None)
        raw = done.stdout + done.stderr
        if done.timed_out:
            text = raw[-self._max_output_bytes:].decode("utf-8", errors="replace")
            return ExecuteResponse(
                output=f"{text}\nError: the command timed out after {limit} seconds.".lstrip(),
                exit_code=done.exit_code, truncated=len(raw) > self._max_output_bytes)
        truncated = len(raw) > self._max_output_bytes
        text = raw[:self._max_output_bytes].decode("utf-8", errors="replace")
        if truncated:
            text += f"\n\n... Output truncated at {self._max_output_bytes} bytes."
        return ExecuteResponse(output=text, exit_code=done.exit_code, truncated=truncated)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each file (its folder made if missing; an existing file replaced). One
        failure does not stop the others; an existing folder at a path is refused
        (`is_directory`) before anything is written."""
        folders = self._folders([path for path, _ in files if _absolute(path)])
        responses = []
        for path, content in files:
            if not _absolute(path):
                responses.append(FileUploadResponse(path=path, error="invalid_path"))
            elif path in folders:
                responses.append(FileUploadResponse(path=path, error="is_directory"))
            else:
                try:
                    self._box.files.write(path, bytes(content))
                    error = None
                except sandboxer.Error as e:
                    error = _file_error(e)
                responses.append(FileUploadResponse(path=path, error=error))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Each file's bytes, or why not (`file_not_found`, `is_directory`, `invalid_path`,
        `permission_denied`, else the one-line reason). One failure does not stop the
        others."""
        responses = []
        for path in paths:
            if not _absolute(path):
                responses.append(FileDownloadResponse(path=path, error="invalid_path"))
                continue
            try:
                content = self._box.files.read(path)
            except sandboxer.Error as e:
                responses.append(FileDownloadResponse(path=path, error=_file_error(e)))
                continue
            responses.append(FileDownloadResponse(path=path, content=content))
        return responses

    def ls(self, path: str) -> LsResult:
        """The entries of the folder `path` (deepagents' default runs python3 in the
        sandbox; this asks the file API)."""
        if not _absolute(path):
            return LsResult(error=f"Path '{path}': invalid_path")
        try:
            entries = self._box.files.list(path)
        except sandboxer.Error as e:
            return LsResult(error=f"Path '{path}': {_file_error(e)}")
        return LsResult(entries=[
            FileInfo(path=entry.path, is_dir=entry.is_dir, size=entry.size,
                     modified_at=entry.mtime.isoformat()) for entry in entries])

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """A page of a text file (`limit` lines from line `offset`), or a binary file as
        base64, as deepagents' default gives it, with the bytes read through the file API
        and paged here."""
        [got] = self.download_files([file_path])
        if got.error is not None or got.content is None:
            error = "not_a_file" if got.error == "is_directory" else got.error  # as the default
            return ReadResult(error=f"File '{file_path}': {error}")
        raw = got.content
        if not raw:
            return ReadResult(file_data=FileData(
                content="System reminder: File exists but has empty contents", encoding="utf-8"))
        text = None
        if _get_backend_read_file_type(file_path) == "text":
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        if text is None:
            if len(raw) > MAX_BINARY_BYTES:
                return ReadResult(error=f"File '{file_path}': Binary file exceeds maximum "
                                        f"preview size of {MAX_BINARY_BYTES} bytes")
            return ReadResult(file_data=FileData(content=base64.b64encode(raw).decode("ascii"),
                                                 encoding="base64"))
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        offset, limit = normalize_read_bounds(offset, limit)
        if limit <= 0:
            return ReadResult(file_data=FileData(content="", encoding="utf-8"),
                              no_lines_requested=True)
        if not lines or offset >= len(lines):
            return ReadResult(error=f"File '{file_path}': Line offset {offset} exceeds file "
                                    f"length ({len(lines)} lines)")
        page = lines[offset:offset + limit]
        content, shown = "\n".join(page), len(page)
        room = MAX_OUTPUT_BYTES - len(TRUNCATION_MSG.encode())
        if len(content.encode()) > room:
            cut = content.encode()[:room].decode("utf-8", errors="ignore")
            shown = cut.count("\n") or 1  # read on from the first line not shown whole
            content = cut + TRUNCATION_MSG
        end = offset + shown
        return ReadResult(file_data=FileData(content=content, encoding="utf-8"),
                          total_lines=len(lines), start_line=offset + 1, end_line=end,
                          next_offset=end if end < len(lines) else None)

    def _write_preflight(self, file_path: str) -> WriteResult | None:
        """deepagents' default makes the folder with python3; `files.write` makes it."""
        return None

    async def _awrite_preflight(self, file_path: str) -> WriteResult | None:
        return None

    def edit(self, file_path: str, old_string: str, new_string: str,
             replace_all: bool = False) -> EditResult:
        """Replace `old_string` (once, or every time with `replace_all`) in a text file, as
        deepagents' default does, with the file read and written through the file API. A
        file with CRLF line ends keeps them."""
        [got] = self.download_files([file_path])
        if got.error is not None or got.content is None:
            reason = {"file_not_found": f"Error: File '{file_path}' not found",
                      "is_directory": f"Error: '{file_path}' is not a regular file"}
            return EditResult(error=reason.get(got.error or "",
                                               f"Error editing file '{file_path}': {got.error}"))
        try:
            text = got.content.decode("utf-8")
        except UnicodeDecodeError:
            return EditResult(error=f"Error: File '{file_path}' is not a text file")
        old, new = old_string, new_string
        if old not in text and "\r\n" in text and "\n" in old:
            old, new = (s.replace("\r\n", "\n").replace("\n", "\r\n") for s in (old, new))
        done = perform_string_replacement(text, old, new, replace_all)
        if isinstance(done, str):
            return EditResult(error=done.replace(old, old_string))
        changed, count = done
        [put] = self.upload_files([(file_path, changed.encode("utf-8"))])
        if put.error is not None:
            return EditResult(error=f"Error editing file '{file_path}': {put.error}")
        return EditResult(path=file_path, occurrences=count)

    # deepagents' async defaults of these run their python3 commands themselves (through
    # aexecute); these run the ones above in a worker thread, as its other async methods do
    async def als(self, path: str) -> LsResult:
        return await asyncio.to_thread(self.ls, path)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await asyncio.to_thread(self.read, file_path, offset, limit)

    async def aedit(self, file_path: str, old_string: str, new_string: str,
                    replace_all: bool = False) -> EditResult:
        return await asyncio.to_thread(self.edit, file_path, old_string, new_string,
                                       replace_all)

    def _folders(self, paths: list[str]) -> set[str]:
        """Which of `paths` are folders in the sandbox, asked in one command: writing a file
        over a folder would try to replace the folder."""
        if not paths:
            return set()
        try:
            done = self._box.exec(["sh", "-c", 'for p; do [ -d "$p" ] && printf "%s\\0" "$p"; '
                                               "done; true", "sh", *paths])
        except sandboxer.Error:
            return set()  # the writes will say what is wrong
        return {p for p in done.stdout.decode("utf-8", errors="replace").split("\0") if p}


def _absolute(path: str) -> bool:
    return isinstance(path, str) and path.startswith("/") and "\0" not in path


def _file_error(error: sandboxer.Error) -> str:
    """deepagents' code for a failed file operation where one fits, else the one line."""
    message = one_line(error)
    lowered = message.lower()
    if isinstance(error, sandboxer.NotFound):
        return "file_not_found"
    if "is a folder" in lowered or "is a directory" in lowered:
        return "is_directory"
    if "permission denied" in lowered or "read-only file system" in lowered:
        return "permission_denied"
    if isinstance(error, sandboxer.BadInput) and "path" in lowered:
        return "invalid_path"
    return message
