"""The bounded thread pool for blocking work (files, rocksdict, hashing).

One pool per process: its size bounds how many blocking calls run at once,
so a burst of large PUTs cannot start hundreds of threads.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Disk and hashing work: a few threads per core keeps NVMe queues busy while
# hashing (which releases the GIL in hashlib/zlib/awscrt) uses the cores.
_EXECUTOR = ThreadPoolExecutor(max_workers=16, thread_name_prefix="tierstore-io")


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` in the I/O pool and await its result."""
    loop = asyncio.get_running_loop()
    if kwargs:
        return await loop.run_in_executor(_EXECUTOR, functools.partial(fn, *args, **kwargs))
    return await loop.run_in_executor(_EXECUTOR, fn, *args)  # type: ignore[arg-type]
