"""The S3 capacity store's versioned operations: what leases, the node
registry and the follow head are built on (reads that return the ETag,
conditional reads, writes and deletes). Mixed into ``S3Store``
(``tiering/capacity/s3.py``), which provides the attributes declared here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError

from tiering.capacity.s3_answers import CONFLICT_CODES, client_error_code, read_body
from tiering.capacity.s3_upload import UPLOAD_CHECKSUM
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound

if TYPE_CHECKING:
    from tiering.capacity.store import CapacityStats

T = TypeVar("T")


class S3Versions:
    """``read_versioned``, ``read_if_changed``, ``put_conditional`` and
    ``delete_conditional`` of ``S3Store``."""

    bucket: str
    stats: CapacityStats

    if TYPE_CHECKING:
        def _key(self, name: str) -> str: ...
        def client(self) -> Any: ...
        def describe(self) -> str: ...
        async def call(self, op: str, name: str, fn: Callable[..., Awaitable[T]], *args: Any,
                       **kw: Any) -> T: ...

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

    async def read_if_changed(self, name: str, tag: str) -> tuple[bytes, str] | None:
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
