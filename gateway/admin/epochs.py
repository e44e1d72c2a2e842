"""Admin routes for epoch hints: the order a trainer will read a data set
in, so the gateway has each object hot before it is asked for (see
``tiering/prefetch/epochs.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, Field, model_validator

from gateway.admin.bodies import Text, TextList, admin_router
from gateway.admin.context import AdminContext
from gateway.admin.errors import AdminError, responses
from gateway.admin.models import PATTERNS_HELP, URLS_HELP, Strict, iso
from gateway.client.order import MAX_KEYS, PatternError, expand_all, shuffled
from tiering import pool
from tiering.errors import InvalidArgument, NoSuchBucket
from tiering.prefetch.epoch import Epoch

MiB = 1024 * 1024


class NewEpoch(Strict):
    bucket: Text
    keys: TextList | None = Field(
        None, max_length=MAX_KEYS,
        description="The keys in the order they will be read, each taken literally (see patterns and urls).",
    )
    patterns: bool = Field(False, description=PATTERNS_HELP)
    urls: bool = Field(False, description=URLS_HELP)
    prefix: Text | None = Field(None, description="Every key under this prefix, in the order `seed` gives.")
    seed: int | None = Field(
        None, description="With prefix: the keys ordered by BLAKE2b-64 of '<seed>:<key>' "
        "(gateway.client.order.shuffled); without a seed, in key order.",
    )
    readers: int = Field(1, ge=1, le=65536, description="Readers sharing the order: reader r reads positions "
                         "r, r+N, r+2N, ... (DataLoader workers times ranks).")
    lookahead_bytes: Annotated[int, Field(ge=MiB)] = Field(
        256 * MiB, description="Most bytes kept in flight ahead of the readers.")
    lookahead_objects: int = Field(4096, ge=1, le=1_000_000, description="Most objects kept in flight ahead.")
    idle_timeout: float = Field(600.0, gt=0, le=7 * 86400,
                                description="Seconds without a read after which the epoch is abandoned.")

    @model_validator(mode="after")
    def _one_order(self) -> NewEpoch:
        if (self.keys is None) == (self.prefix is None):
            raise ValueError("give keys, or prefix (and seed)")
        if self.seed is not None and self.prefix is None:
            raise ValueError("seed goes with prefix")
        if self.prefix is not None and (self.patterns or self.urls):
            raise ValueError("patterns and urls apply to keys, not to prefix")
        return self


class EpochView(BaseModel):
    id: str
    bucket: str
    state: str = Field(description="queued, active, finished, ended or abandoned")
    objects: int
    readers: int
    positions: list[int] = Field(description="Per reader: the last position read (-N..-1 before its first).")
    consumed: int
    hits: int = Field(description="Reads that found the object hot.")
    late: int = Field(description="Reads of an object the prefetch was still fetching: they joined its fetch.")
    misses: int
    hit_ratio: float | None = Field(description="Hits over hits, late reads and misses.")
    prefetched_objects: int
    prefetched_bytes: int
    ahead_objects: int = Field(description="Objects hot in a row ahead of the readers: how far prefetch leads.")
    in_flight_objects: int = Field(description="Objects the prefetch is fetching now.")
    lookahead_objects: int = Field(description="The window now, adapted to the read rate.")
    lookahead_bytes: int
    missing_objects: int = Field(description="Positions of the order whose key is missing (see missing).")
    missing: int = Field(description="Keys named that do not exist: not in the bucket when the epoch was "
                         "registered, or answered 404 or 403 by a mount's source when prefetched. Each is "
                         "asked for once and never prefetched again in the epoch; a reader that reads it "
                         "still gets its 404.")
    missing_keys: list[str] = Field(description="The first 10 missing keys, in read order.")
    failed: int = Field(description="Keys whose prefetch failed 3 times (the source or store failing, "
                        "retried with a back-off between attempts): no longer prefetched in the epoch; "
                        "readers fetch them themselves.")
    failed_keys: list[str] = Field(description="The first 10 failed keys.")
    bucket_reads: int = Field(description="GETs of the bucket seen while the epoch was active, of keys in "
                              "its order or not.")
    unmatched_reads: int = Field(description="Those of keys the order does not name (a re-read of a key "
                                 "already read is in the order).")
    warning: str | None = Field(description="What looks wrong, in words, or null: after at least 100 reads "
                                "of the bucket fewer than 1% were of keys in the order (the keys named are "
                                "not the keys read: they are taken literally, see docs/prefetch.md); more "
                                "than half the positions are missing at the source. Both: joined by '; '.")
    created: str
    started: str | None
    finished: str | None


class EpochList(BaseModel):
    epochs: list[EpochView]


def epoch_view(epoch: Epoch) -> EpochView:
    view = epoch.view()
    for moment in ("created", "started", "finished"):
        view[moment] = iso(view[moment])  # type: ignore[arg-type]
    return EpochView(**view)  # type: ignore[arg-type]


def router(ctx: AdminContext) -> APIRouter:
    api = admin_router(responses=responses("Unavailable"))  # every route needs the running service

    def find(epoch_id: str) -> Epoch:
        found = ctx.tiering().epochs.get(epoch_id)
        if found is None:
            raise AdminError("NoSuchEpoch", f"no epoch {epoch_id!r} (finished ones are kept until 50 newer end)")
        return found

    @api.post("/epochs", tags=["epochs"], status_code=201, response_model=EpochView,
              responses=responses("InvalidRequest", "NoSuchBucket"))
    async def register(new: NewEpoch) -> EpochView:
        """Register the order the next epoch will read a bucket in. It starts
        at once, or after the bucket's running epoch (whose end then warms
        its start). The gateway keeps each reader's next objects in flight
        and evicts by this future order."""
        service = ctx.tiering()
        try:
            await service.objects.bucket(new.bucket)
            # Hashing or expanding millions of keys takes seconds: in the pool.
            if new.prefix is not None:
                keys = await service.epochs.keys_under(new.bucket, new.prefix)
                if new.seed is not None:
                    keys = await pool.run(shuffled, keys, new.seed)
            else:
                keys = await pool.run(expand_all, new.keys or [], new.bucket, False,
                                      patterns=new.patterns, urls=new.urls)
            epoch = await service.epochs.register(
                new.bucket, keys, new.readers, new.lookahead_bytes, new.lookahead_objects, new.idle_timeout,
            )
        except NoSuchBucket:
            raise AdminError("NoSuchBucket", f"bucket {new.bucket!r} does not exist") from None
        except InvalidArgument as exc:
            raise AdminError("InvalidRequest", exc.message) from None
        except PatternError as exc:
            raise AdminError("InvalidRequest", str(exc)) from None
        return epoch_view(epoch)

    @api.get("/epochs", tags=["epochs"], response_model=EpochList)
    async def list_epochs() -> EpochList:
        """Live epochs and the most recent finished ones, newest first."""
        return EpochList(epochs=[epoch_view(e) for e in ctx.tiering().epochs.all()])

    @api.get("/epochs/{epoch_id}", tags=["epochs"], response_model=EpochView, responses=responses("NoSuchEpoch"))
    async def get_epoch(epoch_id: str) -> EpochView:
        """An epoch's readers' positions, hits, misses and what was prefetched."""
        return epoch_view(find(epoch_id))

    @api.delete("/epochs/{epoch_id}", tags=["epochs"], response_model=EpochView, responses=responses("NoSuchEpoch"))
    async def end_epoch(epoch_id: str) -> EpochView:
        """End an epoch: its hints are dropped (what it warmed stays cached
        and evictable); a queued epoch of the bucket starts."""
        find(epoch_id)
        return epoch_view(ctx.tiering().epochs.end(epoch_id))  # type: ignore[arg-type]

    return api
