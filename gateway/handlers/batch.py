"""Batch GET, an extension of the S3 API: many objects in one request,
answered as a streamed tar (docs/batch.md).

``POST /{bucket}?batch`` takes ``{"keys": [...], "on_error": "skip"|"fail"}``;
``GET /{bucket}/{manifest}?batch`` reads the keys from a manifest object,
one per line, so that a presigned URL names a whole virtual shard. Both
answer a tar whose members are the objects in request order, named by their
keys; with ``on_error=skip`` a key that cannot be read is a member
``__errors__/<key>`` holding its S3 error code, with ``fail`` it is the
usual S3 error answer when known before the first byte, and cuts the
stream (no end blocks: a truncated tar) when it comes later.

A batch whose members are all known before its first byte (a
``tiering.batch.hot.HotBatch``: few, small, hot objects, their files open) is
laid out whole: its Content-Length is known, and the tar goes out in runs
of up to ``RUN`` bytes, each one buffer with the headers written in and
the bodies read straight into their places. Any other batch is streamed
member by member, with chunked transfer encoding.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from gateway.handlers.context import Context
from gateway.s3 import body, tar
from gateway.s3.errors import S3Error, to_s3_error
from gateway.s3.http import Response, S3Request
from gateway.serving.process import MALLOC_MMAP_THRESHOLD
from tiering.batch.hot import HotBatch
from tiering.batch.member import Member
from tiering.batch.reads import MAX_KEYS
from tiering.cluster.peers import PEER_HEADER
from tiering.errors import AccessDenied
from tiering.files import unfilled
from tiering.memo import ByIdentity
from tiering.meta import ObjectMeta
from tiering.model.archive import ERRORS
from tiering.model.names import unencodable
from tiering.reads.plan import ReadTally

MAX_BODY = 2 * 1024 * 1024  # a POST body, or a manifest object, at most
CONTENT_TYPE = "application/x-tar"
# Small members are sent together, up to this many bytes a send: one ASGI
# send costs about as much as copying 100 KiB, and each send is copied
# again (chunk framing); 256 KiB cost 20 % less gateway CPU per 64 KiB
# object than 1 MiB here (the copies stay in cache).
COALESCE = 256 * 1024
# A hot batch's tar is sent in runs of consecutive members, each one buffer
# with the headers written in and the bodies read into their places
# (HotBatch.read). A run stays under this many bytes unless one
# member is larger: from 1 MiB on, glibc's malloc maps every buffer anew
# (gateway/serving/listener.py's threshold) and the kernel zeroes it page by page
# on first touch, which cost the loop 16 % of a hot batch's time in a
# py-spy profile; under it, freed buffers are reused.
RUN = MALLOC_MMAP_THRESHOLD - 4096
ON_ERROR = ("skip", "fail")


@dataclass(slots=True)
class BatchTally(ReadTally):
    """A batch's read bytes by tier, and its members (metrics, access log)."""

    objects: int = 0  # members sent with their object's bytes
    errors: int = 0  # ``__errors__/`` members


def _too_big() -> S3Error:
    return S3Error("MaxMessageLengthExceeded", f"A batch request or manifest is at most {MAX_BODY} bytes.")


def _on_error(value: object) -> bool:
    """True for ``fail``, False for ``skip`` (the default)."""
    if value is None:
        return False
    if value not in ON_ERROR:
        raise S3Error("InvalidArgument", "on_error must be \"skip\" or \"fail\"",
                      ArgumentName="on_error", ArgumentValue=str(value))
    return value == "fail"


def _check_count(keys: Sequence[str]) -> None:
    if len(keys) > MAX_KEYS:
        raise S3Error("InvalidArgument", f"A batch names at most {MAX_KEYS} keys; this one names {len(keys)}.",
                      ArgumentName="keys", ArgumentValue=str(len(keys)))


