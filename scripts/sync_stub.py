#!/usr/bin/env python3
"""sandboxer/_sync.pyi, the sync API as a type checker and an IDE see it, made from the
classes themselves: `sandboxer._sync` attaches the sync twins at import (`_make_twin`),
which no type checker follows, so this writes them out with the signatures and docstrings
of their async originals and the sync handles in place of the async ones (Modal's habit).

    python scripts/sync_stub.py --write   # rewrite sandboxer/_sync.pyi
    python scripts/sync_stub.py --check   # exit 1 when sandboxer/_sync.pyi is not this output

tests/api/test_typing.py runs the check.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "sandboxer" / "_sync.pyi"

# Where each name an annotation may use comes from. A name not here stops the generator:
# add it (a new type in a signature of the async API).
IMPORTS = {
    "asyncio": "import asyncio",
    "AsyncIterator": "from collections.abc import AsyncIterator",
    "Awaitable": "from collections.abc import Awaitable",
    "Callable": "from collections.abc import Callable",
    "Iterator": "from collections.abc import Iterator",
    "Mapping": "from collections.abc import Mapping",
    "Sequence": "from collections.abc import Sequence",
    "datetime": "from datetime import datetime",
    "timedelta": "from datetime import timedelta",
    "Path": "from pathlib import Path",
    "Any": "from typing import Any",
    "BinaryIO": "from typing import BinaryIO",
    "Generic": "from typing import Generic",
    "Literal": "from typing import Literal",
    "TypeVar": "from typing import TypeVar",
    "AsyncCheckpoint": "from sandboxer._api import AsyncCheckpoint",
    "AsyncSandbox": "from sandboxer._api import AsyncSandbox",
    "AsyncSandboxer": "from sandboxer._api import AsyncSandboxer",
    "Duration": "from sandboxer._api import Duration",
    "AsyncFiles": "from sandboxer._files import AsyncFiles",
    "AsyncTerminal": "from sandboxer._terminals import AsyncTerminal",
    **{name: f"from sandboxer._processes import {name}" for name in (
        "AsyncProcess", "AsyncProcesses", "ProcessOutput", "ProcessRecord")},
    **{name: f"from sandboxer._records import {name}" for name in (
        "BackendStatus", "CheckpointRecord", "Event", "ExecExit", "ExecResult", "FileInfo",
        "FileTransfer", "InventoryChange", "MetricSample", "OutputChunk", "PoolInfo", "ProfileInfo",
        "ReapReport", "SandboxRecord", "VolumeRecord")},
    "Transport": "from sandboxer._transport import Transport",
    "Error": "from sandboxer.core.rules.errors import SbxError as Error",
    "Profile": "from sandboxer.core.rules.profiles import Profile",
    "State": "from sandboxer.core.rules.states import State",
}
BUILTINS = {"None", "bool", "bytes", "dict", "float", "int", "list", "object", "str", "tuple",
            "type", "set", "frozenset"}
# The async handles and what the sync API gives in their place (`sandboxer._sync._wrap`:
# a handle, or a list or tuple of them; `create`'s awaitable is its sandbox; a watch is an
# iterator of its changes).
SYNC_OF = {
    "AsyncSandboxer": "Sandboxer",
    "AsyncSandbox": "Sandbox",
    "AsyncCheckpoint": "Checkpoint",
    "AsyncFiles": "Files",
    "AsyncProcesses": "Processes",
    "AsyncProcess": "Process",
    "AsyncTerminal": "Terminal",
    "_Creating": "Sandbox",
    "AsyncInventoryWatch": "SyncIterator[InventoryChange]",
}
HANDLES = re.compile(r"\b(" + "|".join(SYNC_OF) + r")\b")


def _noted(text: str) -> str:
    """`text`, an annotation of the stub, noted for its imports."""
    _NOTED.append(text)
    return text


_NOTED: list[str] = []


def _sync_type(text: str, where: str) -> str:
    if HANDLES.search(text) and re.search(r"\b(dict|Mapping)\[", text):
        raise SystemExit(f"{where}: {text!r} holds a handle in a mapping, which the sync "
                         "API does not turn into a sync handle (sandboxer._sync._wrap)")
    return HANDLES.sub(lambda m: SYNC_OF[m.group(1)], text)


def _returns(original: Callable[..., Any], where: str) -> str:
    """What the sync twin of `original` returns (sandboxer._sync._twin_of)."""
    text = str(inspect.signature(original, eval_str=False).return_annotation)
    if inspect.isasyncgenfunction(original):
        found = re.fullmatch(r"AsyncIterator\[(.*)\]", text)
        if not found:
            raise SystemExit(f"{where}: an async generator should say AsyncIterator[...]")
        return f"SyncIterator[{_sync_type(found.group(1), where)}]"
    if inspect.iscoroutinefunction(original) and "AsyncIterator" in text:
        raise SystemExit(f"{where}: a coroutine that returns an async iterator has no twin")
    text = re.sub(r"\bAsyncIterator\[", "SyncIterator[", text)  # a plain def's stream
    return _sync_type(text, where)


def _default(value: Any) -> str:
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    return "..."


def _parameters(function: Callable[..., Any], where: str, *, twin: bool) -> str:
    out: list[str] = []
    star_done = False
    params = list(inspect.signature(function, eval_str=False).parameters.values())
    for i, p in enumerate(params):
        ann = "" if p.annotation is inspect.Parameter.empty else \
            ": " + _noted(_sync_type(str(p.annotation), where) if twin else str(p.annotation))
        if p.kind is p.VAR_POSITIONAL:
            out.append(f"*{p.name}{ann}")
            star_done = True
            continue
        if p.kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}{ann}")
            continue
        if p.kind is p.KEYWORD_ONLY and not star_done:
            out.append("*")
            star_done = True
        default = "" if p.default is inspect.Parameter.empty else \
            (" = " if ann else "=") + _default(p.default)
        out.append(f"{p.name}{ann}{default}")
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params)
                                            or params[i + 1].kind is not p.POSITIONAL_ONLY):
            out.append("/")
    return ", ".join(out)


def _docstring(obj: Any, indent: str) -> list[str]:
    """`obj`'s own docstring (not one it inherits), as the stub's lines."""
    doc = obj.__doc__
    if not doc:
        return []
    lines = inspect.cleandoc(doc).splitlines()
    body = [f'{indent}"""{lines[0]}'] + [f"{indent}{line}".rstrip() for line in lines[1:]]
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return body + [f'{indent}"""']


