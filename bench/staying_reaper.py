"""A reaper that stays, for bench_scale.py part 5: one process and one AsyncSandboxer, as
`sbx reap --every` and the service's timer run the reaper (`run_reaper` calls `reap()` each
cycle). It reaps once at start, says `ready`, then reaps once for each line read on stdin and
writes that cycle's seconds and report as one JSON line. SBX_HOME and the rest come from the
environment the bench gives it; each cycle gives up after TIMEOUT_S seconds (the first
argument), as `sbx reap --timeout` does, so a hung engine ends the process.

Its first cycle, on a home with no database yet, opens the store (the ORM) and the backends'
adapters, which the client keeps (`reap()` hands them to it): as `sbx reap --every` and the
service's timer have them open after their first cycle. The cycle timed is one of a reaper in
that state, whose Docker adapter has asked the engine's identity already.

    python bench/staying_reaper.py TIMEOUT_S    (driven by bench_scale.py; not a benchmark
                                                 on its own)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import sandboxer


async def main(timeout_s: float) -> None:
    async with sandboxer.AsyncSandboxer() as sbx:
        await sbx.reap(timeout=timeout_s)  # the cycle before: what a reaper on a timer has done
        print("ready", flush=True)
        while await asyncio.to_thread(sys.stdin.readline):
            started = time.perf_counter()
            report = await sbx.reap(timeout=timeout_s)
            print(json.dumps({"seconds": time.perf_counter() - started,
                              "report": report.to_dict()}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