def parse_request(data: bytes) -> tuple[list[str], bool, list[str] | None]:
    """The keys, the ``fail`` flag and the ETags (one a key, or None) of a POST body."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise S3Error("InvalidRequest", f"The batch request is not valid JSON: {exc}") from exc
    except RecursionError:
        # json's C scanner stops at the interpreter's recursion limit; a
        # batch needs two levels, so any document this deep is refused.
        raise S3Error("InvalidRequest", "The batch request is nested too deeply.") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise S3Error("InvalidRequest", 'The batch request must be a JSON object with a "keys" array.')
    keys = doc["keys"]
    if not all(isinstance(k, str) for k in keys):
        raise S3Error("InvalidArgument", "Every key of a batch must be a string", ArgumentName="keys")
    if any(unencodable(k) is not None for k in keys):
        # JSON may spell a lone surrogate ("\ud800"): no S3 key can hold it.
        raise S3Error("InvalidArgument", "Every key of a batch must be valid Unicode text (no lone surrogates)",
                      ArgumentName="keys")
    _check_count(keys)
    etags = doc.get("etags")
    if etags is not None and (not isinstance(etags, list) or len(etags) != len(keys)
                              or not all(isinstance(e, str) and e.isascii() for e in etags)):
        raise S3Error("InvalidArgument", "etags must be an array of one ETag (text) for each key",
                      ArgumentName="etags")
    return keys, _on_error(doc.get("on_error")), etags


def parse_manifest(data: bytes) -> list[str]:
    """The keys of a manifest object: one per line (LF or CRLF), blank lines skipped."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise S3Error("InvalidRequest", "A batch manifest must be UTF-8 text, one key per line.") from exc
    keys = [line.removesuffix("\r") for line in text.split("\n")]
    keys = [k for k in keys if k]
    _check_count(keys)
    return keys


async def post_batch(ctx: Context, req: S3Request) -> Response:
    try:
        data = await body.read_small(req, MAX_BODY)
    except S3Error as exc:
        if exc.code == "MaxMessageLengthExceeded":
            raise _too_big() from exc
        raise
    keys, fail, etags = parse_request(data)
    return await _answer(ctx, req, keys, fail, etags)


async def get_batch(ctx: Context, req: S3Request) -> Response:
    """The tar of the keys a manifest object lists (``?on_error=`` as in a POST)."""
    fail = _on_error(req.query.get("on_error"))
    manifest = await ctx.service.head(req.bucket, req.key)
    if manifest.size > MAX_BODY:
        raise _too_big()
    keys = parse_manifest(await ctx.service.read_all(manifest))
    return await _answer(ctx, req, keys, fail)


def _refused(req: S3Request, keys: list[str]) -> set[int]:
    """The members the caller may not read (``s3:GetObject`` on each, as a
    GET of it would ask, gateway/auth/access.py); AccessDenied when that is all
    of them, or any of them with ``on_error=fail``."""
    caller = req.caller
    if caller is None or caller.principal.kind == "root":
        return set()
    bucket = req.bucket
    refused = {i for i, key in enumerate(keys) if not caller.allows("s3:GetObject", bucket, key, keep=False)}
    return refused


async def _answer(ctx: Context, req: S3Request, keys: list[str], fail: bool,
                  etags: list[str] | None = None) -> Response:
    tally = BatchTally()
    peer = req.headers.get(PEER_HEADER)  # another gateway gathering what this one keeps
    req.tally = tally  # read by the app once the stream is out: metrics, access log
    refused = _refused(req, keys)
    if refused:
        if fail or len(refused) == len(keys):
            raise S3Error("AccessDenied", "Access Denied")
        # Rare (a batch across what a caller may read): the others are read
        # and sent member by member, the refused ones as error members.
        allowed = [key for i, key in enumerate(keys) if i not in refused]
        kept = None if etags is None else [etag for i, etag in enumerate(etags) if i not in refused]
        found = await ctx.service.batch(req.bucket, allowed, fail, tally, kept, peer)
        return Response(body=_stream(_with_refused(found, keys, refused), fail, tally), content_type=CONTENT_TYPE)
    members = await ctx.service.batch(req.bucket, keys, fail, tally, etags, peer)
    if isinstance(members, HotBatch):
        try:
            layout = _Layout(members.members, int(time.time()))
        except BaseException:
            members.close()
            raise
        return Response(headers=[("content-length", str(layout.size))], body=_sized(members, layout, tally),
                        content_type=CONTENT_TYPE)
    return Response(body=_stream(members, fail, tally), content_type=CONTENT_TYPE)


async def _with_refused(found: HotBatch | AsyncIterator[Member], keys: list[str],
                        refused: set[int]) -> AsyncIterator[Member]:
    """The members of ``keys`` in order: AccessDenied ones at the positions
    refused, the others from ``found`` (the batch of the keys allowed)."""
    members = _one_by_one(found)
    try:
        for i, key in enumerate(keys):
            if i in refused:
                yield Member(key, error=AccessDenied("Access Denied"))
            else:
                yield await anext(members)
    finally:
        await members.aclose()


async def _one_by_one(found: HotBatch | AsyncIterator[Member]) -> AsyncIterator[Member]:
    """Members as they are read; a hot batch's bodies read one at a time."""
    if not isinstance(found, HotBatch):
        try:
            async for member in found:
                yield member
        finally:
            await found.aclose()  # type: ignore[attr-defined]
        return
    try:
        for i, member in enumerate(found.members):
            if member.error is not None or member.meta is None:
                await found.read(i, [None])
                yield member
                continue
            buffer = bytearray(member.meta.size)
            await found.read(i, [memoryview(buffer)])
            yield Member(member.key, member.meta, bytes(buffer))
    finally:
        found.close()