def _method(name: str, function: Callable[..., Any], returns: str, where: str, *,
            twin: bool, decorator: str | None = None) -> list[str]:
    lines = [f"    @{decorator}"] if decorator else []
    head = f"    def {name}({_parameters(function, where, twin=twin)}) -> {_noted(returns)}:"
    doc = _docstring(function, " " * 8)
    return lines + ([head, *doc, "        ..."] if doc else [head + " ..."])


def _class(cls: type, bases: str) -> list[str]:
    """`cls` as the stub shows it: what `sandboxer._sync` writes by hand, then the twins
    `_make_twin` attached, in its order."""
    lines = [f"class {cls.__name__}({_noted(bases)}):" if bases else f"class {cls.__name__}:"]
    lines += _docstring(cls, "    ")
    declared = vars(cls).get("__annotations__", {})
    if declared:
        lines += [""] + [f"    {name}: {_noted(ann)}" for name, ann in declared.items()]
    written, twins = [], []
    for name, member in vars(cls).items():
        if name in ("__module__", "__qualname__", "__doc__", "__slots__", "__dict__",
                    "__weakref__", "__parameters__", "__orig_bases__", "_view", "_abc_impl",
                    "__abstractmethods__", "__annotations__"):
            continue
        if isinstance(member, types.MemberDescriptorType):  # a slot: declared below
            continue
        where = f"{cls.__name__}.{name}"
        if isinstance(member, property):
            written.append(_method(name, member.fget, str(inspect.signature(
                member.fget, eval_str=False).return_annotation), where, twin=False,
                decorator="property"))
        elif isinstance(member, classmethod):
            function = member.__func__
            written.append(_method(name, function, str(inspect.signature(
                function, eval_str=False).return_annotation), where, twin=False,
                decorator="classmethod"))
        elif inspect.isfunction(member) and hasattr(member, "__wrapped__"):
            twins.append(_method(name, member.__wrapped__, _returns(member.__wrapped__, where),
                                 where, twin=True))
        elif inspect.isfunction(member):
            written.append(_method(name, member, str(inspect.signature(
                member, eval_str=False).return_annotation), where, twin=False))
        else:
            raise SystemExit(f"{where}: {type(member).__name__} is not something the "
                             "stub knows how to write")
    for method in written + twins:
        lines += ["", *method]
    return lines


