"""The conformance kit: one pytest suite that any adapter, built in or third party, runs to
show that it keeps the adapter contract (docs/adapters.md).

Subclass `AdapterConformance` in a test module (a class named `Test...`) and give it:

- a fixture `adapter` (function scope; in the module or the class): a ready adapter reaching a
  working backend. The kit closes it at the end of every test, in the test's event loop;
- in the class, a fixture `lose` returning a callable `lose(ref)` (sync or async) that makes
  the backend lose that object behind sbx's back (remove the container, kill the VM);
- in the class, if the backend needs more than `CreateRequest(sandbox_id, labels)` (an image,
  options, a network mode), a fixture `create_request` returning a callable
  `(sandbox_id, labels) -> CreateRequest`;
- if the backend's sandboxes have no POSIX `sh`, `echo`, `sleep`, `pwd` and `cat`, override
  the `argv_*` methods (return None from `argv_stderr`, `argv_sleep`, `argv_pwd`, `argv_cat`
  or `argv_echo_then_sleep` to leave those checks out), and `work_folder` if a new sandbox
  has no /tmp (exec's `cwd` and the FILES cases use it); a backend declaring PTY whose
  sandboxes have no `sh` with `stty` overrides `argv_pty_shell`;
- a backend slower to end a timed-out exec than the contract's 0.5 s may raise
  `exec_timeout_return_slack_s` (the kit allows 0.5 s of slack by default).

Capabilities a backend does not declare are checked as refused (CapabilityNotSupported);
the cases of one it does not declare are skipped, saying so.

Fixtures the kit defines (`create_request`, `lose`) are class fixtures: override them in your
subclass, not in the module, or the kit's own would win.

Every test creates its objects with labels of its own (`sbx.install` = a fresh
`conformance-...` value) and destroys whatever carries them at the end, even after a failure.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import re
import secrets
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from importlib.metadata import entry_points
from typing import Any

import pytest

from sandboxer.adapters.base import (
    LABEL_CHECKPOINT,
    LABEL_HARD_DEADLINE,
    LABEL_ID,
    LABEL_INSTALL,
    LABEL_VOLUME,
    Adapter,
    AdapterError,
    Artifact,
    BackendObject,
    Capability,
    CapabilityNotSupported,
    CreateRequest,
    ExecResult,
    FileInfo,
    Health,
    InvalidRequest,
    MetricSample,
    NoSuchPath,
    PtyChannel,
    VolumeMountSpec,
)

GROUP = "sandboxer.adapters"
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, as a lower-case ULID


def new_sandbox_id() -> str:
    """An id shaped like sbx's own (`sbx-` + 26 base32 characters)."""
    return "sbx-" + "".join(secrets.choice(_ALPHABET) for _ in range(26))


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _first_items(make: Callable[[], AsyncIterator[Any]], count: int,
                       timeout_s: float) -> list[Any]:
    """Up to `count` items of an async iterator within `timeout_s`; an iterator that ends
    sooner gives fewer. `make()` may itself raise (a refused capability)."""
    items: list[Any] = []

    async def read() -> None:
        iterator = make()
        try:
            async for item in iterator:
                items.append(item)
                if len(items) >= count:
                    return
        finally:
            close = getattr(iterator, "aclose", None)
            if close is not None:
                await close()

    await asyncio.wait_for(read(), timeout_s)
    return items


class Kit:
    """One test's view of the adapter: makes requests, remembers what it made, cleans up."""

    def __init__(self, adapter: Adapter, create_request: Callable[[str, Mapping[str, str]],
                 CreateRequest], extra_labels: Mapping[str, str], settle_s: float) -> None:
        self.adapter = adapter
        self.make_request = create_request
        self.install = f"conformance-{secrets.token_hex(6)}"
        self.extra_labels = dict(extra_labels)
        self.settle_s = settle_s
        self.hard_deadline = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
        self.refs: list[str] = []

    def labels(self, sandbox_id: str, **more: str) -> dict[str, str]:
        return {**self.extra_labels, LABEL_ID: sandbox_id, LABEL_INSTALL: self.install,
                LABEL_HARD_DEADLINE: _iso(self.hard_deadline), **more}

    def request(self, **labels: str) -> CreateRequest:
        """As the core builds one: sbx's labels, and the hard deadline they carry."""
        sandbox_id = new_sandbox_id()
        request = self.make_request(sandbox_id, self.labels(sandbox_id, **labels))
        if request.hard_deadline is None:
            request = replace(request, hard_deadline=self.hard_deadline)
        return request

    async def create(self, request: CreateRequest | None = None, **labels: str) -> BackendObject:
        """As the core does it: validate, make sure the backend answers, create."""
        request = request or self.request(**labels)
        self.adapter.validate(request)
        await self.adapter.ensure_available()
        obj = await self.adapter.create(request)
        self.refs.append(obj.ref)
        return obj

    async def until_gone(self, ref: str, sandbox_id: str) -> None:
        """get() None and list() without it, allowing `settle_s` for a backend that is only
        eventually consistent."""
        deadline = time.monotonic() + self.settle_s
        while True:
            got = await self.adapter.get(ref)
            listed = await self.adapter.list({LABEL_ID: sandbox_id})
            if got is None and not listed:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{ref} is still reported {self.settle_s:g}s after it was destroyed or lost "
                    f"(get: {got}, list: {listed})")
            await asyncio.sleep(0.2)

    async def cleanup(self) -> None:
        """Destroy everything this test made, whatever state the test left it in."""
        refs = list(self.refs)
        try:
            refs += [o.ref for o in await self.adapter.list({LABEL_INSTALL: self.install})]
        except Exception:
            pass
        for ref in dict.fromkeys(refs):
            try:
                await self.adapter.destroy(ref)
            except Exception:
                pass
        if self.adapter.supports(Capability.SNAPSHOT):
            try:
                for artifact in await self.adapter.list_artifacts({LABEL_INSTALL: self.install}):
                    await self.adapter.delete_artifact(artifact.ref)
            except Exception:
                pass