@dataclass(slots=True)
class _Run:
    """Consecutive members of a hot batch sent as one buffer."""

    start: int  # the first member's position
    size: int = 0  # bytes, padding and (in the last run) the end blocks included
    # Per member: its header (an error member's content after it), its
    # body's size (None for an error member) and the bytes up to the next.
    pieces: list[tuple[bytes, int | None, int]] = field(default_factory=list)
    objects: int = 0
    errors: int = 0


class _Layout:
    """The whole tar of a hot batch, in runs of about RUN bytes."""

    def __init__(self, members: list[Member], now: int) -> None:
        self.runs: list[_Run] = []
        run = _Run(0)
        for position, member in enumerate(members):
            if member.error is not None:
                code = to_s3_error(member.error).code.encode()
                head = tar.header(ERRORS + member.key, len(code), now) + code
                size, step = None, len(head) + -len(code) % tar.BLOCK
            else:
                meta = member.meta
                assert meta is not None
                head = _HEADERS.get(meta, _header)
                size, step = meta.size, len(head) + meta.size + -meta.size % tar.BLOCK
            if run.pieces and run.size + step > RUN:
                self.runs.append(run)
                run = _Run(position)
            run.pieces.append((head, size, step))
            run.size += step
            if size is None:
                run.errors += 1
            else:
                run.objects += 1
        run.size += len(tar.END)  # zeros, as a new buffer is
        self.runs.append(run)
        self.size = sum(r.size for r in self.runs)

    @staticmethod
    def fill(run: _Run) -> tuple[bytearray, list[memoryview | None]]:
        """The run's buffer, its headers written, and the places of its
        members' bodies in it (None for an error member)."""
        # Not zeroed: the headers, padding and end blocks are written here,
        # every body by the reads into its view, before the run is sent.
        buffer = unfilled(run.size)
        view = memoryview(buffer)
        views: list[memoryview | None] = []
        at = 0
        for head, size, step in run.pieces:
            body = at + len(head)
            buffer[at:body] = head
            end = body + (size or 0)
            views.append(None if size is None else view[body:end])
            at += step
            buffer[end:at] = tar.END[: at - end]  # the padding to the next block
        buffer[at:] = tar.END[: run.size - at]  # the end blocks, after the last run's members
        return buffer, views


def _header(meta: ObjectMeta) -> bytes:
    """A member's tar header: the record's key (the key asked), size and mtime."""
    return tar.header(meta.key, meta.size, meta.last_modified_ms // 1000)


# A hot member's tar header, made once per object version and found again
# by its record's identity, as a GET's response head is (gateway.s3.headers).
_HEADERS: ByIdentity[ObjectMeta, bytes] = ByIdentity(8192, "tar_headers")


async def _sized(members: HotBatch, layout: _Layout, tally: BatchTally) -> AsyncIterator[bytes | bytearray]:
    """The tar of a hot batch, run by run."""
    try:
        for run in layout.runs:
            buffer, views = _Layout.fill(run)
            await members.read(run.start, views)
            tally.objects += run.objects
            tally.errors += run.errors
            yield buffer
    finally:
        members.close()


async def _stream(members: AsyncIterator[Member], fail: bool, tally: BatchTally) -> AsyncIterator[bytes]:
    """The tar, member by member; small members go out together."""
    now = int(time.time())
    out: list[bytes] = []
    size = 0
    try:
        async for member in members:
            if member.error is not None:
                if fail:
                    raise member.error
                code = to_s3_error(member.error).code.encode()
                out += (tar.header(ERRORS + member.key, len(code), now), code, tar.padding(len(code)))
                size += len(code)
                tally.errors += 1
                continue
            meta = member.meta
            assert meta is not None
            head = tar.header(member.key, meta.size, meta.last_modified_ms // 1000)
            tally.objects += 1
            if isinstance(member.body, (bytes, memoryview)):  # a view: gathered from the node that keeps it
                out += (head, member.body, tar.padding(meta.size))
                size += meta.size
                if size >= COALESCE:
                    yield b"".join(out)
                    out, size = [], 0
                continue
            # A large object streams: what was gathered goes first.
            out.append(head)
            yield b"".join(out)
            out, size = [], 0
            async for block in member.body:  # type: ignore[union-attr]
                yield block
            out.append(tar.padding(meta.size))
        out.append(tar.END)
        yield b"".join(out)
    finally:
        await members.aclose()
