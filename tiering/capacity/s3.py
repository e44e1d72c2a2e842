"""The capacity store on S3 (AWS S3, MinIO, Ceph RGW) over aiobotocore.

Every request goes through one choke point, ``S3Store.call``: it counts the
request, runs it (and, for GETs, reads the body) inside a retry loop with
capped exponential backoff and full jitter, and translates failures once, by
S3 error code and HTTP status (never by message text), into
``CapacityNotFound`` / ``CapacityError``. botocore's own retries are off, so
the retry policy lives here only.

Imported lazily by ``tiering.capacity.open_capacity``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    FlexibleChecksumError,
    NoCredentialsError,
)

from tiering.capacity.s3_answers import (
    CONFLICT_CODES,
    NOT_FOUND_CODES,
    TRANSIENT_EXCEPTIONS,
    BadBody,
    client_error_code,
    parse_content_range,
    read_body,
    retryable,
)
from tiering.capacity.s3_get import Keys, LeanGetter, RangeInto
from tiering.capacity.s3_upload import (
    MAX_PART_SIZE,
    MIN_PART_SIZE,
    UPLOAD_CHECKSUM,
    S3Upload,
    one_line,
)
from tiering.capacity.store import (
    CapacityStats,
    CapacityUpload,
    Into,
    Listed,
    check_name,
    check_prefix,
    check_range,
)
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound

T = TypeVar("T")
log = logging.getLogger(__name__)


# Which counter each operation bumps (once per logical request).
_COUNTERS = {
    "put_object": "puts",
    "create_multipart_upload": "puts",
    "upload_part": "puts",
    "complete_multipart_upload": "puts",
    "get_object": "gets",
    "head_object": "heads",
    "head_bucket": "heads",
    "delete_object": "deletes",
    "abort_multipart_upload": "deletes",
    "list_objects_v2": "lists",
    "list_parts": "lists",
    "list_multipart_uploads": "lists",
}

# Seconds to connect, and between two reads of an answer.
_CONNECT_TIMEOUT = 5.0
_READ_TIMEOUT = 60.0

_SESSION: AioSession | None = None


def _session() -> AioSession:
    """One session per process: it holds no connection, only configuration
    and botocore's loaded service models, which cost ~0.15 s to load anew."""
    global _SESSION
    if _SESSION is None:
        _SESSION = get_session()
    return _SESSION


async def _read_if_changed(self: S3Store, name: str, tag: str) -> tuple[bytes, str] | None:
    """``CapacityStore.read_if_changed``: a GET with If-None-Match."""
    key = self._key(name)

    async def fetch() -> tuple[bytes, str] | None:
        try:
            response = await self.client().get_object(Bucket=self.bucket, Key=key, IfNoneMatch=tag,
                                                      ChecksumMode="ENABLED")
        except ClientError as exc:
            if client_error_code(exc)[1] == 304:  # RFC 9110 13.1.2: unchanged, no body
                return None
            raise
        return await read_body(response), str(response["ETag"])

    found = await self.call("get_object", name, fetch)
    if found is not None:
        self.stats.bytes_read += len(found[0])
    return found