class AdapterConformance:
    """The contract, as tests. See the module's docstring for what a subclass provides."""

    # labels added to everything the kit creates (a run label, say)
    extra_labels: Mapping[str, str] = {}
    # how long a destroyed or lost object may still be reported (eventually consistent clouds)
    settle_timeout_s: float = 10.0
    # the exec timeout the kit asks for, and the slack it allows beyond it
    exec_timeout_s: float = 2.0
    exec_timeout_slack_s: float = 10.0
    # a timed-out exec returns within this of its deadline (the contract), plus the slack a
    # slow backend may declare for itself
    exec_timeout_return_s: float = 0.5
    exec_timeout_return_slack_s: float = 0.5
    # first metric sample and first log chunk must come within this
    stream_timeout_s: float = 20.0
    # check that `adapter.name` is registered in the `sandboxer.adapters` entry-point group
    check_entry_point: bool = True

    # -- hooks ------------------------------------------------------------------------------

    def argv_echo(self, text: str) -> list[str]:
        """Prints `text` and a newline on stdout, exit 0."""
        return ["echo", text]

    def argv_exit(self, code: int) -> list[str]:
        """Exits with `code`."""
        return ["sh", "-c", f"exit {code}"]

    def argv_stderr(self, text: str) -> list[str] | None:
        """Prints `text` and a newline on stderr only, exit 0; None: not checked."""
        return ["sh", "-c", f"echo {text} >&2"]

    def argv_sleep(self, seconds: float) -> list[str] | None:
        """Runs for `seconds`; None: the exec timeout is not checked."""
        return ["sleep", f"{seconds:g}"]

    def argv_write(self, path: str) -> list[str]:
        """Writes a file at `path`; exit 0 only if it could (read-only-root is checked)."""
        return ["sh", "-c", f"echo probe > {path}"]

    def argv_uid(self) -> list[str]:
        """Prints the numeric user id it runs as (run-as-user is checked)."""
        return ["id", "-u"]

    def argv_print_env(self, name: str) -> list[str] | None:
        """Prints the value of the environment variable `name` and a newline; None: the
        `env` of exec is not checked."""
        return ["sh", "-c", f'echo "${name}"']

    def argv_pwd(self) -> list[str] | None:
        """Prints the folder it runs in and a newline; None: `cwd` of exec is not checked."""
        return ["pwd"]

    def argv_cat(self) -> list[str] | None:
        """Copies its stdin to its stdout; None: `stdin` of exec is not checked."""
        return ["cat"]

    def argv_echo_then_sleep(self, text: str, seconds: float) -> list[str] | None:
        """Prints `text` and a newline at once, then runs for `seconds`; None: the output
        of a timed-out exec is not checked."""
        return ["sh", "-c", f"echo {text}; sleep {seconds:g}"]

    def argv_pty_shell(self) -> list[str] | None:
        """A POSIX shell with `stty` for the PTY case (it types `stty size`, `echo $((6*7))`
        and `exit 3` into it); None: the PTY case is not run."""
        return ["sh"]

    # a folder that exists in a new sandbox: exec's `cwd` is checked with it, and the FILES
    # cases work under it (in a folder of their own)
    work_folder: str = "/tmp"
    # how long the PTY case waits for each thing it typed to show (a generous limit)
    pty_timeout_s: float = 30.0

    # the user a backend declaring run-as-user is asked to run as (`user:` of a profile)
    run_as_user: str = "4242"

    # volumes (docs/volumes.md). False where a backend's volumes cannot do it (E2B's, and
    # Modal's for links): its mounts cannot be read-only (the kit then mounts read-write and checks that a read-only
    # mount is refused, InvalidRequest); its files without a sandbox cannot make links (the
    # kit's tree then has none, and a tree with one must be refused, writing nothing)
    volume_read_only: bool = True
    volume_links: bool = True

    @pytest.fixture
    def create_request(self) -> Callable[[str, Mapping[str, str]], CreateRequest]:
        return lambda sandbox_id, labels: CreateRequest(sandbox_id=sandbox_id, labels=labels)

    @pytest.fixture
    def lose(self) -> Callable[[str], Any]:
        def not_given(ref: str) -> None:
            pytest.fail("the conformance kit needs a `lose` fixture in your AdapterConformance "
                        "subclass: a callable lose(ref) that removes the object behind sbx's back")
        return not_given

    # -- running ----------------------------------------------------------------------------

    def run(self, adapter: Adapter, create_request: Callable[..., CreateRequest],
            body: Callable[[Kit], Awaitable[None]]) -> None:
        """Run one test body in its own event loop; clean up and close the adapter after."""
        async def main() -> None:
            kit = Kit(adapter, create_request, self.extra_labels, self.settle_timeout_s)
            try:
                await body(kit)
            finally:
                try:
                    await kit.cleanup()
                finally:
                    await adapter.close()

        asyncio.run(main())

    # -- identity and health ----------------------------------------------------------------

    def test_is_registered_by_entry_point(self, adapter: Adapter) -> None:
        if not self.check_entry_point:
            pytest.skip("check_entry_point = False: this adapter is not installed as a plugin")
        found = {ep.name: ep for ep in entry_points(group=GROUP)}
        assert adapter.name in found, (
            f"no entry point {adapter.name!r} in group {GROUP!r} (found: {sorted(found)})")
        assert found[adapter.name].load() is type(adapter), (
            f"entry point {adapter.name!r} loads {found[adapter.name].value}, "
            f"not {type(adapter).__module__}:{type(adapter).__qualname__}")

    def test_declares_name_and_capabilities(self, adapter: Adapter) -> None:
        assert isinstance(adapter.name, str) and re.fullmatch(r"[a-z0-9][a-z0-9_-]*", adapter.name), (
            f"adapter name {adapter.name!r}: use lower-case letters, digits, '-' or '_'")
        assert isinstance(adapter.description, str)
        assert isinstance(adapter.capabilities, frozenset)
        for capability in adapter.capabilities:
            assert isinstance(capability, Capability), f"{capability!r} is not a Capability"
            assert adapter.supports(capability), f"declares {capability} but supports() says no"

    def test_health_and_availability(self, adapter: Adapter, create_request) -> None:
        async def body(kit: Kit) -> None:
            health = await adapter.health()
            assert isinstance(health, Health)
            assert isinstance(health.detail, str) and health.detail
            assert health.reachable and health.credentials, (
                f"the kit needs a working backend; health says: {health.detail}")
            await adapter.ensure_available()
            first, second = await adapter.instance_id(), await adapter.instance_id()
            assert first == second and (first is None or isinstance(first, str))

        self.run(adapter, create_request, body)

    # -- lifecycle --------------------------------------------------------------------------

    def test_create_get_list_destroy(self, adapter: Adapter, create_request) -> None:
        async def body(kit: Kit) -> None:
            request = kit.request()
            obj = await kit.create(request)
            assert isinstance(obj, BackendObject)
            assert isinstance(obj.ref, str) and obj.ref

            got = await adapter.get(obj.ref)
            assert got is not None, "get() does not find the object create() just returned"
            assert got.ref == obj.ref
            assert got.running, f"a new sandbox is not running (status {got.status!r})"

            listed = await adapter.list({LABEL_ID: request.sandbox_id})
            assert [o.ref for o in listed] == [obj.ref]
            assert obj.ref in [o.ref for o in await adapter.list({LABEL_INSTALL: kit.install})]

            await adapter.destroy(obj.ref)
            await kit.until_gone(obj.ref, request.sandbox_id)

        self.run(adapter, create_request, body)

    def test_labels_round_trip(self, adapter: Adapter, create_request) -> None:
        """Every label sbx accepts comes back exactly from get() and list(): reconcile and
        the reaper work from them alone."""
        async def body(kit: Kit) -> None:
            request = kit.request(**{
                "team": "infra",
                "purpose.kind": "with spaces = and: colons",
                "empty": "",
                "unicode": "grüße-✓",
                "long": "x" * 253,
            })
            obj = await kit.create(request)
            for where, found in (("create()", obj), ("get()", await adapter.get(obj.ref)),
                                 ("list()", (await adapter.list({LABEL_ID: request.sandbox_id}) or [None])[0])):
                assert found is not None, f"{where} lost the object"
                missing = {k: v for k, v in request.labels.items() if found.labels.get(k) != v}
                assert not missing, f"{where} does not give back the labels {missing}"

        self.run(adapter, create_request, body)

    def test_list_filters_by_every_label(self, adapter: Adapter, create_request) -> None:
        async def body(kit: Kit) -> None:
            first, second = kit.request(role="first"), kit.request(role="second")
            a, b = await asyncio.gather(kit.create(first), kit.create(second))
            assert a.ref != b.ref, "two creates at once gave the same object"
            both = {o.ref for o in await adapter.list({LABEL_INSTALL: kit.install})}
            assert both == {a.ref, b.ref}
            only = await adapter.list({LABEL_INSTALL: kit.install, "role": "first"})
            assert [o.ref for o in only] == [a.ref]
            assert await adapter.list({LABEL_INSTALL: kit.install, "role": "third"}) == []
            assert await adapter.list({LABEL_INSTALL: kit.install + "-other"}) == []

        self.run(adapter, create_request, body)

    def test_destroy_is_idempotent(self, adapter: Adapter, create_request) -> None:
        """Already gone, or being removed by someone else at the same time, is success."""
        async def body(kit: Kit) -> None:
            one, two = kit.request(), kit.request()
            a, b = await asyncio.gather(kit.create(one), kit.create(two))
            await adapter.destroy(a.ref)
            await adapter.destroy(a.ref)
            await kit.until_gone(a.ref, one.sandbox_id)
            await adapter.destroy(a.ref)
            await asyncio.gather(adapter.destroy(b.ref), adapter.destroy(b.ref))
            await kit.until_gone(b.ref, two.sandbox_id)

        self.run(adapter, create_request, body)

    def test_destroy_takes_the_services_hint(self, adapter: Adapter, create_request) -> None:
        """`destroy(ref, services=False)`, as the core calls it for a sandbox made without
        services, removes the sandbox like `destroy(ref)` (the keyword is in the contract)."""
        async def body(kit: Kit) -> None:
            request = kit.request()
            obj = await kit.create(request)
            await adapter.destroy(obj.ref, services=False)
            await kit.until_gone(obj.ref, request.sandbox_id)

        self.run(adapter, create_request, body)

    def test_after_the_backend_loses_a_sandbox(self, adapter: Adapter, create_request,
                                                lose) -> None:
        """Removed behind sbx's back: get() says None, list() leaves it out, destroy succeeds,
        and every other call fails with an AdapterError (BackendObjectGone at best), never
        another exception and never a hang."""
        async def body(kit: Kit) -> None:
            request = kit.request()
            obj = await kit.create(request)
            await _maybe_await(lose(obj.ref))
            await kit.until_gone(obj.ref, request.sandbox_id)
            await adapter.destroy(obj.ref)
            if adapter.supports(Capability.EXEC):
                with pytest.raises(AdapterError):
                    await asyncio.wait_for(adapter.exec(obj.ref, self.argv_echo("hi")), 60)
            if adapter.supports(Capability.PAUSE):
                with pytest.raises(AdapterError):
                    await asyncio.wait_for(adapter.pause(obj.ref), 60)
            if adapter.supports(Capability.FILES):
                with pytest.raises(AdapterError):
                    await asyncio.wait_for(adapter.stat_file(obj.ref, "/"), 60)

        self.run(adapter, create_request, body)

    # -- exec -------------------------------------------------------------------------------

    def test_exec_exit_codes_and_output(self, adapter: Adapter, create_request) -> None:
        if not adapter.supports(Capability.EXEC):
            pytest.skip(f"{adapter.name} does not declare exec (refusal: test_capability[exec])")

        async def body(kit: Kit) -> None:
            obj = await kit.create()
            for code in (0, 1, 3, 42):
                result = await adapter.exec(obj.ref, self.argv_exit(code))
                assert isinstance(result, ExecResult)
                assert result.exit_code == code, (
                    f"exit {code} came back as {result.exit_code} ({result.stderr!r})")
                assert not result.timed_out
            echoed = await adapter.exec(obj.ref, self.argv_echo("hello conformance"))
            assert (echoed.exit_code, echoed.stdout) == (0, b"hello conformance\n")
            assert echoed.duration_s >= 0
            argv = self.argv_stderr("to-stderr")
            if argv is not None:
                err = await adapter.exec(obj.ref, argv)
                assert (err.exit_code, err.stdout, err.stderr) == (0, b"", b"to-stderr\n"), (
                    "stdout and stderr must come back apart")

        self.run(adapter, create_request, body)

    def test_exec_timeout(self, adapter: Adapter, create_request) -> None:
        if not adapter.supports(Capability.EXEC):
            pytest.skip(f"{adapter.name} does not declare exec")
        argv = self.argv_sleep(self.exec_timeout_s + self.exec_timeout_slack_s + 30)
        if argv is None:
            pytest.skip("argv_sleep() is None: this backend has no command that waits")

        async def body(kit: Kit) -> None:
            obj = await kit.create()
            started = time.monotonic()
            result = await asyncio.wait_for(
                adapter.exec(obj.ref, argv, timeout_s=self.exec_timeout_s),
                self.exec_timeout_s + self.exec_timeout_slack_s)
            took = time.monotonic() - started
            assert result.timed_out, f"a command past its timeout was not reported: {result}"
            assert result.exit_code == 124, "a timed-out command reports exit 124, as timeout(1)"
            assert took < self.exec_timeout_s + self.exec_timeout_slack_s
            again = await adapter.exec(obj.ref, self.argv_echo("still here"))
            assert (again.exit_code, again.stdout) == (0, b"still here\n"), (
                f"after a timed-out command, the next one failed: {again}")

        self.run(adapter, create_request, body)

    def test_exec_environment(self, adapter: Adapter, create_request) -> None:
        """`exec(..., env=)` adds the variables to that command's environment only (the core
        passes TRACEPARENT this way), in `exec` and `exec_stream` alike."""
        if not adapter.supports(Capability.EXEC):
            pytest.skip(f"{adapter.name} does not declare exec")
        argv = self.argv_print_env("SBX_CONFORMANCE_ENV")
        if argv is None:
            pytest.skip("argv_print_env() is None: this backend has no command that prints "
                        "a variable")
        for method in (adapter.exec, adapter.exec_stream):
            assert "env" in inspect.signature(method).parameters, (
                f"{type(adapter).__name__}.{method.__name__} takes no `env`, which the core "
                "passes to every command (docs/adapters.md)")

        async def body(kit: Kit) -> None:
            obj = await kit.create()
            value = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
            result = await adapter.exec(obj.ref, argv, env={"SBX_CONFORMANCE_ENV": value})
            assert (result.exit_code, result.stdout) == (0, f"{value}\n".encode()), (
                f"exec(env=...) did not reach the command: {result}")
            streamed = b""
            async for item in adapter.exec_stream(obj.ref, argv,
                                                  env={"SBX_CONFORMANCE_ENV": value[::-1]}):
                if isinstance(item, tuple) and item[0] == "stdout":
                    streamed += item[1]
            assert streamed == f"{value[::-1]}\n".encode(), "exec_stream(env=...) did not"
            again = await adapter.exec(obj.ref, argv)
            assert again.stdout.strip() == b"", "one exec's env stayed for the next one"

        self.run(adapter, create_request, body)

    def test_exec_options(self, adapter: Adapter, create_request) -> None:
        """`exec(..., cwd=, stdin=, user=)` and the same for exec_stream: the command runs
        in `cwd`, reads `stdin` (bytes, or chunks from an async iterator) to its end, and
        runs as `user` on a backend declaring run-as-user; one without it refuses `user`
        (CapabilityNotSupported naming the backend) and runs nothing."""
        if not adapter.supports(Capability.EXEC):
            pytest.skip(f"{adapter.name} does not declare exec")
        for method in (adapter.exec, adapter.exec_stream):
            missing = {"cwd", "user", "stdin"} - set(inspect.signature(method).parameters)
            assert not missing, (
                f"{type(adapter).__name__}.{method.__name__} takes no {sorted(missing)} "
                "(docs/adapters.md, exec)")

        async def body(kit: Kit) -> None:
            obj = await kit.create()
            pwd = self.argv_pwd()
            if pwd is not None:
                here = await adapter.exec(obj.ref, pwd, cwd=self.work_folder)
                assert (here.exit_code, here.stdout) == (0, f"{self.work_folder}\n".encode()), (
                    f"exec(cwd={self.work_folder!r}) did not run there: {here}")
            cat = self.argv_cat()
            if cat is not None:
                # text: stdin is what is checked, not whether a backend's stdout is binary
                data = "\n".join(secrets.token_hex(32) for _ in range(1_500)).encode() + b"\n"

                async def pieces() -> AsyncIterator[bytes]:
                    for at in range(0, len(data), 7_000):
                        yield data[at:at + 7_000]

                echoed = await adapter.exec(obj.ref, cat, stdin=data)
                assert (echoed.exit_code, echoed.stdout) == (0, data), (
                    f"exec(stdin=bytes) did not reach the command whole (exit "
                    f"{echoed.exit_code}, {len(echoed.stdout)} of {len(data)} bytes back)")
                chunked = await adapter.exec(obj.ref, cat, stdin=pieces())
                assert chunked.stdout == data, "exec(stdin=<async iterator>) did not"
                streamed = b""
                async for item in adapter.exec_stream(obj.ref, cat, stdin=pieces()):
                    if isinstance(item, tuple) and item[0] == "stdout":
                        streamed += item[1]
                assert streamed == data, "exec_stream(stdin=...) did not"
                empty = await adapter.exec(obj.ref, cat)
                assert (empty.exit_code, empty.stdout) == (0, b""), (
                    "without stdin a command reads an empty input, it does not wait")
            if adapter.supports(Capability.RUN_AS_USER):
                uid = await adapter.exec(obj.ref, self.argv_uid(), user=self.run_as_user)
                assert uid.stdout.decode().strip() == self.run_as_user.split(":")[0], (
                    f"exec(user={self.run_as_user!r}) ran as uid {uid.stdout!r}")
            else:
                with pytest.raises(CapabilityNotSupported) as refused:
                    await adapter.exec(obj.ref, self.argv_echo("no"), user=self.run_as_user)
                assert adapter.name in str(refused.value), (
                    f"the refusal of user= must name the backend: {refused.value}")

        self.run(adapter, create_request, body)

    def test_exec_timeout_keeps_the_output(self, adapter: Adapter, create_request) -> None:
        """A timed-out exec comes back within `exec_timeout_return_s` of its deadline (plus
        `exec_timeout_return_slack_s` for a slow backend) with exit 124, timed_out, what the
        command printed until then, and the "sbx: timed out" note on stderr; exec_stream
        gives the same."""
        if not adapter.supports(Capability.EXEC):
            pytest.skip(f"{adapter.name} does not declare exec")
        argv = self.argv_echo_then_sleep("partial", self.exec_timeout_s + 60)
        if argv is None:
            pytest.skip("argv_echo_then_sleep() is None: this backend has no command that "
                        "prints and then waits")
        limit = self.exec_timeout_return_s + self.exec_timeout_return_slack_s

        async def body(kit: Kit) -> None:
            obj = await kit.create()
            started = time.monotonic()
            result = await asyncio.wait_for(
                adapter.exec(obj.ref, argv, timeout_s=self.exec_timeout_s),
                self.exec_timeout_s + self.exec_timeout_slack_s)
            late = time.monotonic() - started - self.exec_timeout_s
            assert (result.exit_code, result.timed_out) == (124, True), result
            assert late <= limit, (f"a timed-out exec came back {late:.2f}s after its "
                                   f"deadline (at most {limit:g}s)")
            assert result.stdout == b"partial\n", (
                f"the output printed before the timeout was lost: {result.stdout!r}")
            assert b"sbx: timed out after" in result.stderr, result.stderr
            items: list[Any] = []
            started = time.monotonic()
            async for item in adapter.exec_stream(obj.ref, argv, timeout_s=self.exec_timeout_s):
                items.append(item)
            late = time.monotonic() - started - self.exec_timeout_s
            assert late <= limit, f"exec_stream came back {late:.2f}s after its deadline"
            out = b"".join(i[1] for i in items if isinstance(i, tuple) and i[0] == "stdout")
            assert out == b"partial\n", f"exec_stream lost the output: {items}"
            assert isinstance(items[-1], ExecResult) and items[-1].timed_out
            assert items[-1].exit_code == 124

        self.run(adapter, create_request, body)

    # -- files (Capability.FILES) -------------------------------------------------------------

    def _files_or_skip(self, adapter: Adapter) -> None:
        if not adapter.supports(Capability.FILES):
            pytest.skip(f"{adapter.name} does not declare files (refusal: "
                        "test_capability[files])")

    def test_files_archive_round_trip(self, adapter: Adapter, create_request) -> None:
        """put_archive unpacks a tar stream into a folder (made with its parents), and
        get_archive gives a file or a folder back as a tar whose one top entry is its base
        name: contents, modes, empty folders and links inside as they went in."""
        self._files_or_skip(adapter)

        async def body(kit: Kit) -> None:
            obj = await kit.create()
            base = f"{self.work_folder.rstrip('/')}/sbx-kit-{secrets.token_hex(4)}"
            data = secrets.token_bytes(300_000)
            await adapter.put_archive(obj.ref, f"{base}/in", _chunked(_kit_tree(data)))
            back = await _gather(adapter.get_archive(obj.ref, f"{base}/in/tree"))
            members = _members(back)
            assert sorted(members) == sorted(_KIT_TREE), (
                f"get_archive of a folder gave {sorted(members)}")
            for name, (kind, mode, content) in _KIT_TREE.items():
                got = members[name]
                assert got[0] == kind, f"{name}: a {got[0]}, not a {kind}"
                if kind != "symlink":
                    assert got[1] == mode, f"{name}: mode {got[1]:o}, not {mode:o}"
                expected = data if content is None else content
                assert got[2] == expected, f"{name}: its content did not come back"
            one = _members(await _gather(adapter.get_archive(obj.ref, f"{base}/in/tree/data")))
            assert list(one) == ["data"] and one["data"][2] == data, (
                "get_archive of a file must give one entry named by its base name")
            with pytest.raises(NoSuchPath):
                await _gather(adapter.get_archive(obj.ref, f"{base}/nothing-here"))

        self.run(adapter, create_request, body)

    def test_files_operations(self, adapter: Adapter, create_request) -> None:
        """list_files, stat_file, make_dir, rename_file and remove_file, and NoSuchPath
        where the path is missing."""
        self._files_or_skip(adapter)

        async def body(kit: Kit) -> None:
            obj = await kit.create()
            base = f"{self.work_folder.rstrip('/')}/sbx-kit-{secrets.token_hex(4)}"
            await adapter.put_archive(obj.ref, base, _chunked(_kit_tree(b"0123456789")))
            tree = f"{base}/tree"
            info = await adapter.stat_file(obj.ref, f"{tree}/data")
            assert isinstance(info, FileInfo)
            assert (info.path, info.name, info.type, info.size, info.mode) == (
                f"{tree}/data", "data", "file", 10, 0o640), info
            assert info.mtime.tzinfo is not None, "FileInfo.mtime must be aware (UTC)"
            link = await adapter.stat_file(obj.ref, f"{tree}/link")
            assert link is not None and (link.type, link.target) == ("symlink", "data"), (
                f"stat_file must not follow a link, and give its target: {link}")
            folder = await adapter.stat_file(obj.ref, f"{tree}/empty")
            assert folder is not None and folder.type == "dir"
            assert await adapter.stat_file(obj.ref, f"{tree}/missing") is None

            listed = await adapter.list_files(obj.ref, tree)
            assert [i.name for i in listed] == sorted(n.split("/")[-1] for n in _KIT_TREE
                                                      if n.count("/") == 1), listed
            deeper = await adapter.list_files(obj.ref, tree, depth=2)
            assert f"{tree}/sub/inner.txt" in [i.path for i in deeper]
            assert f"{tree}/sub/inner.txt" not in [i.path for i in listed]
            with pytest.raises(NoSuchPath):
                await adapter.list_files(obj.ref, f"{tree}/missing")

            await adapter.make_dir(obj.ref, f"{tree}/new/a/b")
            await adapter.make_dir(obj.ref, f"{tree}/new/a/b")  # there: success
            assert (await adapter.stat_file(obj.ref, f"{tree}/new/a/b")).type == "dir"
            with pytest.raises(NoSuchPath):
                await adapter.make_dir(obj.ref, f"{tree}/none/x", parents=False)

            await adapter.rename_file(obj.ref, f"{tree}/data", f"{tree}/moved")
            assert await adapter.stat_file(obj.ref, f"{tree}/data") is None
            assert (await adapter.stat_file(obj.ref, f"{tree}/moved")).size == 10
            await adapter.rename_file(obj.ref, f"{tree}/moved", f"{tree}/new")  # into it
            assert (await adapter.stat_file(obj.ref, f"{tree}/new/moved")).type == "file"
            with pytest.raises(NoSuchPath):
                await adapter.rename_file(obj.ref, f"{tree}/missing", f"{tree}/elsewhere")

            with pytest.raises(InvalidRequest):
                await adapter.remove_file(obj.ref, f"{tree}/new")  # not empty
            assert await adapter.stat_file(obj.ref, f"{tree}/new/moved") is not None
            await adapter.remove_file(obj.ref, f"{tree}/new", recursive=True)
            assert await adapter.stat_file(obj.ref, f"{tree}/new") is None
            await adapter.remove_file(obj.ref, f"{tree}/empty")
            await adapter.remove_file(obj.ref, f"{tree}/link")
            assert await adapter.stat_file(obj.ref, f"{tree}/link") is None
            with pytest.raises(NoSuchPath):
                await adapter.remove_file(obj.ref, f"{tree}/missing")

        self.run(adapter, create_request, body)

    # -- a terminal (Capability.PTY) ---------------------------------------------------------

    def test_pty_terminal(self, adapter: Adapter, create_request) -> None:
        """open_pty runs a shell on a terminal of the size asked for (`stty size`), with
        exec's env and cwd and TERM set; what is typed reaches it, resize changes what
        `stty size` says, `exit 3` ends it: read() gives b"" and exit_code is 3; close() is
        idempotent, after the end too. A backend without pty: open_pty is refused
        (CapabilityNotSupported) naming the backend."""
        declared = adapter.supports(Capability.PTY)
        argv = self.argv_pty_shell()
        if declared and argv is None:
            pytest.skip("argv_pty_shell() is None: no shell with stty in this backend's sandboxes")

        async def body(kit: Kit) -> None:
            obj = await kit.create()
            if not declared:
                with pytest.raises(CapabilityNotSupported) as refused:
                    await asyncio.wait_for(adapter.open_pty(obj.ref, ["sh"]), 60)
                assert adapter.name in str(refused.value), (
                    f"the refusal must name the backend: {refused.value}")
                return
            term = await adapter.open_pty(obj.ref, argv, cols=80, rows=24,
                                          env={"SBX_KIT_PTY": "kit-value"},
                                          cwd=self.work_folder)
            assert isinstance(term, PtyChannel), f"open_pty gave {term!r}, not a PtyChannel"
            try:
                await term.write(b'stty size; echo "$((6*7))"; '
                                 b'echo "[$SBX_KIT_PTY:$TERM:$(pwd)]"\n')
                seen = await _pty_until(term, [b"24 80", b"42",
                                               f"[kit-value:xterm-256color:{self.work_folder}]"
                                               .encode()], self.pty_timeout_s)
                await term.resize(100, 30)
                await term.write(b"stty size\n")
                await _pty_until(term, [b"30 100"], self.pty_timeout_s)
                await term.write(b"exit 3\n")
                rest = await _pty_until(term, [], self.pty_timeout_s)
                assert term.exit_code == 3, (
                    f"exit 3 typed into the shell: exit_code is {term.exit_code!r} "
                    f"(output: {(seen + rest)[-400:]!r})")
                assert await term.read() == b"", "read() after the end must stay b\"\""
            finally:
                await term.close()
            await term.close()  # idempotent, after the program ended by itself

            other = await adapter.open_pty(obj.ref, argv)
            await other.write(b"echo started\n")
            await _pty_until(other, [b"started"], self.pty_timeout_s)
            await asyncio.wait_for(other.close(), self.pty_timeout_s)  # a running program
            await other.close()
            still = await adapter.get(obj.ref)
            assert still is not None and still.running, "closing a terminal ended the sandbox"

        self.run(adapter, create_request, body)

    # -- each capability: exercised when declared, refused cleanly when not ----------------

    @pytest.mark.parametrize("capability", list(Capability), ids=[c.value for c in Capability])
    def test_capability(self, adapter: Adapter, create_request, capability: Capability) -> None:
        declared = adapter.supports(capability)

        async def body(kit: Kit) -> None:
            if capability == Capability.PROCESSES:
                # run by the core through exec and a POSIX sh in the sandbox: no call of
                # its own, but it cannot be declared without exec
                if declared:
                    assert kit.adapter.supports(Capability.EXEC), (
                        "processes declared without exec, which they run through")
                return
            if capability in (Capability.MEMORY_CHECKPOINT, Capability.SERVICES):
                # no call of their own: supports() is all there is (services ride on
                # CreateRequest.services, which the core refuses for a backend without them;
                # the Docker pods are tested in tests/backends/test_docker_pods.py)
                return
            if capability in (Capability.READ_ONLY_ROOT, Capability.RUN_AS_USER,
                              Capability.ISOLATION_GVISOR):
                # asked through CreateRequest, which the core refuses for a backend without them
                if declared:
                    await self._hardened(kit, capability)
                return
            if capability == Capability.VOLUMES and declared:
                await self._volume(kit)
                return
            if capability == Capability.SHELL:
                # a command line for a person's terminal: built here, not run (no terminal)
                obj = await kit.create()
                if declared:
                    argv = kit.adapter.shell_argv(obj.ref)
                    assert argv and all(isinstance(a, str) and a for a in argv), (
                        f"shell_argv() must give a command line, not {argv!r}")
                else:
                    with pytest.raises(CapabilityNotSupported):
                        kit.adapter.shell_argv(obj.ref)
                return
            obj = await kit.create()
            if declared:
                await self._exercise(kit, obj, capability)
            else:
                await self._refused(kit, obj, capability)

        self.run(adapter, create_request, body)

    async def _exercise(self, kit: Kit, obj: BackendObject, capability: Capability) -> None:
        adapter = kit.adapter
        if capability == Capability.EXEC:
            result = await adapter.exec(obj.ref, self.argv_echo("exec works"))
            assert result.stdout == b"exec works\n"
        elif capability == Capability.LOGS:
            chunks = await _first_items(lambda: adapter.logs(obj.ref, follow=False, tail=10),
                                        100, self.stream_timeout_s)
            assert all(isinstance(c, bytes) for c in chunks)
        elif capability == Capability.METRICS:
            samples = await _first_items(lambda: adapter.metrics(obj.ref), 1,
                                         self.stream_timeout_s)
            assert samples and isinstance(samples[0], MetricSample), "no metric sample came"
        elif capability == Capability.SET_DEADLINE:
            await adapter.set_deadline(obj.ref, datetime.now(UTC) + timedelta(minutes=30))
            assert (await adapter.get(obj.ref)) is not None
        elif capability == Capability.PAUSE:
            await adapter.pause(obj.ref)
            paused = await adapter.get(obj.ref)
            assert paused is not None and paused.status == "paused", (
                f"a paused sandbox must report status 'paused' (got {paused})")
            await adapter.resume(obj.ref)
            resumed = await adapter.get(obj.ref)
            assert resumed is not None and resumed.running and resumed.status != "paused"
        elif capability == Capability.SNAPSHOT:
            await self._snapshot_restore(kit, obj)
        elif capability == Capability.FILES:
            folder = f"{self.work_folder.rstrip('/')}/sbx-kit-{secrets.token_hex(4)}"
            await adapter.put_archive(obj.ref, folder, _chunked(_kit_tree(b"files work")))
            back = _members(await _gather(adapter.get_archive(obj.ref, f"{folder}/tree/data")))
            assert back == {"data": ("file", 0o640, b"files work")}, back
        elif capability == Capability.PTY and self.argv_pty_shell() is not None:
            term = await adapter.open_pty(obj.ref, self.argv_pty_shell())
            try:
                await term.write(b"exit 5\n")
                await _pty_until(term, [], self.pty_timeout_s)
                assert term.exit_code == 5, f"exit 5 typed: exit_code {term.exit_code!r}"
            finally:
                await term.close()

    async def _volume(self, kit: Kit) -> None:
        """A volume made, listed by its labels, written through open_volume's helper (no
        sandbox), read in a sandbox that mounts it, then removed (twice: already gone is
        success), and no longer listed (docs/volumes.md)."""
        adapter = kit.adapter
        volume_id = f"vol-{secrets.token_hex(6)}"
        labels = {LABEL_VOLUME: volume_id, LABEL_INSTALL: kit.install}
        ref = await adapter.create_volume(volume_id, labels)
        try:
            assert ref in await adapter.list_volumes({LABEL_VOLUME: volume_id}), (
                f"list_volumes() does not show {ref}")
            helper = await adapter.open_volume(ref, {LABEL_VOLUME: volume_id})
            try:
                if not self.volume_links:
                    with pytest.raises(InvalidRequest):
                        await adapter.put_archive(helper, "/volume", _chunked(_kit_tree(b"no")))
                    with pytest.raises(NoSuchPath):  # nothing was written
                        await _gather(adapter.get_archive(helper, "/volume/tree"))
                await adapter.put_archive(helper, "/volume", _chunked(
                    _kit_tree(b"kept", links=self.volume_links)))
            finally:
                await adapter.close_volume(helper)
            size = await adapter.volume_size(ref)
            assert size is None or size >= 0
            if adapter.supports(Capability.EXEC):
                if not self.volume_read_only:
                    with pytest.raises(InvalidRequest):
                        await kit.create(replace(kit.request(), mounts=(
                            VolumeMountSpec(ref, "/sbx-kit-volume", read_only=True),)))
                obj = await kit.create(replace(kit.request(), mounts=(
                    VolumeMountSpec(ref, "/sbx-kit-volume", read_only=self.volume_read_only),)))
                said = await adapter.exec(obj.ref, ["cat", "/sbx-kit-volume/tree/data"])
                assert said.stdout == b"kept", said
                await adapter.destroy(obj.ref)
        finally:
            await adapter.remove_volume(ref)
        await adapter.remove_volume(ref)
        assert ref not in await adapter.list_volumes({LABEL_VOLUME: volume_id})

    async def _hardened(self, kit: Kit, capability: Capability) -> None:
        """A sandbox made with `read_only` / `user` is what was asked (seen through exec)."""
        adapter = kit.adapter
        if capability == Capability.READ_ONLY_ROOT:
            obj = await kit.create(replace(kit.request(), read_only=True))
            if adapter.supports(Capability.EXEC):
                root = await adapter.exec(obj.ref, self.argv_write("/sbx-conformance-probe"))
                assert root.exit_code != 0, "read_only: writing to / must fail"
                tmp = await adapter.exec(obj.ref, self.argv_write("/tmp/sbx-conformance-probe"))
                assert tmp.exit_code == 0, f"read_only: /tmp must stay writable ({tmp.stderr!r})"
        elif capability == Capability.ISOLATION_GVISOR:  # that it is gVisor: tests/gvisor
            obj = await kit.create(replace(kit.request(), isolation="gvisor"))
            if adapter.supports(Capability.EXEC):
                said = await adapter.exec(obj.ref, self.argv_echo("under gvisor"))
                assert said.stdout == b"under gvisor\n", said
        else:
            obj = await kit.create(replace(kit.request(), user=self.run_as_user))
            if adapter.supports(Capability.EXEC):
                uid = (await adapter.exec(obj.ref, self.argv_uid())).stdout.decode().strip()
                assert uid == self.run_as_user.split(":")[0], (
                    f"user {self.run_as_user!r}: commands run as uid {uid!r}")
        got = await adapter.get(obj.ref)
        assert got is not None and got.running

    async def _snapshot_restore(self, kit: Kit, obj: BackendObject) -> None:
        adapter = kit.adapter
        checkpoint = f"ckpt-{secrets.token_hex(6)}"
        labels = {LABEL_CHECKPOINT: checkpoint, LABEL_INSTALL: kit.install}
        artifact = await adapter.snapshot(obj.ref, labels)
        assert isinstance(artifact, Artifact) and artifact.ref
        listed = await adapter.list_artifacts({LABEL_INSTALL: kit.install})
        mine = [a for a in listed if a.ref == artifact.ref]
        assert mine, f"list_artifacts() does not show {artifact.ref}"
        assert mine[0].labels.get(LABEL_CHECKPOINT) == checkpoint
        restored = await adapter.restore(artifact.ref, kit.request(restored="yes"))
        kit.refs.append(restored.ref)
        assert restored.ref != obj.ref
        got = await adapter.get(restored.ref)
        assert got is not None and got.running
        await adapter.destroy(restored.ref)
        await adapter.delete_artifact(artifact.ref)
        await adapter.delete_artifact(artifact.ref)  # already gone: success
        assert artifact.ref not in [a.ref for a in
                                    await adapter.list_artifacts({LABEL_INSTALL: kit.install})]

    async def _refused(self, kit: Kit, obj: BackendObject, capability: Capability) -> None:
        """Every call of an undeclared capability raises CapabilityNotSupported (which the
        CLI reports as exit 4) and changes nothing."""
        adapter, ref = kit.adapter, obj.ref
        later = datetime.now(UTC) + timedelta(minutes=30)
        work = self.work_folder.rstrip("/")
        calls: dict[Capability, list[Callable[[], Awaitable[Any]]]] = {
            Capability.EXEC: [lambda: adapter.exec(ref, self.argv_echo("no"))],
            Capability.LOGS: [lambda: _first_items(lambda: adapter.logs(ref), 1, 30)],
            Capability.METRICS: [lambda: _first_items(lambda: adapter.metrics(ref), 1, 30)],
            Capability.SET_DEADLINE: [lambda: adapter.set_deadline(ref, later)],
            Capability.PAUSE: [lambda: adapter.pause(ref), lambda: adapter.resume(ref)],
            Capability.SNAPSHOT: [
                lambda: adapter.snapshot(ref, {LABEL_INSTALL: kit.install}),
                lambda: adapter.list_artifacts({LABEL_INSTALL: kit.install}),
                lambda: adapter.restore("no-such-artifact", kit.request()),
                lambda: adapter.delete_artifact("no-such-artifact"),
            ],
            Capability.FILES: [
                lambda: adapter.put_archive(ref, f"{work}/sbx-kit", _chunked(_kit_tree(b"no"))),
                lambda: _gather(adapter.get_archive(ref, work)),
                lambda: adapter.list_files(ref, work),
                lambda: adapter.stat_file(ref, work),
                lambda: adapter.remove_file(ref, f"{work}/sbx-kit"),
                lambda: adapter.make_dir(ref, f"{work}/sbx-kit"),
                lambda: adapter.rename_file(ref, f"{work}/sbx-kit", f"{work}/sbx-kit-2"),
            ],
            Capability.PTY: [lambda: adapter.open_pty(ref, ["sh"])],
            Capability.PORTS: [lambda: adapter.port_endpoints(ref),
                               lambda: adapter.expose_port(ref, 8080)],
            Capability.VOLUMES: [lambda: adapter.create_volume("vol-kit", {}),
                                 lambda: adapter.remove_volume("no-such-volume"),
                                 lambda: adapter.list_volumes({LABEL_INSTALL: kit.install}),
                                 lambda: adapter.open_volume("no-such-volume", {}),
                                 lambda: adapter.close_volume("no-such-helper")],
        }
        for call in calls[capability]:
            with pytest.raises(CapabilityNotSupported) as refused:
                await asyncio.wait_for(call(), 60)
            if capability == Capability.PTY:
                assert adapter.name in str(refused.value), (
                    f"the refusal must name the backend: {refused.value}")
        still = await adapter.get(ref)
        assert still is not None and still.running, "a refused call changed the sandbox"


