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
from deepagents.backends.sandbox import TRUNCATION_MSG, BaseSandbox

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


def test_the_agents_file_tools_work_on_an_image_without_python(box):
    """write, read and edit go through the file API: the default profile's busybox image
    has no python3, which deepagents' own versions of them run."""
    backend = SandboxerBackend(box)
    assert box.exec(["sh", "-c", "command -v python3"]).exit_code != 0

    assert backend.write("/work/new/dir/app.py", "one\ntwo\nthree\n").error is None
    page = backend.read("/work/new/dir/app.py", offset=1, limit=1)
    assert (page.file_data["content"], page.total_lines, page.start_line, page.end_line,
            page.next_offset) == ("two", 3, 2, 2, 2)
    assert backend.read("/work/new/dir/app.py").file_data["content"] == "one\ntwo\nthree"
    assert backend.read("/work/none.py").error == "File '/work/none.py': file_not_found"

    edited = backend.edit("/work/new/dir/app.py", "two", "TWO")
    assert (edited.error, edited.occurrences) == (None, 1)
    assert box.files.read("/work/new/dir/app.py") == b"one\nTWO\nthree\n"
    assert "appears 3 times" in backend.edit("/work/new/dir/app.py", "e", "E").error
    assert box.files.read("/work/new/dir/app.py") == b"one\nTWO\nthree\n"  # unchanged
    assert backend.edit("/work/nope.py", "a", "b").error == "Error: File '/work/nope.py' not found"

    # CRLF files keep their line ends; binary files read as base64
    backend.upload_files([("/work/crlf.txt", b"a\r\nb\r\n"), ("/work/logo.png", b"\x89PNG\x00")])
    assert backend.edit("/work/crlf.txt", "a\nb", "x\ny").occurrences == 1
    assert box.files.read("/work/crlf.txt") == b"x\r\ny\r\n"
    assert backend.read("/work/logo.png").file_data == {"content": "iVBORwA=",
                                                        "encoding": "base64"}

    # a page past deepagents' size cap is cut with its note, and says where to read on
    backend.upload_files([("/work/long.txt", b"".join(b"%06d %s\n" % (i, b"y" * 993)
                                                     for i in range(1000)))])
    page = backend.read("/work/long.txt")
    assert page.file_data["content"].startswith("000000 y")
    assert page.file_data["content"].endswith(TRUNCATION_MSG)
    assert (page.total_lines, page.next_offset) == (1000, page.end_line) and page.end_line < 1000
    assert backend.read("/work/long.txt", page.next_offset, 1).file_data["content"].startswith(
        f"{page.next_offset:06d} ")


async def test_the_async_file_tools_use_the_file_api_too(box):
    backend = SandboxerBackend(box)
    assert (await backend.awrite("/work/a.txt", "async\n")).error is None
    assert (await backend.aread("/work/a.txt")).file_data["content"] == "async"
    assert (await backend.aedit("/work/a.txt", "async", "done")).occurrences == 1
    assert [e["path"] for e in (await backend.als("/work")).entries] == ["/work/a.txt"]


PYTHON_IMAGE = "sandboxer/python-base:bookworm"  # made by `make test-setup` (service-image)


def test_on_an_image_with_python_read_agrees_with_deepagents_own_and_grep_glob_work(
        sync_client, docker_api):
    """deepagents' default read (a python3 script in the sandbox) and this one, which pages
    the bytes from the file API, give the same results; grep and glob, not overridden, run
    deepagents' own commands over this backend's execute."""
    if not docker_api.images(name=PYTHON_IMAGE):
        pytest.fail(f"{PYTHON_IMAGE} is made by `make test-setup`; this engine does not have it")
    profile = sync_client.check_profile({"name": "py", "extends": "default",
                                         "image": PYTHON_IMAGE})
    with sync_client.create(profile, ttl="10m", labels=RUN) as box:
        backend = SandboxerBackend(box)
        backend.upload_files([
            ("/work/a.py", b"line1\r\nline2\nx NEEDLE\n"), ("/work/sub/b.txt", b"NEEDLE two\n"),
            ("/work/img.png", b"\x89PNG\x00"), ("/work/empty.txt", b""),
            ("/work/latin1.txt", b"\xff\xfe")])
        for args in [("/work/a.py",), ("/work/a.py", 1, 1), ("/work/a.py", 9),
                     ("/work/a.py", 0, 0), ("/work/a.py", -3, 2), ("/work/missing",),
                     ("/work/img.png",), ("/work/empty.txt",), ("/work/latin1.txt",),
                     ("/work/sub",)]:
            assert backend.read(*args) == BaseSandbox.read(backend, *args), args

        found = backend.grep("NEEDLE", "/work")
        assert sorted((m["path"], m["line"]) for m in found.matches) == [
            ("/work/a.py", 3), ("/work/sub/b.txt", 1)]
        assert [m["path"] for m in backend.glob("*.py", "/work").matches] == ["/work/a.py"]
        assert sorted(e["path"] for e in backend.ls("/work").entries) == sorted(
            e["path"] for e in BaseSandbox.ls(backend, "/work").entries)


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


def test_a_deep_agent_runs_its_tools_in_the_sandbox(box):
    """deepagents' own agent loop (create_deep_agent) with a scripted chat model in place of
    a real one (no model is called): its write_file, execute and read_file tools reach the
    sandbox through the backend."""
    from deepagents import create_deep_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, ToolMessage

    class Scripted(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):  # the script names the tools itself
            return self

    def call(name: str, **args) -> AIMessage:
        return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": name}])

    model = Scripted(messages=iter([
        call("write_file", file_path="/work/plan.md", content="step one\n"),
        call("execute", command="cat /work/plan.md; echo ran > /work/ran.txt; exit 2"),
        call("read_file", file_path="/work/plan.md"),
        AIMessage(content="all done"),
    ]))
    agent = create_deep_agent(model=model, backend=SandboxerBackend(box))
    out = agent.invoke({"messages": [{"role": "user", "content": "go"}]})

    tools = {m.name: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert tools["execute"].artifact == {"truncated": False, "exit_code": 2}
    assert tools["execute"].content.startswith("step one\n")
    assert "step one" in tools["read_file"].content
    assert out["messages"][-1].content == "all done"
    assert box.files.read("/work/plan.md") == b"step one\n"
    assert box.files.read("/work/ran.txt") == b"ran\n"


@pytest.mark.parametrize(("module", "framework", "extra"), [
    ("deepagents", "deepagents", "deepagents"), ("openai_agents", "agents", "openai-agents")])
def test_without_its_framework_an_integration_names_the_extra_to_install(module, framework,
                                                                          extra):
    code = (f"import sys; sys.modules[{framework!r}] = None\n"  # as if it were not installed
            f"import sandboxer.integrations.{module}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].endswith(
        f"pip install 'sandboxer[{extra}]'"), done.stderr
