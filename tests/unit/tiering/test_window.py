"""How many pieces a read keeps in flight (tiering/reads/window.py): the
configured most until the source is measured, then its bandwidth-delay
product, within the bounds per object and for the node."""

from __future__ import annotations

import asyncio

from tiering.reads.window import Window

MiB = 1024 * 1024


def test_the_configured_most_until_a_piece_came_in() -> None:
    assert Window(8 * MiB, most=8).pieces() == 8


def test_the_bandwidth_delay_product_within_the_bounds() -> None:
    window = Window(8 * MiB, most=16)
    window.latency, window.stream = 0.05, 100e6  # a far source, 100 MB/s a connection (S3)
    window.rate = 1e9  # the node takes 1 GB/s from it
    # 1 GB/s x (50 ms + 8 MiB / 100 MB/s) = 134 MB in flight: 16 pieces, the most
    assert window.pieces() == 16
    window.rate, window.stream, window.latency = 50e6, 50e6, 0.002  # a slow near source
    # 50 MB/s x (2 ms + 168 ms) = 8.5 MB: just over one piece in flight, so 2, and the two more
    assert window.pieces() == 4
    window.rate = 1.0  # nothing flows: still two (the one sent and the next)
    assert window.pieces() == 3
    window.latency = window.stream = None
    assert window.pieces() == 16


def test_the_node_bound_holds_pieces_back() -> None:
    async def main() -> int:
        window = Window(MiB, most=2, node_most=3)
        busy = top = 0
        release = asyncio.Event()

        async def one() -> None:
            nonlocal busy, top
            async with window.slot() as fetch:
                busy += 1
                top = max(top, busy)
                fetch.landed(MiB)
                await release.wait()
                busy -= 1

        tasks = [asyncio.create_task(one()) for _ in range(7)]
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(*tasks)
        assert window.latency is not None and window.rate is not None
        return top

    assert asyncio.run(main()) == 3