def stub() -> str:
    """The text of sandboxer/_sync.pyi for the code as it is."""
    sys.path.insert(0, str(ROOT))
    from sandboxer import _sync

    _NOTED.clear()
    body = ['T = TypeVar("T")']
    for cls, bases in ((_sync.SyncIterator, "Iterator[T], Generic[T]"),
                       (_sync.Sandboxer, ""),
                       (_sync.Sandbox, "SandboxRecord"),
                       (_sync.Checkpoint, "CheckpointRecord"),
                       (_sync.Files, ""),
                       (_sync.Processes, ""),
                       (_sync.Process, "ProcessRecord"),
                       (_sync.Terminal, "")):
        body += ["", "", *_class(cls, bases)]
    text = "\n".join(body)
    used = {re.match(r"\w+", name).group() for name in re.findall(r"[A-Za-z_][\w.]*",
                                                                 " ".join(_NOTED))}
    defined = {"T", "SyncIterator", "Sandboxer", "Sandbox", "Checkpoint", "Files", "Processes",
               "Process", "Terminal"}
    wanted = sorted(used - BUILTINS - defined)
    unknown = [name for name in wanted if name not in IMPORTS]
    if unknown:
        raise SystemExit(f"scripts/sync_stub.py: add where {unknown} come from to IMPORTS")
    imports = _sorted_imports([IMPORTS[name] for name in wanted] + [IMPORTS["TypeVar"],
                                                                    IMPORTS["Generic"],
                                                                    IMPORTS["Iterator"]])
    header = ['"""The sync API as a type checker sees it. Generated by scripts/sync_stub.py from',
              "sandboxer._sync and the async classes it twins: do not edit; run",
              '`python scripts/sync_stub.py --write` (tests/api/test_typing.py checks it)."""',
              ""]
    return "\n".join(header + imports + ["", text.strip("\n"), ""])


def _sorted_imports(lines: list[str]) -> list[str]:
    """As ruff's isort orders them: the standard library, then sandboxer; in each, `import`
    lines first, then `from` lines by module, their names merged and sorted."""
    groups: dict[bool, dict[str, set[str]]] = {False: {}, True: {}}
    plain: dict[bool, set[str]] = {False: set(), True: set()}
    for line in set(lines):
        ours = " sandboxer" in line
        if line.startswith("import "):
            plain[ours].add(line)
            continue
        module, names = re.fullmatch(r"from (\S+) import (.+)", line).groups()
        groups[ours].setdefault(module, set()).add(names)
    out: list[str] = []
    for ours in (False, True):
        section = sorted(plain[ours])
        for module in sorted(groups[ours]):
            names = sorted(groups[ours][module], key=_by_type)
            line = f"from {module} import {', '.join(names)}"
            if len(line) > 100:
                line = f"from {module} import (\n" + "".join(
                    f"    {n},\n" for n in names) + ")"
            section.append(line)
        if section:
            out += section + [""]
    return out[:-1]


def _by_type(name: str) -> tuple[int, str]:
    """isort's order-by-type: CONSTANTS, then Classes, then the rest."""
    name = name.split(" ")[0]
    return (0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2, name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite sandboxer/_sync.pyi")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 when sandboxer/_sync.pyi is not what this makes")
    args = parser.parse_args()
    text = stub()
    if args.write:
        STUB.write_text(text)
        return 0
    if not STUB.exists() or STUB.read_text() != text:
        print(f"{STUB.relative_to(ROOT)} is stale: run python scripts/sync_stub.py --write",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