class S3Store:
    """Objects under ``s3://bucket/prefix/``; see ``tiering.capacity.CapacityStore``.

    ``concurrency`` bounds the parts in flight per upload; ``connections``
    sizes the connection pool (at least twice ``concurrency``); ``page_size`` is the MaxKeys of each listing request;
    ``max_attempts``, ``backoff_base`` and ``backoff_cap`` shape the retries.
    """
    read_if_changed = _read_if_changed  # defined above: the class is at its length limit

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        concurrency: int = 8,
        connections: int = 16,
        part_size: int = 8 * 1024 * 1024,
        page_size: int = 1000,
        max_attempts: int = 6,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
    ) -> None:
        if not bucket:
            raise ValueError("capacity bucket name must not be empty")
        if (access_key is None) != (secret_key is None):
            raise ValueError("capacity access key and secret key go together: give both or neither")
        if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
            raise ValueError(f"part_size must be between 5 MiB and 5 GiB, got {part_size}")
        if concurrency < 1 or page_size < 1 or max_attempts < 1:
            raise ValueError("concurrency, page_size and max_attempts must be >= 1")
        prefix = prefix.strip("/")
        if prefix:
            try:
                check_name(prefix)
            except ValueError as exc:
                raise ValueError(f"capacity prefix {prefix!r} is not a clean path") from exc
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.endpoint = endpoint
        self.region = region
        self.part_size = part_size
        self.concurrency = concurrency
        self.connections = max(connections, concurrency * 2)
        self.page_size = page_size
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.stats = CapacityStats()
        self._access_key = access_key
        self._secret_key = secret_key
        self._client: Any = None
        self._getter: Any = None  # the ranged GETs': LeanGetter on an endpoint, else the client
        self._stack: AsyncExitStack | None = None

    def describe(self) -> str:
        url = f"s3://{self.bucket}/{self.prefix.rstrip('/')}".rstrip("/")
        return f"{url} {self._where()}"

    def _where(self) -> str:
        if self.endpoint:
            return f"at {self.endpoint}"
        return f"on AWS ({self.region})" if self.region else "on AWS"

    def _key(self, name: str) -> str:
        return self.prefix + check_name(name)

    def client(self) -> Any:
        if self._client is None:
            raise RuntimeError(f"capacity store {self.describe()} is not started")
        return self._client

    # ---- lifecycle --------------------------------------------------------

    def client_kwargs(self) -> dict[str, Any]:
        """The arguments of the botocore client: its config, endpoint and keys."""
        config = AioConfig(
            max_pool_connections=self.connections,
            connect_timeout=_CONNECT_TIMEOUT,
            read_timeout=_READ_TIMEOUT,
            # One attempt per botocore call: _call owns the retry policy.
            retries={"total_max_attempts": 1},
            # Every body sent carries a checksum, also where
            # AWS_REQUEST_CHECKSUM_CALCULATION=when_required would drop it:
            # the store refuses a body damaged on the way (BadDigest,
            # retried) rather than keeping it. The writes below ask for
            # CRC32C (UPLOAD_CHECKSUM) over botocore's default CRC32.
            request_checksum_calculation="when_supported",
            # A body read back is checked against the store's checksum where
            # the read asks for it (ChecksumMode, whole objects): S3 sends no
            # checksum with a range, and rclone serve s3 sends the whole
            # object's, which no range matches. Extents carry checksums of
            # their own (packer.codec), checked on every read.
            response_checksum_validation="when_required",
            # The store is `endpoint` or AWS, never AWS_ENDPOINT_URL: that
            # variable points a shell's clients at this gateway
            # (`tierstore env`), and the gateway must not become its own store.
            ignore_configured_endpoint_urls=True,
            **({"s3": {"addressing_style": "path"}} if self.endpoint else {}),
        )
        kwargs: dict[str, Any] = {
            "endpoint_url": self.endpoint,
            "region_name": self.region or "us-east-1",
            "config": config,
        }
        if self._access_key is not None:
            # Otherwise the standard botocore chain (env, profiles, roles).
            kwargs["aws_access_key_id"] = self._access_key
            kwargs["aws_secret_access_key"] = self._secret_key
        return kwargs

    async def start(self) -> None:
        if self._client is not None:
            return
        kwargs = self.client_kwargs()
        self._stack = AsyncExitStack()
        try:
            self._client = await self._stack.enter_async_context(
                _session().create_client("s3", **kwargs)
            )
            self._getter = self._client
            if self.endpoint:
                getter = LeanGetter(
                    self.endpoint, kwargs["region_name"], self._keys,
                    connections=kwargs["config"].max_pool_connections,
                    connect_timeout=_CONNECT_TIMEOUT, read_timeout=_READ_TIMEOUT,
                )
                self._stack.push_async_callback(getter.close)
                await getter.start()
                self._getter = getter
            await self.call("head_bucket", "", self._client.head_bucket, Bucket=self.bucket)
        except CapacityNotFound as exc:
            await self.close()
            raise CapacityError(
                f"capacity bucket {self.bucket!r} does not exist {self._where()}",
                bucket=self.bucket,
            ) from exc
        except CapacityError as exc:
            await self.close()
            if exc.detail.get("status") == 403:
                raise CapacityError(
                    f"access to capacity bucket {self.bucket!r} {self._where()} denied (HTTP 403):"
                    " check the capacity credentials",
                    bucket=self.bucket,
                ) from exc
            raise
        except BaseException:
            await self.close()
            raise

    async def _keys(self) -> Keys:
        """The keys to sign with now: the configured pair, else botocore's
        chain (environment, profiles, roles), refreshed as it decides."""
        if self._access_key is not None:
            return Keys(self._access_key, self._secret_key or "", None)
        credentials = await _session().get_credentials()
        if credentials is None:
            raise NoCredentialsError()
        frozen = await credentials.get_frozen_credentials()
        return Keys(frozen.access_key, frozen.secret_key, frozen.token)

    async def close(self) -> None:
        stack, self._stack, self._client, self._getter = self._stack, None, None, None
        if stack is not None:
            await stack.aclose()

    # ---- the choke point --------------------------------------------------

    async def call(
        self, op: str, name: str, fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any
    ) -> T:
        """Run ``fn`` (one S3 request, body included) with retries; translate errors."""
        counter = _COUNTERS.get(op)
        if counter is not None:
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        what = f"capacity store {self.describe()}: {op}{' ' + name if name else ''}"
        attempt = 0
        while True:
            attempt += 1
            code, status = "", 0
            try:
                return await fn(*args, **kw)
            except ClientError as exc:
                code, status = client_error_code(exc)
                if code in NOT_FOUND_CODES:
                    raise CapacityNotFound(
                        f"{what}: no such object", name=name, op=op, code=code, status=status
                    ) from exc
                reason = f"{code or 'error'} (HTTP {status})"
                if not retryable(code, status):
                    raise CapacityError(
                        f"{what} failed: {reason}",
                        name=name,
                        op=op,
                        code=code,
                        status=status,
                        attempts=attempt,
                        said=str((exc.response.get("Error") or {}).get("Message") or ""),
                    ) from exc
                failure: BaseException = exc
            except (*TRANSIENT_EXCEPTIONS, BadBody) as exc:
                reason = (
                    "the body did not match its checksum (corrupt in transit)"
                    if isinstance(exc, FlexibleChecksumError) else one_line(exc)
                )
                failure = exc
            except BotoCoreError as exc:
                # No credentials, bad parameters, ...: retrying cannot help.
                raise CapacityError(
                    f"{what} failed: {one_line(exc)}", name=name, op=op, attempts=attempt
                ) from exc
            if attempt >= self.max_attempts:
                raise CapacityError(
                    f"{what} failed after {attempt} attempts: {reason}",
                    name=name,
                    op=op,
                    code=code,
                    status=status,
                    attempts=attempt,
                ) from failure
            self.stats.retries += 1
            delay = random.uniform(0, min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 1)))
            log.debug("%s: attempt %d failed (%s), retrying in %.3fs", what, attempt, reason, delay)
            await asyncio.sleep(delay)

    # ---- objects ----------------------------------------------------------

    async def put(self, name: str, data: bytes | memoryview, **object_args: Any) -> None:
        """Write ``name`` in one PUT; ``object_args`` (ContentType, Metadata,
        ...) go to S3 as they are."""
        key = self._key(name)
        body = data if isinstance(data, bytes) else bytes(data)
        await self.call(
            "put_object", name, self.client().put_object, Bucket=self.bucket, Key=key, Body=body,
            ChecksumAlgorithm=UPLOAD_CHECKSUM, **object_args,
        )
        self.stats.bytes_written += len(body)

    def upload(self, name: str) -> CapacityUpload:
        return S3Upload(self, name, self._key(name))

    async def read_versioned(self, name: str) -> tuple[bytes, str]:
        key = self._key(name)

        async def fetch() -> tuple[bytes, str]:
            response = await self.client().get_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
            return await read_body(response), str(response["ETag"])

        data, etag = await self.call("get_object", name, fetch)
        self.stats.bytes_read += len(data)
        return data, etag

    async def put_conditional(self, name: str, data: bytes, expect: str | None) -> str:
        """S3 conditional writes (If-None-Match: * or If-Match: ETag). A
        retried attempt may find its own earlier, answered-but-lost write and
        report a conflict: a caller that must know reads the object back."""
        key = self._key(name)
        condition = {"IfNoneMatch": "*"} if expect is None else {"IfMatch": expect}
        try:
            response = await self.call(
                "put_object", name, self.client().put_object, Bucket=self.bucket, Key=key, Body=data,
                ChecksumAlgorithm=UPLOAD_CHECKSUM, **condition,
            )
        except CapacityError as exc:
            if exc.detail.get("code") in CONFLICT_CODES or exc.detail.get("status") == 412:
                raise CapacityConflict(
                    f"capacity store {self.describe()}: conditional write of {name}: "
                    f"{exc.detail.get('code')}", name=name, expected=expect,
                ) from exc
            raise
        self.stats.bytes_written += len(data)
        return str(response["ETag"])

    async def get_range(self, name: str, start: int, end: int, if_match: str | None = None) -> bytes:
        """Bytes [start, end) of ``name``; with ``if_match`` (an ETag) only of
        that version (else CapacityError with code PreconditionFailed)."""
        key = self._key(name)
        check_range(start, end)
        if start == end:
            return b""
        want = end - start
        condition = {"IfMatch": if_match} if if_match is not None else {}

        async def fetch() -> bytes:
            self.client()  # started
            response = await self._getter.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}", **condition
            )
            data = await read_body(response)
            content_range = response.get("ContentRange")
            if content_range:
                first, _, total = parse_content_range(content_range)
                if total is not None and total < end:
                    raise self._past_end(name, total, start, end)
                if first != start:
                    raise BadBody(len(data), want)
            elif response["ResponseMetadata"].get("HTTPStatusCode") == 200:
                # The server ignored Range (allowed by RFC 9110) and sent it all.
                if len(data) < end:
                    raise self._past_end(name, len(data), start, end)
                data = data[start:end]
            if len(data) != want:
                raise BadBody(len(data), want)
            return data

        data = await _ranged(self, name, start, end, fetch)
        self.stats.bytes_read += len(data)
        return data

    async def get_range_into(self, name: str, start: int, end: int, into: Into,
                             if_match: str | None = None) -> None:
        """As ``get_range``, the bytes put into ``into`` as they arrive; an
        attempt cut short is retried (``call``'s policy) from the first byte
        that has not landed yet, of the same version when ``if_match``."""
        check_range(start, end)
        if start < end:
            self.client()  # started
            fetch = RangeInto(self._getter, self.bucket, self._key(name), start, end, into,
                              lambda size: self._past_end(name, size, start, end), if_match)
            await _ranged(self, name, start, end, fetch)
            self.stats.bytes_read += end - start

    def _past_end(self, name: str, size: int, start: int, end: int) -> CapacityError:
        return CapacityError(
            f"capacity store {self.describe()}: get_object {name}: object is {size} bytes,"
            f" asked for [{start}, {end})",
            name=name,
            size=size,
        )

    async def get_tail(self, name: str, length: int) -> tuple[bytes, int]:
        key = self._key(name)
        if length < 0:
            raise ValueError(f"tail length must be >= 0, got {length}")
        if length == 0:  # "bytes=-0" is not a valid range
            return b"", await self.size(name)

        async def fetch() -> tuple[bytes, int]:
            response = await self.client().get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes=-{length}"
            )
            data = await read_body(response)
            content_range = response.get("ContentRange")
            if content_range:
                _, last, total = parse_content_range(content_range)
                if total is None or last != total - 1:
                    raise BadBody(len(data), length)
            else:  # Range ignored: the whole object (its length already checked)
                total = len(data)
                data = data[-length:]
            want = min(length, total)
            if len(data) != want:
                raise BadBody(len(data), want)
            return data, total

        try:
            data, total = await self.call("get_object", name, fetch)
        except CapacityNotFound:
            raise
        except CapacityError as exc:
            # S3 answers any Range on an empty object with 416 InvalidRange;
            # rclone serve s3 answers so a suffix longer than the object too.
            if exc.detail.get("code") != "InvalidRange":
                raise
            total = await self.size(name)
            if total == 0:
                return b"", 0
            if total >= length:
                raise
            data = await self.get_range(name, 0, total)
            return data, total
        self.stats.bytes_read += len(data)
        return data, total

    async def size(self, name: str) -> int:
        key = self._key(name)
        response = await self.call(
            "head_object", name, self.client().head_object, Bucket=self.bucket, Key=key
        )
        return int(response["ContentLength"])

    async def delete(self, name: str) -> None:
        key = self._key(name)
        try:
            await self.call(
                "delete_object", name, self.client().delete_object, Bucket=self.bucket, Key=key
            )
        except CapacityNotFound:
            pass  # S3 answers 204 for a missing key; some stores answer 404

    async def delete_conditional(self, name: str, expect: str) -> None:
        key = self._key(name)
        try:
            await self.call("delete_object", name, self.client().delete_object,
                            Bucket=self.bucket, Key=key, IfMatch=expect)
        except CapacityNotFound:
            pass  # gone already: S3 answers NoSuchKey to a conditional delete of a missing key
        except CapacityError as exc:
            if exc.detail.get("code") in CONFLICT_CODES or exc.detail.get("status") == 412:
                raise CapacityConflict(f"capacity store {self.describe()}: conditional delete of {name}: "
                                       f"{exc.detail.get('code')}", name=name, expected=expect) from exc
            raise

    async def abort_incomplete(self) -> int:
        """Abort every multipart upload under the prefix (a crash mid-stream
        leaves one, holding storage until it is aborted)."""
        aborted = 0
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix}
        while True:
            page = await self._uploads_page(self.prefix, **kw)  # counted, as the aborts are, by _call
            for upload in page.get("Uploads", ()):
                try:
                    await self.call(
                        "abort_multipart_upload", upload["Key"], self.client().abort_multipart_upload,
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"],
                    )
                except CapacityNotFound:
                    pass  # completed or aborted meanwhile
                aborted += 1
            if not page.get("IsTruncated"):
                return aborted
            kw["KeyMarker"] = page.get("NextKeyMarker", "")
            kw["UploadIdMarker"] = page.get("NextUploadIdMarker", "")

    async def _uploads_page(self, name: str, **kw: Any) -> dict[str, Any]:
        """One ListMultipartUploads page. Some S3 servers (rclone serve s3)
        answer NoSuchUpload where there is no upload to list: an empty page."""
        try:
            return await self.call("list_multipart_uploads", name, self.client().list_multipart_uploads, **kw)  # type: ignore[no-any-return]
        except CapacityError as exc:
            if exc.detail.get("code") != "NoSuchUpload":
                raise
            return {"Uploads": [], "IsTruncated": False}

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[tuple[str, int]]:
        async for name, item in _listed(self, prefix, after):
            yield name, int(item["Size"])

    async def list_entries(self, prefix: str = "") -> AsyncIterator[Listed]:
        async for name, item in _listed(self, prefix, ""):
            yield Listed(name, int(item["Size"]), str(item["ETag"]), item["LastModified"].timestamp())


