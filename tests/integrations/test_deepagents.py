"""LangChain deepagents' sandbox interface over a sandboxer sandbox (docs/integrations.md,
"deepagents"): the real `deepagents` package's `BaseSandbox`, called as its tools call it
(no model), on the real Docker engine (network none), in process and through `sbx serve`."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from deepagents.backends.protocol import ExecuteResponse
from deepagents.backends.sandbox import BaseSandbox

import sandboxer
from sandboxer.integrations.deepagents import SandboxerBackend
from tests.integrations.conftest import RUN

pytestmark = pytest.mark.docker


@pytest.fixture
def box(sync_client):
    with sync_client.create("default", ttl="10m", labels=RUN, task="deepagents") as box:
        yield box


def test_execute_gives_the_output_in_order_and_the_exit_code(box):
    backend = SandboxerBackend(box)
    assert isinstance(backend, BaseSandbox) and backend.id == box.id

    result = backend.execute("echo one; echo two >&2; echo three; exit 3")
    assert result == ExecuteResponse(output="one\ntwo\nthree\n", exit_code=3, truncated=False)
    assert backend.execute("cd /tmp && pwd").output == "/tmp\n"
    # the command line is the shell's: pipes, quoting, variables
    assert backend.execute("printf '%s\\n' \"a b\" | tr ' ' _").output == "a_b\n"


async def test_the_async_execute_deepagents_calls_in_an_agent(box):
    result = await SandboxerBackend(box).aexecute("echo async; exit 4")
    assert (result.output, result.exit_code) == ("async\n", 4)


def test_a_timeout_is_exit_code_124_with_a_note_and_the_sandbox_goes_on(box):
    backend = SandboxerBackend(box)
    result = backend.execute("echo started; sleep 30", timeout=1)
    assert result.exit_code == 124
    assert result.output.startswith("started\n")
    assert "timed out after 1 seconds" in result.output
    assert backend.execute("echo still here").output == "still here\n"


def test_output_past_the_limit_is_cut_with_a_note(box):
    result = SandboxerBackend(box, max_output_bytes=1000).execute("yes x | head -c 5000")
    assert result.truncated is True
    assert result.output.startswith("x\n" * 500)
    assert result.output.endswith("... Output truncated at 1000 bytes.")


def test_uploaded_files_download_byte_for_byte(box):
    backend = SandboxerBackend(box)
    blob = os.urandom(1 << 20)
    files = [("/work/deep/er/blob.bin", blob), ("/work/all-bytes", bytes(range(256))),
             ("/work/empty", b""), ("/tmp/text.txt", "naïve — ünïcode\n".encode())]
    assert [(r.path, r.error) for r in backend.upload_files(files)] == [
        (path, None) for path, _ in files]

    downloads = backend.download_files([path for path, _ in files])
    assert [(d.path, d.error) for d in downloads] == [(path, None) for path, _ in files]
    assert [d.content for d in downloads] == [content for _, content in files]
    # what the sandbox holds, read another way
    assert box.exec(["sha256sum", "/work/deep/er/blob.bin"]).stdout.split()[0].decode() == \
        hashlib.sha256(blob).hexdigest()
    # replacing a file
    backend.upload_files([("/work/empty", b"now full")])
    assert backend.download_files(["/work/empty"])[0].content == b"now full"


def test_a_missing_file_downloads_as_file_not_found_and_the_others_still_come(box):
    backend = SandboxerBackend(box)
    backend.upload_files([("/work/here.txt", b"here\n")])
    missing, here, folder, relative = backend.download_files(
        ["/work/not-there.txt", "/work/here.txt", "/work", "work/here.txt"])
    assert (missing.path, missing.content, missing.error) == (
        "/work/not-there.txt", None, "file_not_found")
    assert (here.content, here.error) == (b"here\n", None)
    assert (folder.content, folder.error) == (None, "is_directory")
    assert (relative.content, relative.error) == (None, "invalid_path")


def test_bad_uploads_are_refused_one_by_one_and_change_nothing(box):
    backend = SandboxerBackend(box)
    backend.upload_files([("/work/folder/inside.txt", b"keep me")])
    before = box.exec(["sh", "-c", "find /work | sort"]).stdout

    results = backend.upload_files([
        ("/work/folder", b"would replace the folder"),  # a folder is there
        ("relative.txt", b"x"),                          # not absolute
        ("/proc/version", b"x"),                         # the kernel's, not writable
        ("/work/ok.txt", b"ok"),                         # the one good one still goes
    ])
    assert [(r.path, r.error) for r in results] == [
        ("/work/folder", "is_directory"), ("relative.txt", "invalid_path"),
        ("/proc/version", results[2].error), ("/work/ok.txt", None)]
    assert results[2].error  # refused, with deepagents' code or sandboxer's one line
    assert "Traceback" not in results[2].error and "\n" not in results[2].error

    after = box.exec(["sh", "-c", "find /work | sort"]).stdout
    assert after == before.replace(b"/work/folder/inside.txt\n",
                                   b"/work/folder/inside.txt\n/work/ok.txt\n")
    assert box.files.read("/work/folder/inside.txt") == b"keep me"


def test_ls_lists_through_the_file_api(box):
    backend = SandboxerBackend(box)
    backend.upload_files([("/work/l/a.txt", b"a"), ("/work/l/sub/b.txt", b"b")])
    listed = backend.ls("/work/l")
    assert listed.error is None
    assert sorted((e["path"], e["is_dir"]) for e in listed.entries) == [
        ("/work/l/a.txt", False), ("/work/l/sub", True)]
    assert backend.ls("/work/none").error == "Path '/work/none': file_not_found"


def test_a_sandbox_that_is_gone_is_an_error_result_not_an_exception(box):
    backend = SandboxerBackend(box)
    box.destroy()
    result = backend.execute("echo hi")
    assert result.exit_code is None
    assert result.output.startswith("Error: ") and "\n" not in result.output
    [download] = backend.download_files(["/work/x"])
    assert download.content is None and download.error
    [upload] = backend.upload_files([("/work/x", b"x")])
    assert upload.error and "\n" not in upload.error


def test_the_backend_takes_the_sync_handle_only():
    with pytest.raises(TypeError, match="sandboxer.Sandbox"):
        SandboxerBackend("sbx-not-a-handle")  # type: ignore[arg-type]


def test_importing_sandboxer_imports_no_framework():
    code = ("import sys, sandboxer; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('deepagents', 'langchain', 'langchain_core', 'langgraph', 'agents', 'openai') "
            "or m.startswith('sandboxer.integrations')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
    assert sandboxer.Sandbox  # the handle the backend takes is public