# The tree the FILES cases put in and read back: name -> (kind, mode, content; None: the
# test's data)
_KIT_TREE: dict[str, tuple[str, int, bytes | None]] = {
    "tree": ("dir", 0o755, b""),
    "tree/data": ("file", 0o640, None),
    "tree/run.sh": ("file", 0o755, b"#!/bin/sh\necho hi\n"),
    "tree/empty": ("dir", 0o700, b""),
    "tree/sub": ("dir", 0o750, b""),
    "tree/sub/inner.txt": ("file", 0o644, b"inner\n"),
    "tree/link": ("symlink", 0o777, b"data"),
}


def _kit_tree(data: bytes, *, links: bool = True) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, (kind, mode, content) in _KIT_TREE.items():
            if kind == "symlink" and not links:
                continue
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, int(time.time())
            body = data if content is None else content
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, body.decode()
                tar.addfile(info)
            else:
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


async def _pty_until(term: PtyChannel, wanted: list[bytes], timeout_s: float) -> bytes:
    """Read the terminal until every one of `wanted` has shown (none wanted: until its end,
    b""); the output read. An AssertionError naming what did not show within `timeout_s`."""
    seen = b""

    async def read() -> None:
        nonlocal seen
        while not wanted or not all(w in seen for w in wanted):
            chunk = await term.read()
            if not chunk:
                return
            seen += chunk

    try:
        await asyncio.wait_for(read(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"the terminal did not show {[w for w in wanted if w not in seen]}"
                             f"{' (nor end)' if not wanted else ''} within {timeout_s:g}s; "
                             f"it showed: {seen[-400:]!r}") from None
    missing = [w for w in wanted if w not in seen]
    assert not missing, f"the terminal ended before it showed {missing}: {seen[-400:]!r}"
    return seen


async def _chunked(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at:at + size]


async def _gather(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


def _members(data: bytes) -> dict[str, tuple[str, int, bytes]]:
    """A tar's entries: name (without a trailing `/`) -> (kind, mode, content or link)."""
    found = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            name = member.name.rstrip("/").removeprefix("./")
            if member.isdir():
                found[name] = ("dir", member.mode & 0o7777, b"")
            elif member.issym():
                found[name] = ("symlink", member.mode & 0o7777, member.linkname.encode())
            else:
                source = tar.extractfile(member)
                found[name] = ("file", member.mode & 0o7777, source.read() if source else b"")
    return found