async def _listed(store: S3Store, prefix: str, after: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Each object under ``prefix`` (after ``after``) as ListObjectsV2
    describes it, by its name in the store, one page a request."""
    check_prefix(prefix)
    token: str | None = None
    while True:
        kw: dict[str, Any] = {"Bucket": store.bucket, "Prefix": store.prefix + prefix, "MaxKeys": store.page_size}
        if token is not None:
            kw["ContinuationToken"] = token
        elif after:
            kw["StartAfter"] = store.prefix + after
        page = await store.call("list_objects_v2", prefix, store.client().list_objects_v2, **kw)
        for item in page.get("Contents", ()):
            name = item["Key"][len(store.prefix) :]
            if _is_name(name):  # skip "dir/" markers and other foreign keys
                yield name, item
        if not page.get("IsTruncated"):
            return
        token = page.get("NextContinuationToken")
        if not token:
            raise CapacityError(
                f"capacity store {store.describe()}: list_objects_v2 {prefix}:"
                " truncated page without a continuation token"
            )


async def _ranged(store: S3Store, name: str, start: int, end: int, fetch: Callable[[], Awaitable[T]]) -> T:
    """``fetch`` (a ranged GET of ``[start, end)`` of ``name``) through the
    store's choke point; a 416 (start at or past the end) said so."""
    try:
        return await store.call("get_object", name, fetch)
    except CapacityError as exc:
        if isinstance(exc, CapacityNotFound) or exc.detail.get("code") != "InvalidRange":
            raise
        raise CapacityError(f"capacity store {store.describe()}: get_object {name}: range [{start}, {end})"
                            " starts at or past the end of the object", name=name) from exc


def _is_name(name: str) -> bool:
    try:
        check_name(name)
    except ValueError:
        return False
    return True
