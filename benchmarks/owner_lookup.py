"""What finding a piece's owner costs, and what keeping the table costs,
from 4 to 1,024 nodes.

- old: rendezvous over the nodes on every lookup (a hash per node, the
  highest wins), as the peer client did before the table;
- new: the slot table of ``tiering/cluster/placement.py``: a hash of the
  piece, then two index reads.

For each cluster size: the median time of one lookup (``--lookups`` keys,
``--runs`` runs), the time to build the table, and the time to change it
for one node joining and one leaving. In-process, no servers; the machine
is shared and noisy: compare the columns of one run.

Run:  .venv/bin/python benchmarks/owner_lookup.py [--sizes 4,16,64,256,1024] [--lookups 20000]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections.abc import Callable

from tiering.cluster.placement import Placement


def old_owner(piece: str, nodes: list[str]) -> str:
    """The lookup before the table: every node hashed with the piece."""
    return max(nodes, key=lambda node: hashlib.blake2b(f"{node}\0{piece}".encode(), digest_size=8).digest())


def per_call(fn: Callable[[str], object], keys: list[str], runs: int) -> float:
    """The median over ``runs`` of the time per call of ``fn`` over ``keys``, in microseconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for key in keys:
            fn(key)
        times.append((time.perf_counter() - start) / len(keys) * 1e6)
    return statistics.median(times)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,64,256,1024", help="cluster sizes, comma-separated")
    parser.add_argument("--lookups", type=int, default=20_000, help="keys looked up per run")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    keys = [f"mount\0train/shard-{i // 1000:05d}/sample-{i:07d}.jpg" for i in range(args.lookups)]
    print("| nodes | old lookup (us) | new lookup (us) | build (ms) | join (ms) | leave (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        nodes = [f"node-{i:04d}" for i in range(size)]
        old_keys = keys[: max(200, args.lookups // size)]  # the old lookup is slow at 1,024 nodes
        old = per_call(lambda key: old_owner(key, nodes), old_keys, args.runs)
        build, table = timed(lambda: Placement(nodes))
        assert isinstance(table, Placement)
        new = per_call(table.owner, keys, args.runs)
        join, _ = timed(lambda: table.changed([*nodes, "joining"]))
        leave, _ = timed(lambda: table.changed(nodes[1:]))
        print(f"| {size:,} | {old:.2f} | {new:.2f} | {build * 1e3:.0f} | {join * 1e3:.1f} | {leave * 1e3:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
