"""Object tagging against a real gateway: boto3 and s3fs, S3's limits, and
tags as part of an object's metadata through flush, compaction, a crash
and ``tierstore recover`` (issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.conftest import assert_consistent, make_client
from tests.integration.oracle import blob, crash_then_lose_the_disk, segment_files
from tests.servers import Gateway

MiB = 1024 * 1024


def error_of(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = exc.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def tags_of(s3, bucket: str, key: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}


def tag_set(tags: dict[str, str]) -> dict:
    return {"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]}


def count_header(s3, bucket: str, key: str) -> tuple[str | None, str | None]:  # type: ignore[no-untyped-def]
    """x-amz-tagging-count on GET and on HEAD."""
    got = s3.get_object(Bucket=bucket, Key=key)["ResponseMetadata"]["HTTPHeaders"].get("x-amz-tagging-count")
    head = s3.head_object(Bucket=bucket, Key=key)["ResponseMetadata"]["HTTPHeaders"].get("x-amz-tagging-count")
    return got, head


# -- the operations ---------------------------------------------------------------------


def test_put_get_delete_object_tagging(s3, bucket: str) -> None:
    put = s3.put_object(Bucket=bucket, Key="k", Body=b"data")
    before = s3.head_object(Bucket=bucket, Key="k")
    assert tags_of(s3, bucket, "k") == {}
    assert count_header(s3, bucket, "k") == (None, None)
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tag_set({"zeta": "last", "alpha": "first value"}))
    assert s3.get_object_tagging(Bucket=bucket, Key="k")["TagSet"] == [
        {"Key": "alpha", "Value": "first value"}, {"Key": "zeta", "Value": "last"},
    ]
    assert count_header(s3, bucket, "k") == ("2", "2")
    assert s3.get_object(Bucket=bucket, Key="k")["TagCount"] == 2
    after = s3.head_object(Bucket=bucket, Key="k")
    # Tags are not the object: its ETag, time and bytes stay.
    assert (after["ETag"], after["LastModified"]) == (put["ETag"], before["LastModified"])
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"data"
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tag_set({"only": ""}))  # replaces, empty value allowed
    assert tags_of(s3, bucket, "k") == {"only": ""}
    deleted = s3.delete_object_tagging(Bucket=bucket, Key="k")
    assert deleted["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert tags_of(s3, bucket, "k") == {} and count_header(s3, bucket, "k") == (None, None)
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tag_set({"a": "1"}))
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging={"TagSet": []})  # an empty set removes them
    assert tags_of(s3, bucket, "k") == {}


def test_tagging_on_put_multipart_and_overwrite(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="p", Body=b"x", Tagging="team=vision&stage=raw+data&flag")
    assert tags_of(s3, bucket, "p") == {"team": "vision", "stage": "raw data", "flag": ""}
    s3.put_object(Bucket=bucket, Key="p", Body=b"y")  # a new object: no tags
    assert tags_of(s3, bucket, "p") == {}
    upload = s3.create_multipart_upload(Bucket=bucket, Key="m", Tagging="kind=shard&n=%C3%A9t%C3%A9")["UploadId"]
    parts = []
    for number, data in enumerate([b"a" * (5 * MiB), b"b"], 1):
        etag = s3.upload_part(Bucket=bucket, Key="m", UploadId=upload, PartNumber=number, Body=data)["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    s3.complete_multipart_upload(Bucket=bucket, Key="m", UploadId=upload, MultipartUpload={"Parts": parts})
    assert tags_of(s3, bucket, "m") == {"kind": "shard", "n": "été"}
    assert count_header(s3, bucket, "m") == ("2", "2")


def test_copy_follows_the_tagging_directive(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"source", Tagging="a=1&b=2")
    source = {"Bucket": bucket, "Key": "src"}
    s3.copy_object(Bucket=bucket, Key="kept", CopySource=source)
    assert tags_of(s3, bucket, "kept") == {"a": "1", "b": "2"}
    s3.copy_object(Bucket=bucket, Key="kept-too", CopySource=source, Tagging="ignored=1")
    assert tags_of(s3, bucket, "kept-too") == {"a": "1", "b": "2"}
    s3.copy_object(Bucket=bucket, Key="replaced", CopySource=source, TaggingDirective="REPLACE", Tagging="c=3")
    assert tags_of(s3, bucket, "replaced") == {"c": "3"}
    s3.copy_object(Bucket=bucket, Key="cleared", CopySource=source, TaggingDirective="REPLACE")
    assert tags_of(s3, bucket, "cleared") == {}
    # New metadata, tags kept (the directives are independent), onto itself.
    s3.copy_object(Bucket=bucket, Key="src", CopySource=source, MetadataDirective="REPLACE", Metadata={"m": "1"})
    assert tags_of(s3, bucket, "src") == {"a": "1", "b": "2"}
    assert s3.head_object(Bucket=bucket, Key="src")["Metadata"] == {"m": "1"}
    s3.copy_object(Bucket=bucket, Key="src", CopySource=source, MetadataDirective="REPLACE",
                   TaggingDirective="REPLACE", Tagging="d=4")
    assert tags_of(s3, bucket, "src") == {"d": "4"}
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="x", CopySource=source, TaggingDirective="MERGE")
    assert error_of(err) == ("InvalidArgument", 400)


def test_s3_limits_and_errors(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    eleven = {f"k{i}": "v" for i in range(11)}
    refused = [
        (tag_set(eleven), ("BadRequest", 400)),
        (tag_set({"k" * 129: "v"}), ("InvalidTag", 400)),
        (tag_set({"k": "v" * 257}), ("InvalidTag", 400)),
        (tag_set({"aws:reserved": "v"}), ("InvalidTag", 400)),
        (tag_set({"semi;colon": "v"}), ("InvalidTag", 400)),
        ({"TagSet": [{"Key": "k", "Value": "1"}, {"Key": "k", "Value": "2"}]}, ("InvalidTag", 400)),
    ]
    for tagging, expected in refused:
        with pytest.raises(ClientError) as err:
            s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tagging)
        assert error_of(err) == expected, tagging
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tag_set(
        {"k" * 128: "v" * 256, **{f"t{i}": "+-=._:/@ ü 9" for i in range(9)}}))
    assert len(tags_of(s3, bucket, "k")) == 10
    header_refused = [
        ("&".join(f"k{i}=v" for i in range(11)), ("BadRequest", 400)),
        ("a=1&a=2", ("InvalidArgument", 400)),
        ("TagSet=[{Key=string,Value=string}]", ("InvalidArgument", 400)),
        ("aws:x=1", ("InvalidTag", 400)),
    ]
    for header, expected in header_refused:
        with pytest.raises(ClientError) as err:
            s3.put_object(Bucket=bucket, Key="h", Body=b"x", Tagging=header)
        assert error_of(err) == expected, header
        with pytest.raises(ClientError):  # nothing was stored
            s3.head_object(Bucket=bucket, Key="h")
    for call in (lambda: s3.get_object_tagging(Bucket=bucket, Key="missing"),
                 lambda: s3.put_object_tagging(Bucket=bucket, Key="missing", Tagging=tag_set({"a": "1"})),
                 lambda: s3.delete_object_tagging(Bucket=bucket, Key="missing")):
        with pytest.raises(ClientError) as err:
            call()
        assert error_of(err) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as err:
        s3.get_object_tagging(Bucket=bucket + "-missing", Key="k")
    assert error_of(err) == ("NoSuchBucket", 404)
    assert s3.get_object_tagging(Bucket=bucket, Key="k", VersionId="null")["TagSet"]
    with pytest.raises(ClientError) as err:
        s3.get_object_tagging(Bucket=bucket, Key="k", VersionId="3")
    assert error_of(err) == ("InvalidArgument", 400)


def test_s3fs_get_and_put_tags(fs, s3, bucket: str) -> None:
    fs.pipe(f"{bucket}/f", b"file")
    assert fs.get_tags(f"{bucket}/f") == {}
    fs.put_tags(f"{bucket}/f", {"a": "1", "b": "2"})
    fs.put_tags(f"{bucket}/f", {"c": "3"}, mode="m")  # merge: read, then write all
    assert fs.get_tags(f"{bucket}/f") == {"a": "1", "b": "2", "c": "3"}
    fs.put_tags(f"{bucket}/f", {"d": "4"})  # overwrite
    assert fs.get_tags(f"{bucket}/f") == {"d": "4"}
    assert tags_of(s3, bucket, "f") == {"d": "4"}


# -- tags are metadata: flush, compaction, crash, recover ------------------------------------


def test_tags_survive_flush_compaction_crash_and_recover(tmp_path: Path) -> None:
    cap = ["--capacity", (tmp_path / "cap").as_uri(), "--segment-size", "5M"]
    gw = Gateway(tmp_path / "data", extra_args=cap).start()
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="tags")
    expected: dict[str, dict[str, str]] = {}
    sizes = {f"small/{i:02d}": 200_000 + i for i in range(40)} | {"large/0": 9 * MiB + 5}
    for key, size in sizes.items():
        s3.put_object(Bucket="tags", Key=key, Body=blob(key, size), Tagging=f"key={key}&n={size}")
        expected[key] = {"key": key, "n": str(size)}

    def check(where: str) -> None:
        client = make_client(gw.endpoint)
        for key, tags in expected.items():
            assert tags_of(client, "tags", key) == tags, (where, key)
            got = client.get_object(Bucket="tags", Key=key)
            assert got["Body"].read() == blob(key, sizes[key]), (where, key)
            assert got.get("TagCount", 0) == len(tags), (where, key)

    gw.flush()
    check("after a flush")
    # Tags set once the bytes are in segments: only a new manifest is written.
    for key in list(expected)[::3]:
        expected[key] = {"retagged": "after flush"}
        s3.put_object_tagging(Bucket="tags", Key=key, Tagging=tag_set(expected[key]))
    gw.flush()
    check("after a flush of new tags")
    # Delete most neighbours so the packed segments are sparse; compaction
    # rewrites them, moving the survivors' extents and manifests.
    for i in range(40):
        if i % 4:
            key = f"small/{i:02d}"
            s3.delete_object(Bucket="tags", Key=key)
            del expected[key]
    gw.flush()
    report = gw.compact(threshold=0.99)
    assert report["rewritten"] > 0, report
    check("after compaction")
    # A crash with new tags acknowledged but not flushed.
    expected["small/00"] = {"set": "before the crash"}
    s3.put_object_tagging(Bucket="tags", Key="small/00", Tagging=tag_set(expected["small/00"]))
    s3.delete_object_tagging(Bucket="tags", Key="large/0")
    expected["large/0"] = {}
    # Then the node's disk is lost: everything comes back from the segments' footers.
    assert segment_files(tmp_path / "cap")
    crash_then_lose_the_disk(gw, cap[:2], check)
    gw.stop()
    assert_consistent(gw)
