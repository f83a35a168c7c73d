"""How many threads the backends' blocking calls get: the SDKs (docker-py, paramiko, ...) block
a worker thread per call, and they run on the event loop's default thread pool.

One rule for every loop the core runs on: the pool made here holds at least what each user of
the loop asks for, and is never replaced by a smaller one. A library client's loop asks for
BLOCKING_THREADS; a reap cycle asks for as many as it runs actions at once, which on a
client's loop changes nothing, so a service whose timer reaps keeps its 64. A pool set by
someone else (the loop's own, a caller's) is replaced by the first ask and left to them,
not shut down. Asked on the loop's thread, or before the loop runs: a pool shut down here
must not be one another thread is about to hand a call to."""

from __future__ import annotations

import asyncio
import weakref
from concurrent.futures import ThreadPoolExecutor

BLOCKING_THREADS = 64  # a library client's loop: enough for many operations at once

# the pool this module made for each loop, with its size
_made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[ThreadPoolExecutor, int]] = (
    weakref.WeakKeyDictionary())


def ensure_thread_pool(loop: asyncio.AbstractEventLoop, workers: int) -> None:
    """Give `loop` a default thread pool of at least `workers` threads. A smaller pool made
    here before is replaced and shut down (calls already in it finish; its threads end); a
    pool of the same size or larger is kept. asyncio.run shuts the last one down."""
    made = _made.get(loop)
    if made is not None and made[1] >= workers:
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="sbx-io")
    loop.set_default_executor(pool)
    _made[loop] = (pool, workers)
    if made is not None:
        made[0].shutdown(wait=False)
