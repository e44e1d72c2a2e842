"""Epoch hints from a training loop, in two lines; no torch needed.

Tell the gateway the order the next epoch will read a bucket in, and it has
each object hot before the loop asks for it (docs/prefetch.md)::

    from gateway.client.hints import Hints, HintedSampler
    sampler = HintedSampler(RandomSampler(dataset), keys, bucket="train")  # any sampler of indices
    loader = DataLoader(dataset, sampler=sampler, num_workers=8)

For WebDataset, ``shard_epoch`` returns this epoch's shard order (the
gateway's documented shuffle, reproduced here) after registering it::

    keys = shard_epoch("train", "shards/train-{0000..0999}.tar", seed=epoch)
    dataset = wds.WebDataset([url(k) for k in keys], shardshuffle=False)

Any other loop calls ``Hints().epoch(bucket, keys_in_read_order)``.

Keys are keys: ``Hints.epoch`` and ``HintedSampler`` send each one as it
is, braces, commas, ``..`` and ``s3://`` included (DLIO names its objects
``s3://resnet50/train/img_0000.npz``, and that is the key). Pass
``patterns=True`` to have the gateway expand shard patterns, ``urls=True``
to have it strip ``s3://<bucket>/``. ``shard_epoch``, whose argument is a
shard pattern, expands patterns itself (``patterns=True`` by default) and
registers the keys it got.

The admin API address and token come from the arguments, else from
``TIERSTORE_ADMIN_URL`` / ``TIERSTORE_ADMIN_TOKEN``, else from the
gateway's config file or data directory as for the CLI. A gateway that
cannot be reached costs the hint, never the training step: the failure is
logged once and the loop reads on without hints.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gateway.client.admin import AdminClient, ApiError, Unreachable
from gateway.client.order import expand_all, shuffled
from gateway.client.target import resolve_target

log = logging.getLogger("tierstore.hints")


class Hints:
    """A connection to one gateway's admin API for epoch hints and warm jobs."""

    def __init__(
        self,
        admin_url: str | None = None,
        token: str | None = None,
        *,
        config_file: Path | None = None,
        data_dir: Path | None = None,
        strict: bool = False,
    ) -> None:
        target = resolve_target(admin_url=admin_url, token=token, config_file=config_file, data_dir=data_dir)
        self._api = AdminClient(target.url, target.token, ca=target.ca)
        self.strict = strict  # raise instead of logging when the gateway refuses or is away
        self._warned = False

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> Hints:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def epoch(
        self, bucket: str, keys: Sequence[str], readers: int = 1, *, patterns: bool = False, urls: bool = False,
        **options: Any,
    ) -> str | None:
        """Register ``keys`` as the order the next epoch reads ``bucket`` in,
        shared by ``readers`` interleaved readers. Each key is taken as it
        is, unless ``patterns`` (the gateway expands brace patterns such as
        ``train-{0000..0099}.tar``) or ``urls`` (it strips
        ``s3://<bucket>/``). Options: lookahead_bytes, lookahead_objects,
        idle_timeout. Returns the epoch id (None if the gateway could not
        take the hint and ``strict`` is off)."""
        body: dict[str, Any] = {"bucket": bucket, "keys": list(keys), "readers": readers, **options}
        if patterns:
            body["patterns"] = True
        if urls:
            body["urls"] = True
        return self._call(lambda: self._api.register_epoch(body)["id"])

    def shuffled_epoch(self, bucket: str, prefix: str, seed: int, readers: int = 1, **options: Any) -> str | None:
        """Register every key under ``prefix`` in the order of ``seed``
        (``gateway.client.order.shuffled`` of the keys: reproduce it to read in it)."""
        body = {"bucket": bucket, "prefix": prefix, "seed": seed, "readers": readers, **options}
        return self._call(lambda: self._api.register_epoch(body)["id"])

    def status(self, epoch_id: str) -> dict[str, Any]:
        return self._api.epoch(epoch_id)

    def end(self, epoch_id: str) -> None:
        self._call(lambda: self._api.end_epoch(epoch_id))

    def _call(self, request: Any) -> Any:
        try:
            return request()
        except (ApiError, Unreachable) as exc:
            if self.strict:
                raise
            if not self._warned:
                log.warning("tierstore hints unavailable, reading without them: %s", exc)
                self._warned = True
            return None


class HintedSampler:
    """Wraps a sampler of indices (torch's RandomSampler, DistributedSampler,
    or any iterable of ints): at the start of each epoch, it draws the
    epoch's order from the wrapped sampler, registers the matching keys with
    the gateway, then yields the same indices. ``keys[i]`` is the object
    index ``i`` reads."""

    def __init__(
        self,
        sampler: Iterable[int],
        keys: Sequence[str],
        bucket: str,
        hints: Hints | None = None,
        readers: int = 1,
        **options: Any,
    ) -> None:
        self.sampler = sampler
        self.keys = keys
        self.bucket = bucket
        self.hints = hints if hints is not None else Hints()
        self.readers = readers
        self.options = options
        self.epoch_id: str | None = None

    def __iter__(self) -> Iterator[int]:
        order = list(self.sampler)
        if self.epoch_id is not None:
            self.hints.end(self.epoch_id)  # the last epoch, if not read to its end
        self.epoch_id = self.hints.epoch(self.bucket, [self.keys[i] for i in order], self.readers, **self.options)
        return iter(order)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """Passed on to a DistributedSampler-like wrapped sampler."""
        setter = getattr(self.sampler, "set_epoch", None)
        if setter is not None:
            setter(epoch)


def shard_epoch(
    bucket: str, shards: str | Iterable[str], seed: int | None = None, hints: Hints | None = None,
    readers: int = 1, *, patterns: bool = True, urls: bool = False, **options: Any,
) -> list[str]:
    """The shard keys of one epoch (shard patterns such as
    ``train-{0000..0999}.tar`` expanded here unless ``patterns`` is off;
    ``s3://<bucket>/`` stripped if ``urls``; shuffled by ``seed`` if given,
    as the gateway shuffles), registered as its read order, key by key."""
    keys = expand_all([shards] if isinstance(shards, str) else shards, bucket, patterns=patterns, urls=urls)
    if seed is not None:
        keys = shuffled(keys, seed)
    (hints if hints is not None else Hints()).epoch(bucket, keys, readers, **options)
    return keys
