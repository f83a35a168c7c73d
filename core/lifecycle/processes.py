"""Background processes in a sandbox, written once for every backend that runs commands
(EXEC) and has a POSIX `sh`: a supervisor script started by one exec keeps each process's
output in the sandbox, bounded, so any client can read it again from an offset, and records
how it ended. No backend has code of its own for this (docs/api.md, "Background processes").

Each user's records are in /tmp/.sbx-processes-UID (UID: the uid the process runs as), made
by that user with mode 700; one another user made is refused, so nobody else can read,
replace or fake a process's records. In it, each process has a folder PID (made under a
temporary name, renamed once the pid is known; everything in it works relative to it):
- `stdout.fifo` and `stderr.fifo`, each drained by a relay that keeps it open on one fd and
  writes chunk files named by the offset of their first byte (`stdout.0`, `stdout.65536`,
  ...; the newest one grows while it is written, at most 1 MiB each). Once a chunk ends
  more than KEEP_BYTES (8 MiB) behind the end of its stream, it is deleted: of each stream
  at least the last 8 MiB (all of it when less) is kept, and less than 10 MiB in all;
- `stdin.fifo` (with stdin), held open by a `sleep` writing nothing (`holder`), so that each
  later write (`cat > stdin.fifo` in an exec of its own, bounded in time) does not end it;
  closing stdin kills the holder (only while it is the supervisor's child: the file could
  name another pid). Without stdin the command reads /dev/null;
- `started` and `exit` ("CODE END", written once by the supervisor, which waits for the
  command: times are centiseconds of the sandbox's uptime, so durations are the sandbox's);
- `supervisor`: its pid, so that a supervisor that died (killed from inside) is seen as
  lost rather than waited for forever.
A process's folder is removed by a later start once the process ended over a day ago (a
host that outlives its sandboxes, ssh, keeps no output forever); in a container it goes
with the container.
The command runs as `( cd "$wd" && exec "$@" )`: its pid is the command's own. Everything
the supervisor starts has its fds detached from the starting exec, which returns at once.

The `processes` table keeps who started what (argv masked as an exec's, env names only) and
how it ended; `sandbox.process.exited` is written once, by whoever first observes the end
(get, list, wait, output, or the reaper): level-triggered, as the reaper is.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sandboxer.adapters.base import Capability, ExecResult
from sandboxer.core.observe import telemetry
from sandboxer.core.rules.catalog import EventType
from sandboxer.core.rules.clock import from_iso, to_iso
from sandboxer.core.rules.errors import (
    BadInput,
    Conflict,
    NotFound,
    OperationFailed,
    QuotaExceeded,
    TimedOut,
    Unavailable,
)
from sandboxer.core.rules.states import State
from sandboxer.core.store import tenancy
from sandboxer.core.store.models import Process, Sandbox

if TYPE_CHECKING:
    from sandboxer.core.lifecycle.manager import Manager

PROCESSES = Process.__table__
SANDBOXES = Sandbox.__table__
ROOT = "/tmp/.sbx-processes"
KEEP_BYTES = 8 * 1024 * 1024  # of each stream, at least the last this many bytes are kept
START_TIMEOUT_S = 60.0  # the starting exec returns at once; this only bounds a stuck one
CONTROL_TIMEOUT_S = 60.0  # list, signal, close: one short exec each
WRITE_RATE = 1024 * 1024  # bytes a second a write is given, over CONTROL_TIMEOUT_S
WAIT_SLICE_S = 300.0  # a wait without limit is one exec per slice, so none outlives its caller long
# a sandbox in one of these states has none of its processes left (they lived in it)
ENDED_STATES = frozenset({State.DESTROYED, State.LOST, State.FAILED})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# The supervisor, its relays and readers: one POSIX sh script run with a mode (busybox ash,
# dash and bash all run it); `start` prints the pid, the readers print one state line per
# process ("exit PID CODE END START", "running PID", "lost PID", "gone PID"), and
# `output` frames of "STREAM OFFSET LENGTH\n" and that many bytes before its state line.
_SCRIPT = r'''KEEP=@KEEP@
uid=$(id -u) || exit 120
root=@ROOT@-$uid  # each user's own: made by that user, mode 700, never another's
ours() {  # a folder this user owns, not a link: else nothing in it is to be trusted
  [ -d "$root" ] && [ ! -L "$root" ] && [ -O "$root" ]
}
refuse() {
  echo "$root is not this user's own folder (another user made it): remove it" >&2; exit 121
}
child() {  # $1 is a child of this process's supervisor (not a pid since used again)
  [ -d /proc/1 ] || return 0  # no /proc to ask: as the records say
  s=$(cat supervisor 2>/dev/null) && st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  set -- ${st##*) }; [ "$2" = "$s" ]
}
now() {  # centiseconds of uptime (seconds since the epoch, times 100, without /proc)
  if read -r up _ </proc/uptime 2>/dev/null; then echo "${up%.*}${up#*.}"; else echo "$(date +%s)00"; fi
}
nap() { sleep 0.1 2>/dev/null || sleep 1; }
relay() {  # $1: stdout|stderr; chunks named by the offset of their first byte
  s=$1; exec 3<"$s.fifo"; off=0; kept=
  while dd bs=65536 count=16 <&3 >"$s.$off" 2>/dev/null; do
    n=$(wc -c <"$s.$off"); [ "$n" -gt 0 ] || break
    kept="$kept $off"; off=$((off + n))
    set -- $kept
    while [ $# -gt 1 ] && [ "$2" -le $((off - KEEP)) ]; do rm -f "$s.$1"; shift; done
    kept="$*"
  done
  rm -f "$s.$off"; : >"$s.done"
}
supervise() {
  sh -c 'echo $PPID' >supervisor
  relay stdout & relay stderr &
  now >started
  hold=
  if [ -p stdin.fifo ]; then
    sleep 2147483647 >stdin.fifo & hold=$!; echo "$hold" >holder
    ( cd "$wd" && exec "$@" ) <stdin.fifo >stdout.fifo 2>stderr.fifo &
  else
    ( cd "$wd" && exec "$@" ) </dev/null >stdout.fifo 2>stderr.fifo &
  fi
  pid=$!
  echo "$pid" >ready
  wait "$pid"; code=$?
  [ -n "$hold" ] && kill "$hold" 2>/dev/null; rm -f holder
  if [ -p stdin.fifo ]; then exec 4<>stdin.fifo; rm -f stdin.fifo; exec 4<&-; fi
  echo "$code $(now)" >exit.tmp && mv exit.tmp exit
  wait
}
state() {  # one line about the process in the current folder ($1: its pid)
  if [ ! -f exit ] && [ -d /proc/1 ] && [ -s supervisor ] && [ ! -d "/proc/$(cat supervisor)" ] \
      && [ ! -f exit ]; then echo "lost $1"  # its supervisor ended without writing an exit
  elif [ -f exit ]; then read -r code end <exit; echo "exit $1 $code $end $(cat started)"
  else echo "running $1"; fi
}
emit() {  # $1: stream, $2: the name of its position variable; sent=1 when a frame went out
  eval "p=\$$2"; best=; next=
  for f in "$1".[0-9]*; do
    [ -f "$f" ] || continue
    n=${f#"$1".}
    if [ "$n" -le "$p" ]; then { [ -z "$best" ] || [ "$n" -gt "$best" ]; } && best=$n
    else { [ -z "$next" ] || [ "$n" -lt "$next" ]; } && next=$n; fi
  done
  if [ -n "$best" ] && exec 5<"$1.$best" 6<"$1.$best"; then
    size=$(wc -c <&6)
    if [ "$p" -lt $((best + size)) ]; then
      echo "$1 $p $((best + size - p))"
      tail -c +$((p - best + 1)) <&5 | head -c $((best + size - p))
      eval "$2=$((best + size))"; sent=1; exec 5<&- 6<&-; return
    fi
    exec 5<&- 6<&-
  fi
  [ -n "$next" ] && { eval "$2=$next"; sent=1; }  # older output is gone: on from the oldest kept
}
mode=$1; shift
if [ "$mode" != start ] && { [ -e "$root" ] || [ -L "$root" ]; }; then ours || refuse; fi
case $mode in
start)
  wd=${1:-$PWD}; shift
  [ -d "$wd" ] || { echo "no folder $wd" >&2; exit 3; }
  want_stdin=$1; shift
  mkdir -m 700 "$root" 2>/dev/null; ours || refuse
  # on a host that outlives its sandboxes (ssh): what ended over a day ago goes (each name
  # an argument of its own: a name with a newline is one name)
  find "$root" -mindepth 2 -maxdepth 2 -name exit -type f -mtime +0 \
    -exec sh -c 'for f; do rm -rf -- "${f%/exit}"; done' sh {} + 2>/dev/null
  dir=$(mktemp -d "$root/.new.XXXXXX") && chmod 755 "$dir" && cd "$dir" &&
    mkfifo stdout.fifo stderr.fifo ready || exit 120
  [ "$want_stdin" = 1 ] && { mkfifo stdin.fifo || exit 120; }
  ( supervise "$@" ) </dev/null >/dev/null 2>&1 &
  read -r pid <ready || exit 120
  rm -rf "${root:?}/$pid"; mv "$dir" "$root/$pid" || exit 120
  echo "$pid";;
list)
  for pid in "$@"; do
    if cd "$root/$pid" 2>/dev/null; then state "$pid"; else echo "gone $pid"; fi
  done;;
wait)  # $1 pid, $2: the longest wait in centiseconds (-1: no limit)
  cd "$root/$1" 2>/dev/null || { echo "gone $1"; exit 0; }
  until=$(( $2 < 0 ? -1 : $(now) + $2 ))
  while [ ! -f exit ]; do
    case $(state "$1") in lost*) break;; esac
    [ "$until" -ge 0 ] && [ "$(now)" -ge "$until" ] && break
    nap
  done
  state "$1";;
signal)
  cd "$root/$1" 2>/dev/null || { echo "gone $1"; exit 0; }
  [ -f exit ] || { child "$1" && kill "-$2" "$1" 2>/dev/null; }; state "$1";;
stdin)
  cd "$root/$1" 2>/dev/null || exit 3
  [ -f exit ] && exit 4; [ -p stdin.fifo ] && [ -f holder ] || exit 5
  exec cat >stdin.fifo;;
close)
  cd "$root/$1" 2>/dev/null || exit 3
  if [ -f holder ]; then h=$(cat holder); case $h in *[!0-9]*|'') ;; *)
    child "$h" && kill "$h" 2>/dev/null;; esac; fi; rm -f holder
  if [ -p stdin.fifo ]; then exec 4<>stdin.fifo; exec 4<&-; fi;;
output)  # $1 pid, $2 $3: the stdout and stderr offsets, $4: 1 to follow
  cd "$root/$1" 2>/dev/null || { echo "gone $1"; exit 0; }
  echo "reader $$"  # a caller that stops reading ends it by this pid
  out=$2 err=$3 quiet=0
  while :; do
    sent=0; emit stdout out; emit stderr err
    [ "$sent" = 1 ] && { quiet=0; continue; }
    if [ -f exit ] && { [ -f stdout.done ] && [ -f stderr.done ] || [ "$quiet" -ge 20 ]; }; then
      state "$1"; exit 0
    fi
    [ "$4" = 1 ] || exit 0
    case $(state "$1") in lost*) state "$1"; exit 0;; esac
    quiet=$((quiet + 1)); nap
    # now and then a line the reader skips: a follower whose reader has gone ends here
    [ $((quiet % 50)) = 0 ] && echo tick
  done;;
esac
'''
SCRIPT = _SCRIPT.replace("@KEEP@", str(KEEP_BYTES)).replace("@ROOT@", ROOT)


def _script(mode: str, *args: Any) -> list[str]:
    """The argv of one exec of the supervisor script (`mode`: start, list, wait, signal,
    stdin, close, output)."""
    return ["sh", "-c", SCRIPT, "sbx-process", mode, *(str(a) for a in args)]


# -- checking what was asked ----------------------------------------------------------------


def check_argv(argv: Any) -> list[str]:
    if isinstance(argv, str | bytes) or not isinstance(argv, Sequence) or not argv \
            or not all(isinstance(a, str) for a in argv):
        raise BadInput("argv must be a non-empty list of strings, e.g. ['sh', '-c', 'echo hi']")
    if any("\0" in a for a in argv):
        raise BadInput("argv must not contain NUL characters")
    return list(argv)


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise BadInput("env must be a mapping of names to values")
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise BadInput(f"bad environment variable name {name!r}: use letters, digits "
                           "and _, not starting with a digit")
        if not isinstance(value, str) or "\0" in value:
            raise BadInput(f"the value of {name} must be a string without NUL characters")
    return dict(env)


def check_cwd(cwd: str | None) -> str | None:
    if cwd is None:
        return None
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
        raise BadInput(f"bad cwd {cwd!r}: give an absolute path in the sandbox")
    return cwd


def check_pid(pid: Any) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise BadInput(f"bad process id {pid!r}: a positive whole number")
    return pid


def check_offset(offset: Any, what: str) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise BadInput(f"bad {what} {offset!r}: a byte offset, 0 or more")
    return offset


def check_signal(sig: Any) -> int:
    number = int(sig) if hasattr(sig, "value") and isinstance(sig.value, int) else sig
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 64:
        raise BadInput(f"bad signal {sig!r}: a signal number from 1 to 64")
    return number


# -- records --------------------------------------------------------------------------------


def view(proc: Mapping[str, Any]) -> dict[str, Any]:
    """A process as every front end shows it (docs/api.md, "Background processes")."""
    return {"pid": proc["pid"], "sandbox_id": proc["sandbox_id"],
            "argv": json.loads(proc["argv_json"]), "cwd": proc["cwd"], "user": proc["user"],
            "env_names": json.loads(proc["env_names_json"]), "stdin": bool(proc["stdin"]),
            "started_at": proc["started_at"], "running": proc["ended_at"] is None,
            "exit_code": proc["exit_code"], "ended_at": proc["ended_at"]}


def _sandbox(mgr: Manager, ref: str) -> dict[str, Any]:
    row = mgr.resolve(ref)
    tenancy.check(row, "sandbox", ref)
    return row


def _rows(mgr: Manager, sandbox_id: str, pid: int | None = None, *,
          open_only: bool = False) -> list[dict[str, Any]]:
    query = sa.select(PROCESSES).where(PROCESSES.c.sandbox_id == sandbox_id)
    if pid is not None:
        query = query.where(PROCESSES.c.pid == pid)
    if open_only:
        query = query.where(PROCESSES.c.ended_at.is_(None))
    with mgr.db.read() as conn:
        return [dict(r) for r in conn.execute(query.order_by(PROCESSES.c.id)).mappings()]


def _one(mgr: Manager, sandbox: Mapping[str, Any], pid: int) -> dict[str, Any]:
    rows = _rows(mgr, sandbox["id"], check_pid(pid))
    if not rows:
        raise NotFound(f"no process {pid} in sandbox {sandbox['id']}")
    return rows[-1]  # a pid used again: the newest


def _record_end(mgr: Manager, proc: Mapping[str, Any], code: int | None,
                duration_s: float | None, how: str | None = None) -> dict[str, Any]:
    """The end of `proc`, recorded once (its event with it); the row as it is now."""
    if duration_s is None:
        ended = mgr.clock.now()
        duration_s = max(0.0, (ended - from_iso(proc["started_at"])).total_seconds())
    else:
        ended = from_iso(proc["started_at"]) + timedelta(seconds=duration_s)
    with mgr.db.write() as conn:
        done = conn.execute(PROCESSES.update().where(
            PROCESSES.c.id == proc["id"], PROCESSES.c.ended_at.is_(None)).values(
                ended_at=to_iso(ended), exit_code=code)).rowcount
        if done:
            mgr.event(conn, proc["sandbox_id"], EventType.SANDBOX_PROCESS_EXITED, payload={
                "pid": proc["pid"], "exit_code": code, "duration_s": round(duration_s, 3),
                **({"how": how} if how else {})})
        row = conn.execute(sa.select(PROCESSES).where(PROCESSES.c.id == proc["id"])
                           ).mappings().first()
    return dict(row)


def _apply(mgr: Manager, proc: dict[str, Any], line: str) -> dict[str, Any]:
    """What the script said of `proc` (its `state` line), recorded."""
    parts = line.split()
    if not parts or proc["ended_at"] is not None:
        return proc
    if parts[0] == "exit" and len(parts) == 5:
        code, end, start = int(parts[2]), int(parts[3]), int(parts[4])
        return _record_end(mgr, proc, code, max(0, end - start) / 100)
    if parts[0] == "lost":  # its supervisor was killed: how it ended is not known
        return _record_end(mgr, proc, None, None, "lost")
    if parts[0] == "gone":  # its folder is gone from the sandbox
        return _record_end(mgr, proc, None, None, "gone")
    return proc


def _states(text: bytes) -> dict[int, str]:
    found = {}
    for line in text.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            found[int(parts[1])] = line
    return found


async def _exec(mgr: Manager, sandbox: Mapping[str, Any], argv: list[str], *,
                timeout_s: float | None = CONTROL_TIMEOUT_S, user: str | None = None,
                env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                ) -> ExecResult:
    """One exec of the script, as the process's user; never an event of its own (reading a
    process's state is no command of anyone's)."""
    adapter = await mgr.adapter_for(sandbox)
    extra: dict[str, Any] = {}
    if user is not None:
        extra["user"] = user
    if stdin is not None:
        extra["stdin"] = stdin
    result = await adapter.exec(sandbox["backend_ref"], argv, timeout_s, env=env or None,
                                **extra)
    _refused(sandbox, result)
    return result


def _refused(sandbox: Mapping[str, Any], result: ExecResult) -> None:
    """The script found its user's records folder made by someone else (exit 121): nothing
    in it is trusted, so nothing is read or started (docs/security.md, "Background
    processes")."""
    if result.exit_code == 121:
        why = " ".join(result.stderr.decode(errors="replace").split())
        raise OperationFailed(f"the background processes of sandbox {sandbox['id']} cannot "
                              f"be used: {why}")


async def _observe(mgr: Manager, sandbox: Mapping[str, Any],
                   procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`procs` as they are now: those not known to have ended are asked about (one exec),
    and an end found is recorded. A sandbox that is gone took its processes with it."""
    waiting = [p for p in procs if p["ended_at"] is None]
    if not waiting:
        return procs
    if sandbox["state"] in ENDED_STATES:
        ended = {p["id"]: _record_end(mgr, p, None, None, "sandbox-ended") for p in waiting}
    elif sandbox["state"] != State.RUNNING:
        return procs  # paused: they are frozen with it
    else:
        said: dict[int, str] = {}
        for user in {p["user"] for p in waiting}:  # each user's as that user: its folders
            result = await _exec(mgr, sandbox, _script("list", *sorted(
                {p["pid"] for p in waiting if p["user"] == user})), user=user)
            if result.exit_code != 0:
                why = " ".join(result.stderr.decode(errors="replace").split())
                raise OperationFailed(f"cannot read the processes of sandbox "
                                      f"{sandbox['id']}: {why or result.exit_code}")
            said.update(_states(result.stdout))
        # a pid used again: only its newest row is the one running now
        newest = {p["pid"]: p["id"] for p in waiting}
        ended = {p["id"]: _apply(mgr, p, said.get(p["pid"], "") if newest[p["pid"]] == p["id"]
                                 else f"gone {p['pid']}") for p in waiting}
    return [ended.get(p["id"], p) for p in procs]


# -- the operations (core/api.py calls these) -----------------------------------------------


async def start(mgr: Manager, ref: str, argv: Sequence[str], *,
                env: Mapping[str, str] | None = None, cwd: str | None = None,
                user: str | None = None, stdin: bool = False) -> dict[str, Any]:
    """Start `argv` in the background; starting it is activity. Recorded with its event
    (argv masked as an exec's, env names only) once it has started: a refusal (bad input,
    a missing cwd, a backend without PROCESSES) writes nothing."""
    argv, env, cwd = check_argv(argv), check_env(env), check_cwd(cwd)
    if user is not None and (not isinstance(user, str) or not user.strip()):
        raise BadInput(f"bad user {user!r}: a name or uid in the sandbox")
    sandbox = _sandbox(mgr, ref)
    mgr._usable(sandbox, Capability.PROCESSES, "run background processes")  # else exit 4
    recorded = mgr._masked_argv(sandbox, argv)  # a bad mask pattern refuses before the start
    async with _command_slot(mgr, sandbox):
        result = await _exec(mgr, sandbox, _script("start", cwd or "", int(bool(stdin)),
                                                   *argv),
                             timeout_s=START_TIMEOUT_S, user=user,
                             env={**env, **telemetry.trace_env()})
    lines = result.stdout.decode(errors="replace").split()
    said = lines[-1] if lines else ""  # after anything a login shell may print
    if result.exit_code == 3:
        raise NotFound(f"no folder {cwd} in sandbox {sandbox['id']}")
    if result.exit_code != 0 or not said.isdigit():
        why = " ".join(result.stderr.decode(errors="replace").split()) or \
            f"exit status {result.exit_code}"
        if result.exit_code in (126, 127):
            why += " (background processes need a POSIX sh in the sandbox)"
        raise OperationFailed(f"the process could not be started in sandbox "
                              f"{sandbox['id']}: {why}")
    pid, now = int(said), mgr.now_iso()
    with mgr.db.write() as conn:  # started: that is activity (the idle clock starts again)
        conn.execute(SANDBOXES.update().where(SANDBOXES.c.id == sandbox["id"])
                     .values(last_activity_at=now))
        for old in conn.execute(sa.select(PROCESSES).where(  # its pid was used before
                PROCESSES.c.sandbox_id == sandbox["id"], PROCESSES.c.pid == pid,
                PROCESSES.c.ended_at.is_(None))).mappings().all():
            conn.execute(PROCESSES.update().where(PROCESSES.c.id == old["id"])
                         .values(ended_at=now))
            mgr.event(conn, sandbox["id"], EventType.SANDBOX_PROCESS_EXITED, payload={
                "pid": pid, "exit_code": None, "duration_s": None, "how": "gone"})
        new_id = conn.execute(PROCESSES.insert().values(
            sandbox_id=sandbox["id"], owner=sandbox["owner"], pid=pid,
            argv_json=json.dumps(recorded), env_names_json=json.dumps(sorted(env)),
            cwd=cwd, user=user, stdin=bool(stdin), started_at=now, started_by=mgr.actor,
        )).inserted_primary_key[0]
        mgr.event(conn, sandbox["id"], EventType.SANDBOX_PROCESS_STARTED, payload={
            "pid": pid, "argv": recorded, "env": sorted(env), "cwd": cwd, "user": user,
            "stdin": bool(stdin)})
        row = conn.execute(sa.select(PROCESSES).where(PROCESSES.c.id == new_id)
                           ).mappings().first()
    return view(row)


def _running(mgr: Manager, owner: str) -> list[dict[str, Any]]:
    """The owner's processes not known to have ended, in sandboxes not known to have ended."""
    query = sa.select(PROCESSES).join(SANDBOXES, SANDBOXES.c.id == PROCESSES.c.sandbox_id) \
        .where(PROCESSES.c.owner == owner, PROCESSES.c.ended_at.is_(None),
               SANDBOXES.c.state.notin_([str(s) for s in ENDED_STATES]))
    with mgr.db.read() as conn:
        return [dict(r) for r in conn.execute(query).mappings()]


@contextlib.asynccontextmanager
async def _command_slot(mgr: Manager, sandbox: Mapping[str, Any]) -> AsyncIterator[None]:
    """A background process is one of its tenant's commands until its end is recorded, as
    an exec is while it runs: starting one is refused (QuotaExceeded, nothing done) when the
    tenant's execs running in this service process and its processes not known to have
    ended reach its quota max_execs (docs/security.md, "Tenants"). The start itself holds an
    exec's slot, so that starts at once are counted."""
    owner = sandbox["owner"]
    with mgr.db.read() as conn:
        limits = tenancy.quotas(conn, owner)
    most = None if limits is None else limits["max_execs"]
    if most is not None:
        procs = _running(mgr, owner)
        if procs and mgr._execs_running[owner] + len(procs) >= most:
            # those that ended since anyone looked do not count: look (one exec a sandbox)
            for sandbox_id in sorted({p["sandbox_id"] for p in procs}):
                row = mgr.rows_by_ids([sandbox_id]).get(sandbox_id)
                if row is not None:  # one that cannot be asked: its processes count
                    with contextlib.suppress(OperationFailed, Unavailable):
                        await _observe(mgr, row, [p for p in procs
                                                  if p["sandbox_id"] == sandbox_id])
            procs = _running(mgr, owner)
        if mgr._execs_running[owner] + len(procs) >= most:
            raise QuotaExceeded(
                f"tenant {owner!r} runs {mgr._execs_running[owner]} commands and "
                f"{len(procs)} background processes: its quota max_execs is {most}")
    mgr._execs_running[owner] += 1
    try:
        yield
    finally:
        mgr._execs_running[owner] -= 1


async def list_processes(mgr: Manager, ref: str) -> list[dict[str, Any]]:
    """Every process started in the sandbox, oldest first, as they are now."""
    sandbox = _sandbox(mgr, ref)
    return [view(p) for p in await _observe(mgr, sandbox, _rows(mgr, sandbox["id"]))]


async def get(mgr: Manager, ref: str, pid: int) -> dict[str, Any]:
    sandbox = _sandbox(mgr, ref)
    return view((await _observe(mgr, sandbox, [_one(mgr, sandbox, pid)]))[0])


async def wait(mgr: Manager, ref: str, pid: int, timeout: timedelta | None) -> dict[str, Any]:
    """The process once it has ended, or as it is when `timeout` has passed: one exec that
    waits in the sandbox (per WAIT_SLICE_S without a limit)."""
    sandbox = _sandbox(mgr, ref)
    proc = _one(mgr, sandbox, pid)
    left = None if timeout is None else timeout.total_seconds()
    while proc["ended_at"] is None:
        if sandbox["state"] in ENDED_STATES:
            proc = (await _observe(mgr, sandbox, [proc]))[0]
            break
        if sandbox["state"] != State.RUNNING:
            raise Conflict(f"sandbox {sandbox['id']} is {sandbox['state']}: its processes "
                           "are frozen with it (resume it to wait)")
        slice_s = WAIT_SLICE_S if left is None else min(left, WAIT_SLICE_S)
        result = await _exec(mgr, sandbox, _script("wait", pid, int(slice_s * 100)),
                             timeout_s=slice_s + CONTROL_TIMEOUT_S, user=proc["user"])
        proc = _apply(mgr, proc, _states(result.stdout).get(pid, ""))
        if left is not None:
            left -= slice_s
            if left <= 0:
                break
        sandbox = _sandbox(mgr, sandbox["id"])
    return view(proc)


async def signal(mgr: Manager, ref: str, pid: int, sig: int) -> dict[str, Any]:
    """Send `sig` to the process (the command's own pid): its view after sending."""
    number = check_signal(sig)
    sandbox = _sandbox(mgr, ref)
    proc = (await _observe(mgr, sandbox, [_one(mgr, sandbox, pid)]))[0]
    if proc["ended_at"] is not None:
        raise Conflict(f"process {pid} in sandbox {sandbox['id']} has ended: nothing to signal")
    if sandbox["state"] != State.RUNNING:
        raise Conflict(f"sandbox {sandbox['id']} is {sandbox['state']}: cannot signal")
    result = await _exec(mgr, sandbox, _script("signal", pid, number), user=proc["user"])
    return view(_apply(mgr, proc, _states(result.stdout).get(pid, "")))


async def write_stdin(mgr: Manager, ref: str, pid: int, data: bytes) -> None:
    """Write `data` to the process's stdin (one exec); writing is activity."""
    if not isinstance(data, bytes | bytearray):
        raise BadInput("stdin data must be bytes")
    sandbox = _sandbox(mgr, ref)
    proc = _one(mgr, sandbox, pid)
    _refuse_stdin(sandbox, proc)
    # a process that does not read leaves the pipe full: bounded, never a request held forever
    limit_s = CONTROL_TIMEOUT_S + len(data) / WRITE_RATE
    result = await _exec(mgr, sandbox, _script("stdin", pid), user=proc["user"],
                         stdin=bytes(data), timeout_s=limit_s)
    if result.timed_out:
        raise TimedOut(f"writing to process {pid} in sandbox {sandbox['id']} timed out after "
                       f"{limit_s:.0f}s: it does not read its input (part of the data may "
                       "have reached it)")
    if result.exit_code == 4:  # the next observer records how it ended
        raise Conflict(f"process {pid} in sandbox {sandbox['id']} has ended: its stdin is gone")
    if result.exit_code == 5:
        raise Conflict(f"the stdin of process {pid} in sandbox {sandbox['id']} is closed")
    if result.exit_code == 3:
        raise NotFound(f"process {pid} is gone from sandbox {sandbox['id']}")
    if result.exit_code != 0:
        raise OperationFailed(f"writing to process {pid} failed: "
                              f"{' '.join(result.stderr.decode(errors='replace').split())}")
    mgr._mark_active(sandbox["id"])


async def close_stdin(mgr: Manager, ref: str, pid: int) -> None:
    """Close the process's stdin: it reads end-of-file once what was written is read.
    Closing it again is done."""
    sandbox = _sandbox(mgr, ref)
    proc = _one(mgr, sandbox, pid)
    if proc["ended_at"] is not None:
        return
    _refuse_stdin(sandbox, proc)
    result = await _exec(mgr, sandbox, _script("close", pid), user=proc["user"])
    if result.exit_code == 3:
        raise NotFound(f"process {pid} is gone from sandbox {sandbox['id']}")


def _refuse_stdin(sandbox: Mapping[str, Any], proc: Mapping[str, Any]) -> None:
    if not proc["stdin"]:
        raise Conflict(f"process {proc['pid']} was started without stdin (stdin=False)")
    if proc["ended_at"] is not None:
        raise Conflict(f"process {proc['pid']} in sandbox {sandbox['id']} has ended: "
                       "its stdin is gone")
    if sandbox["state"] != State.RUNNING:
        raise Conflict(f"sandbox {sandbox['id']} is {sandbox['state']}: cannot write to "
                       "its processes")


async def output(mgr: Manager, ref: str, pid: int, *, stdout_offset: int = 0,
                 stderr_offset: int = 0, follow: bool = False,
                 ) -> AsyncIterator[dict[str, Any]]:
    """The process's output from these offsets: `{"stream", "offset", "data"}` items (the
    offset of the item's first byte in its stream; one past what was asked when that part
    is no longer kept), then, once it has ended and all was sent, `{"exit": view}`. Without
    `follow`, it ends when caught up. One exec streams it all."""
    out_at = check_offset(stdout_offset, "stdout offset")
    err_at = check_offset(stderr_offset, "stderr offset")
    sandbox = _sandbox(mgr, ref)
    proc = _one(mgr, sandbox, pid)
    if sandbox["state"] != State.RUNNING:
        await _observe(mgr, sandbox, [proc])
        raise Conflict(f"sandbox {sandbox['id']} is {sandbox['state']}: the output of its "
                       "processes is not readable")
    adapter = await mgr.adapter_for(sandbox)
    extra = {"user": proc["user"]} if proc["user"] is not None else {}
    stream = adapter.exec_stream(sandbox["backend_ref"],
                                 _script("output", pid, out_at, err_at, int(bool(follow))),
                                 None, env=None, **extra)
    buf = bytearray()
    frame: tuple[str, int, int] | None = None  # the stream, offset and bytes still to come
    final: str | None = None
    reader: int | None = None  # the script's pid in the sandbox
    caught_up = False
    try:
        async for item in stream:
            if isinstance(item, ExecResult):
                caught_up = True
                _refused(sandbox, item)
                break
            kind, data = item
            if kind != "stdout":
                continue
            buf += data
            while buf:
                if frame is None:
                    end = buf.find(b"\n")
                    if end < 0:
                        break
                    line = buf[:end].decode(errors="replace")
                    del buf[:end + 1]
                    parts = line.split()
                    if len(parts) == 3 and parts[0] in ("stdout", "stderr"):
                        frame = (parts[0], int(parts[1]), int(parts[2]))
                        if frame[2] == 0:
                            frame = None
                    elif len(parts) == 2 and parts[0] == "reader" and parts[1].isdigit():
                        reader = int(parts[1])
                    elif parts and parts[0] in ("exit", "lost", "gone", "running"):
                        final = line  # its state line, last (a "tick" keeps it honest)
                    continue
                name, at, size = frame
                take = min(size, len(buf))
                yield {"stream": name, "offset": at, "data": bytes(buf[:take])}
                del buf[:take]
                frame = (name, at + take, size - take) if size > take else None
    finally:
        await stream.aclose()
        if not caught_up and reader is not None:  # the caller stopped: so does the reader
            # (a backend may drain an abandoned exec's output, so it would never notice)
            with contextlib.suppress(Exception):
                await _exec(mgr, sandbox, ["kill", str(reader)], user=proc["user"])
    if final is not None:
        proc = _apply(mgr, proc, final)
        if proc["ended_at"] is not None:
            yield {"exit": view(proc)}


async def keeps_busy(mgr: Manager, sandbox_id: str) -> bool:
    """For the reaper, before it ends a sandbox for being idle: True when a process recorded
    in it, not known to have ended, still runs there (its activity is then recorded, so the
    idle clock starts again). Ends it finds are recorded. A sandbox that cannot be asked,
    or is not running (paused: nothing runs in it), counts as idle (docs/reliability.md,
    "Idle limit and background processes")."""
    procs = _rows(mgr, sandbox_id, open_only=True)
    if not procs:
        return False
    sandbox = mgr.rows_by_ids([sandbox_id]).get(sandbox_id)
    if sandbox is None or sandbox["state"] != State.RUNNING:
        return False  # paused: nothing runs in it, so nothing keeps it busy
    try:
        procs = await _observe(mgr, sandbox, procs)
    except Exception:
        return False
    if any(p["ended_at"] is None for p in procs):
        try:
            mgr._mark_active(sandbox_id)
        except Conflict:
            return False
        return True
    return False
