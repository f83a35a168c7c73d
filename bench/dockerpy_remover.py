"""The least a Python reaper can cost, for bench_scale.py part 5: docker-py alone (no sbx, no
database, no look before removing) removes the containers it is given from 16 threads, the
reaper's concurrency, as the Docker adapter calls it (`remove_container(force=True, v=True)`,
the adapter's pinned API version, so no version call).

    python bench/dockerpy_remover.py once ID...   a fresh process: import, connect, remove, exit
                                                    (timed from outside, as `sbx reap` is)
    python bench/dockerpy_remover.py stay          a process that stays: says `ready`, then for
                                                    each line of ids read on stdin removes them
                                                    and writes the seconds it took (timed
                                                    inside, as bench/staying_reaper.py is)

Driven by bench_scale.py; not a benchmark on its own.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import docker

THREADS = 16  # the reaper's concurrency (core/reconcile/reaper.py)


def main(argv: list[str]) -> None:
    api = docker.APIClient(version=docker.constants.MINIMUM_DOCKER_API_VERSION)
    with ThreadPoolExecutor(THREADS) as pool:
        def remove(ids: list[str]) -> None:
            list(pool.map(lambda ref: api.remove_container(ref, force=True, v=True), ids))

        if argv[0] == "once":
            remove(argv[1:])
            return
        api.ping()  # its connection open, as the staying reaper's is after its first cycle
        print("ready", flush=True)
        for line in sys.stdin:
            started = time.perf_counter()
            remove(line.split())
            print(time.perf_counter() - started, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
