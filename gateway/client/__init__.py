"""The trainer-side client: what runs inside a training job, not on the node.

Owns: epoch hints and the samplers that send them (``hints.py``:
``Hints``, ``HintedSampler``, ``shard_epoch``), the documented epoch orders
and shard patterns they reproduce (``order.py``), batch reads, virtual
shards and the tar reading behind them (``batch.py``: ``get_batch``,
``BatchDataset``, ``virtual_shards``), the admin API's HTTP client
(``admin.py``), and how anyone finds a gateway (``target.py``) from the
places its settings are written down (``sources.py``: the ``TIERSTORE_*``
names, the ``--config`` file, the generated credentials, the defaults).

May import: the standard library, httpx and botocore; nothing else of
gateway/ and nothing of tiering/ or packer/. ``pip install tierstore``
installs this room's dependencies alone (docs/clients.md); the server's
sit behind the ``server`` extra. The gateway's rooms import this one, for
the conventions both sides share.

The helpers a training loop uses are importable from here::

    from gateway.client import HintedSampler, shard_epoch, get_batch
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module of this room that defines it; loaded on first use, so a job that
# only sends hints never imports botocore, and one that only reads batches never httpx.
_EXPORTS = {
    "Hints": "hints", "HintedSampler": "hints", "shard_epoch": "hints",
    "get_batch": "batch", "BatchDataset": "batch", "virtual_shards": "batch",
    "BatchError": "batch", "shuffled": "order", "expand": "order",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
