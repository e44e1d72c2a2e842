"""Bucket versioning against a real gateway with boto3 and s3fs: statuses,
version ids on every answer, reads, tags, copies and deletes by version,
delete markers, Suspended's null version, ListObjectVersions with its
markers, and every version through a flush, a compaction, a SIGKILL and
``tierstore recover`` (issue 25)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.conftest import assert_consistent, make_client
from tests.integration.oracle import blob, crash_then_lose_the_disk, segment_files
from tests.servers import Gateway

MiB = 1024 * 1024


def error_of(call) -> tuple[str, int, dict]:  # type: ignore[no-untyped-def]
    with pytest.raises(ClientError) as failed:
        call()
    response = failed.value.response
    return (response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"],
            response["ResponseMetadata"]["HTTPHeaders"])


def enable(s3, bucket: str, status: str = "Enabled") -> None:  # type: ignore[no-untyped-def]
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": status})


def versions(s3, bucket: str, **params: object) -> list[tuple[str, str, bool, bool]]:  # type: ignore[no-untyped-def]
    """(key, version id, is latest, is a delete marker) of a whole listing,
    in the order listed (boto3 splits versions from delete markers, so the
    XML is read here)."""
    url = s3.generate_presigned_url("list_object_versions", Params={"Bucket": bucket, **params})
    response = httpx.get(url)
    assert response.status_code == 200, response.text
    rows = []
    for element in ET.fromstring(response.content):
        tag = element.tag.rpartition("}")[2]
        if tag in ("Version", "DeleteMarker"):
            field = {child.tag.rpartition("}")[2]: child.text for child in element}
            rows.append((field["Key"], field["VersionId"], field["IsLatest"] == "true", tag == "DeleteMarker"))
    return rows


# -- status ---------------------------------------------------------------------------


def test_versioning_status(s3, bucket: str) -> None:
    got = s3.get_bucket_versioning(Bucket=bucket)
    assert "Status" not in got  # never versioned: no status at all
    enable(s3, bucket)
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    enable(s3, bucket, "Suspended")
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Suspended"
    enable(s3, bucket)
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    # There is no way back to unversioned: only the two statuses are taken.
    code, status, _ = error_of(lambda: s3.put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Disabled"}))  # type: ignore[typeddict-item]
    assert (code, status) == ("MalformedXML", 400)
    # MFA delete needs an MFA code with the request, as in S3.
    code, status, _ = error_of(lambda: s3.put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Enabled", "MFADelete": "Enabled"}))
    assert (code, status) == ("AccessDenied", 403)
    code, status, _ = error_of(lambda: s3.put_bucket_versioning(
        Bucket=bucket, MFA="123456 000000", VersioningConfiguration={"Status": "Enabled", "MFADelete": "Enabled"}))
    assert (code, status) == ("NotImplemented", 501)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled", "MFADelete": "Disabled"})
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    code, status, _ = error_of(lambda: s3.put_bucket_versioning(
        Bucket="no-such-bucket-here", VersioningConfiguration={"Status": "Enabled"}))
    assert (code, status) == ("NoSuchBucket", 404)


def test_malformed_versioning_bodies_are_400(gateway: Gateway, s3, bucket: str) -> None:
    for body in (b"", b"<VersioningConfiguration/>", b"<x><Status>Enabled</Status></x>", b"not xml",
                 b"<VersioningConfiguration><Status>enabled</Status></VersioningConfiguration>"):
        request = s3.generate_presigned_url("put_bucket_versioning", Params={
            "Bucket": bucket, "VersioningConfiguration": {"Status": "Enabled"}})
        response = httpx.put(request, content=body)
        assert response.status_code == 400, (body, response.text)
        assert b"MalformedXML" in response.content
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)


# -- Enabled --------------------------------------------------------------------------


def test_writes_reads_and_deletes_by_version(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="before", Body=b"unversioned")
    enable(s3, bucket)
    v1 = s3.put_object(Bucket=bucket, Key="k", Body=b"one")["VersionId"]
    v2 = s3.put_object(Bucket=bucket, Key="k", Body=b"two")["VersionId"]
    assert v1 != v2 and v1 < v2 and v1 not in ("", "null")
    got = s3.get_object(Bucket=bucket, Key="k")
    assert (got["Body"].read(), got["VersionId"]) == (b"two", v2)
    got = s3.get_object(Bucket=bucket, Key="k", VersionId=v1)
    assert (got["Body"].read(), got["VersionId"]) == (b"one", v1)
    assert s3.head_object(Bucket=bucket, Key="k", VersionId=v1)["ContentLength"] == 3
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=v1, Range="bytes=1-")["Body"].read() == b"ne"
    # The object written before versioning is the null version.
    assert s3.get_object(Bucket=bucket, Key="before", VersionId="null")["Body"].read() == b"unversioned"

    # DELETE without a version id puts a delete marker.
    deleted = s3.delete_object(Bucket=bucket, Key="k")
    assert deleted["DeleteMarker"] is True
    marker = deleted["VersionId"]
    assert marker > v2
    code, status, hdrs = error_of(lambda: s3.get_object(Bucket=bucket, Key="k"))
    assert (code, status, hdrs.get("x-amz-delete-marker"), hdrs.get("x-amz-version-id")) == (
        "NoSuchKey", 404, "true", marker)
    assert error_of(lambda: s3.head_object(Bucket=bucket, Key="k"))[1] == 404
    code, status, hdrs = error_of(lambda: s3.get_object(Bucket=bucket, Key="k", VersionId=marker))
    assert (code, status, hdrs.get("x-amz-delete-marker")) == ("MethodNotAllowed", 405, "true")
    assert "last-modified" in hdrs
    assert error_of(lambda: s3.head_object(Bucket=bucket, Key="k", VersionId=marker))[1] == 405
    # Listings show current, not deleted, versions only.
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["before"]
    assert [o["Key"] for o in s3.list_objects(Bucket=bucket)["Contents"]] == ["before"]
    assert versions(s3, bucket) == [
        ("before", "null", True, False), ("k", marker, True, True), ("k", v2, False, False), ("k", v1, False, False),
    ]
    # Older versions stay readable under the marker.
    assert s3.get_object(Bucket=bucket, Key="k", VersionId=v2)["Body"].read() == b"two"

    # Deleting the marker by its id makes the version below it current again.
    removed = s3.delete_object(Bucket=bucket, Key="k", VersionId=marker)
    assert (removed["VersionId"], removed.get("DeleteMarker")) == (marker, True)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"two"
    # Deleting the current version by its id promotes the previous one.
    removed = s3.delete_object(Bucket=bucket, Key="k", VersionId=v2)
    assert removed["VersionId"] == v2 and "DeleteMarker" not in removed
    got = s3.get_object(Bucket=bucket, Key="k")
    assert (got["Body"].read(), got["VersionId"]) == (b"one", v1)
    assert versions(s3, bucket, Prefix="k") == [("k", v1, True, False)]

    # Version ids: malformed ones are 400, unknown well-formed ones 404
    # (a DELETE of one is 204, as S3 answers it).
    for bad in ("nope", "0" * 15, v1.upper() + "x", "../etc"):
        code, status, _ = error_of(lambda bad=bad: s3.get_object(Bucket=bucket, Key="k", VersionId=bad))
        assert (code, status) == ("InvalidArgument", 400), bad
        assert error_of(lambda bad=bad: s3.delete_object(Bucket=bucket, Key="k", VersionId=bad))[:2] == (
            "InvalidArgument", 400)
    unknown = "0" * 15 + "1"
    assert error_of(lambda: s3.get_object(Bucket=bucket, Key="k", VersionId=unknown))[:2] == ("NoSuchVersion", 404)
    assert error_of(lambda: s3.get_object(Bucket=bucket, Key="none", VersionId=v1))[:2] == ("NoSuchVersion", 404)
    assert s3.delete_object(Bucket=bucket, Key="k", VersionId=unknown)["VersionId"] == unknown
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"one"
    # The last version gone: the key is gone.
    s3.delete_object(Bucket=bucket, Key="k", VersionId=v1)
    assert error_of(lambda: s3.get_object(Bucket=bucket, Key="k"))[:2] == ("NoSuchKey", 404)
    assert versions(s3, bucket, Prefix="k") == []


def test_a_bucket_with_versions_or_markers_is_not_empty(s3, bucket: str) -> None:
    enable(s3, bucket)
    v = s3.put_object(Bucket=bucket, Key="k", Body=b"x")["VersionId"]
    marker = s3.delete_object(Bucket=bucket, Key="k")["VersionId"]
    assert error_of(lambda: s3.delete_bucket(Bucket=bucket))[:2] == ("BucketNotEmpty", 409)
    s3.delete_object(Bucket=bucket, Key="k", VersionId=v)
    assert error_of(lambda: s3.delete_bucket(Bucket=bucket))[:2] == ("BucketNotEmpty", 409)
    s3.delete_object(Bucket=bucket, Key="k", VersionId=marker)
    s3.delete_bucket(Bucket=bucket)
    s3.create_bucket(Bucket=bucket)  # the fixture's teardown expects it


def test_multipart_copy_tags_and_conditions_on_versions(s3, bucket: str) -> None:
    enable(s3, bucket)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="m", Tagging="first=yes")["UploadId"]
    parts = []
    for number, data in enumerate([b"a" * (5 * MiB), b"b"], 1):
        etag = s3.upload_part(Bucket=bucket, Key="m", UploadId=upload, PartNumber=number, Body=data)["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    done = s3.complete_multipart_upload(Bucket=bucket, Key="m", UploadId=upload, MultipartUpload={"Parts": parts})
    v1 = done["VersionId"]
    v2 = s3.put_object(Bucket=bucket, Key="m", Body=b"small")["VersionId"]
    # Tags by version: each version has its own.
    assert s3.get_object_tagging(Bucket=bucket, Key="m", VersionId=v1)["TagSet"] == [
        {"Key": "first", "Value": "yes"}]
    assert s3.get_object_tagging(Bucket=bucket, Key="m")["TagSet"] == []
    put = s3.put_object_tagging(Bucket=bucket, Key="m", VersionId=v1, Tagging={"TagSet": [{"Key": "old",
                                                                                            "Value": "1"}]})
    assert put["VersionId"] == v1
    assert s3.get_object_tagging(Bucket=bucket, Key="m", VersionId=v1)["TagSet"] == [{"Key": "old", "Value": "1"}]
    assert s3.get_object_tagging(Bucket=bucket, Key="m", VersionId=v2)["TagSet"] == []
    s3.delete_object_tagging(Bucket=bucket, Key="m", VersionId=v1)
    assert s3.get_object_tagging(Bucket=bucket, Key="m", VersionId=v1)["TagSet"] == []
    # A copy of an older version onto its own key restores it as a new version.
    copied = s3.copy_object(Bucket=bucket, Key="m", CopySource={"Bucket": bucket, "Key": "m", "VersionId": v1})
    v3 = copied["VersionId"]
    assert copied["CopySourceVersionId"] == v1 and v3 > v2
    got = s3.get_object(Bucket=bucket, Key="m")
    assert got["VersionId"] == v3 and got["ContentLength"] == 5 * MiB + 1
    # A copy onto itself with new metadata is a new version too; the old keeps its bytes.
    v4 = s3.copy_object(Bucket=bucket, Key="m", CopySource={"Bucket": bucket, "Key": "m"},
                        MetadataDirective="REPLACE", Metadata={"m": "1"})["VersionId"]
    assert v4 > v3
    assert s3.head_object(Bucket=bucket, Key="m")["Metadata"] == {"m": "1"}
    assert s3.get_object(Bucket=bucket, Key="m", VersionId=v3)["ContentLength"] == 5 * MiB + 1
    # Conditional writes hold against the current version.
    current = s3.head_object(Bucket=bucket, Key="m")["ETag"]
    old = s3.head_object(Bucket=bucket, Key="m", VersionId=v2)["ETag"]
    assert error_of(lambda: s3.put_object(Bucket=bucket, Key="m", Body=b"x", IfMatch=old))[:2] == (
        "PreconditionFailed", 412)
    assert error_of(lambda: s3.put_object(Bucket=bucket, Key="m", Body=b"x", IfNoneMatch="*"))[:2] == (
        "PreconditionFailed", 412)
    v5 = s3.put_object(Bucket=bucket, Key="m", Body=b"x", IfMatch=current)["VersionId"]
    assert v5 > v4
    # A key whose latest version is a delete marker has no current version.
    s3.delete_object(Bucket=bucket, Key="m")
    assert error_of(lambda: s3.put_object(Bucket=bucket, Key="m", Body=b"y", IfMatch=current))[1] == 404
    s3.put_object(Bucket=bucket, Key="m", Body=b"y", IfNoneMatch="*")
    assert [row[1] for row in versions(s3, bucket)][2:] == [v5, v4, v3, v2, v1]


def test_delete_objects_by_version(s3, bucket: str) -> None:
    enable(s3, bucket)
    ids = {key: [s3.put_object(Bucket=bucket, Key=key, Body=f"{key}{n}".encode())["VersionId"] for n in range(2)]
           for key in ("a", "b", "c")}
    result = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "a"},  # a delete marker
        {"Key": "b", "VersionId": ids["b"][1]},  # the current version: the older one comes back
        {"Key": "c", "VersionId": ids["c"][0]},  # a noncurrent one
        {"Key": "c", "VersionId": "0" * 15 + "1"},  # none such: deleted all the same
        {"Key": "c", "VersionId": "bad"},
    ]})
    deleted = {(d["Key"], d.get("VersionId")): d for d in result["Deleted"]}
    marker = deleted[("a", None)]
    assert marker["DeleteMarker"] is True and marker["DeleteMarkerVersionId"] > ids["a"][1]
    assert ("b", ids["b"][1]) in deleted and ("c", ids["c"][0]) in deleted and ("c", "0" * 15 + "1") in deleted
    assert [(e["Key"], e["Code"]) for e in result["Errors"]] == [("c", "InvalidArgument")]
    assert error_of(lambda: s3.get_object(Bucket=bucket, Key="a"))[2]["x-amz-delete-marker"] == "true"
    assert s3.get_object(Bucket=bucket, Key="b")["Body"].read() == b"b0"
    assert s3.get_object(Bucket=bucket, Key="c")["Body"].read() == b"c1"
    result = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "a", "VersionId": marker["DeleteMarkerVersionId"]}]})
    assert result["Deleted"][0]["DeleteMarker"] is True
    assert s3.get_object(Bucket=bucket, Key="a")["Body"].read() == b"a1"


# -- Suspended ------------------------------------------------------------------------


def test_suspended_writes_replace_the_null_version(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"null-0")  # the null version, unversioned
    enable(s3, bucket)
    v1 = s3.put_object(Bucket=bucket, Key="k", Body=b"v1")["VersionId"]
    enable(s3, bucket, "Suspended")
    put = s3.put_object(Bucket=bucket, Key="k", Body=b"null-1")
    assert put["VersionId"] == "null"
    assert versions(s3, bucket) == [("k", "null", True, False), ("k", v1, False, False)]
    s3.put_object(Bucket=bucket, Key="k", Body=b"null-2")  # replaces the null version, v1 stays
    assert versions(s3, bucket) == [("k", "null", True, False), ("k", v1, False, False)]
    assert s3.get_object(Bucket=bucket, Key="k", VersionId="null")["Body"].read() == b"null-2"
    # DELETE puts a null delete marker, which replaces the null version.
    deleted = s3.delete_object(Bucket=bucket, Key="k")
    assert (deleted["VersionId"], deleted["DeleteMarker"]) == ("null", True)
    assert versions(s3, bucket) == [("k", "null", True, True), ("k", v1, False, False)]
    assert error_of(lambda: s3.get_object(Bucket=bucket, Key="k", VersionId="null"))[:2] == (
        "MethodNotAllowed", 405)
    enable(s3, bucket)
    v2 = s3.put_object(Bucket=bucket, Key="k", Body=b"v2")["VersionId"]
    assert versions(s3, bucket) == [("k", v2, True, False), ("k", "null", False, True), ("k", v1, False, False)]
    s3.delete_object(Bucket=bucket, Key="k", VersionId="null")
    assert versions(s3, bucket) == [("k", v2, True, False), ("k", v1, False, False)]


# -- ListObjectVersions ---------------------------------------------------------------


def test_list_versions_pages_prefixes_and_markers(s3, bucket: str) -> None:
    enable(s3, bucket)
    expected: list[tuple[str, str, bool, bool]] = []
    for key in ("a", "d/1", "d/2", "e", "f/x/1", "g"):
        ids = [s3.put_object(Bucket=bucket, Key=key, Body=b"x")["VersionId"] for _ in range(3)]
        rows = [(key, v, False, False) for v in reversed(ids)]
        if key in ("e", "g"):
            marker = s3.delete_object(Bucket=bucket, Key=key)["VersionId"]
            rows.insert(0, (key, marker, False, True))
        rows[0] = (*rows[0][:2], True, rows[0][3])
        expected += rows
    assert versions(s3, bucket) == expected
    # Paged by every size, with both markers, the pages join up to the whole.
    for size in (1, 2, 3, 5, 7):
        seen: list[tuple[str, str]] = []
        kw: dict[str, object] = {}
        while True:
            page = s3.list_object_versions(Bucket=bucket, MaxKeys=size, **kw)
            rows = versions(s3, bucket, MaxKeys=size, **kw)
            assert len(rows) <= size
            seen += [row[:2] for row in rows]
            if not page["IsTruncated"]:
                break
            kw = {"KeyMarker": page["NextKeyMarker"], "VersionIdMarker": page["NextVersionIdMarker"]}
        assert seen == [e[:2] for e in expected], size
    # Prefix, delimiter, and common prefixes counted in max-keys.
    page = s3.list_object_versions(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["d/", "f/"]
    assert {v["Key"] for v in page["Versions"]} == {"a", "e", "g"}
    page = s3.list_object_versions(Bucket=bucket, Prefix="d/", MaxKeys=4)
    assert [(v["Key"], v["IsLatest"]) for v in page["Versions"]] == [
        ("d/1", True), ("d/1", False), ("d/1", False), ("d/2", True)]
    assert page["IsTruncated"] and page["NextKeyMarker"] == "d/2"
    page = s3.list_object_versions(Bucket=bucket, Delimiter="/", MaxKeys=4)
    assert page["IsTruncated"] and page["NextKeyMarker"] == "d/"
    rest = s3.list_object_versions(Bucket=bucket, Delimiter="/", KeyMarker="d/")
    assert [p["Prefix"] for p in rest["CommonPrefixes"]] == ["f/"]
    # A key marker alone starts after every version of that key.
    after = s3.list_object_versions(Bucket=bucket, KeyMarker="e")
    assert {v["Key"] for v in after["Versions"]} == {"f/x/1", "g"}
    code, status, _ = error_of(lambda: s3.list_object_versions(Bucket=bucket, VersionIdMarker="0" * 16))
    assert (code, status) == ("InvalidArgument", 400)
    assert s3.list_object_versions(Bucket=bucket, MaxKeys=0)["IsTruncated"] is False


# -- s3fs -----------------------------------------------------------------------------


def test_s3fs_version_aware(gateway: Gateway, s3, bucket: str) -> None:
    import s3fs

    from tests.servers import ACCESS_KEY, SECRET_KEY

    enable(s3, bucket)
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=gateway.endpoint, version_aware=True,
                           use_listings_cache=False, skip_instance_cache=True,
                           client_kwargs={"region_name": "us-east-1"})
    fs.pipe(f"{bucket}/f", b"first")
    fs.pipe(f"{bucket}/f", b"second")
    listed = fs.object_version_info(f"{bucket}/f")
    ids = [v["VersionId"] for v in listed]
    assert len(ids) == 2 and ids[0] != ids[1]
    older = min(ids)
    with fs.open(f"{bucket}/f", version_id=older) as f:
        assert f.read() == b"first"
    assert fs.cat_file(f"{bucket}/f?versionId={older}") == b"first"
    assert fs.cat(f"{bucket}/f") == b"second"
    assert fs.info(f"{bucket}/f")["VersionId"] == max(ids)
    # ls with versions: every version of every key.
    entries = fs.ls(bucket, versions=True, detail=True)
    assert sorted(e["name"] for e in entries) == sorted(f"{bucket}/f?versionId={v}" for v in ids)
    fs.rm(f"{bucket}/f")  # a delete marker: the older versions stay
    assert not fs.exists(f"{bucket}/f")
    with fs.open(f"{bucket}/f", version_id=older) as f:
        assert f.read() == b"first"


# -- versions are data: flush, compaction, crash, recover -----------------------------


def test_versions_survive_flush_compaction_crash_and_recover(tmp_path: Path) -> None:
    cap = ["--capacity", (tmp_path / "cap").as_uri(), "--segment-size", "5M"]
    gw = Gateway(tmp_path / "data", extra_args=cap).start()
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="ver")
    s3.put_object(Bucket="ver", Key="legacy", Body=b"before versioning")
    enable(s3, "ver")
    content: dict[tuple[str, str], bytes] = {("legacy", "null"): b"before versioning"}
    for i in range(30):
        key = f"small/{i % 10:02d}"
        data = blob(f"{key}-{i}", 150_000 + i)
        content[(key, s3.put_object(Bucket="ver", Key=key, Body=data)["VersionId"])] = data
    big = blob("large", 9 * MiB + 5)
    content[("large", s3.put_object(Bucket="ver", Key="large", Body=big)["VersionId"])] = big
    content[("large", s3.put_object(Bucket="ver", Key="large", Body=b"small now")["VersionId"])] = b"small now"
    markers = {s3.delete_object(Bucket="ver", Key="small/03")["VersionId"]}

    def check(where: str) -> None:
        client = make_client(gw.endpoint)
        listed = versions(client, "ver")
        assert {(k, v) for k, v, _, marker in listed if not marker} == set(content), where
        assert {v for _, v, _, marker in listed if marker} == markers, where
        for (key, version), data in content.items():
            got = client.get_object(Bucket="ver", Key=key, VersionId=version)
            assert got["Body"].read() == data, (where, key, version)
        assert error_of(lambda: client.get_object(Bucket="ver", Key="small/03"))[2]["x-amz-delete-marker"] == "true"
        latest = {k: v for k, v, is_latest, marker in listed if is_latest and not marker}
        for key, version in latest.items():
            # (An object written before versioning was enabled answers without
            # x-amz-version-id: docs/s3-compatibility.md.)
            assert client.get_object(Bucket="ver", Key=key).get("VersionId", "null") == version, where
        assert client.get_bucket_versioning(Bucket="ver")["Status"] == "Enabled", where

    check("staged")
    gw.flush()
    check("after a flush")
    # Delete most versions by id so the packed segments are sparse; the
    # survivors (noncurrent ones among them) move in the compaction.
    for (key, version) in list(content)[1:25:2]:
        s3.delete_object(Bucket="ver", Key=key, VersionId=version)
        del content[(key, version)]
    # A tag on a noncurrent version after the flush: a new manifest of it.
    noncurrent = next((k, v) for k, v, is_latest, m in versions(s3, "ver") if not is_latest and not m)
    s3.put_object_tagging(Bucket="ver", Key=noncurrent[0], VersionId=noncurrent[1],
                          Tagging={"TagSet": [{"Key": "kept", "Value": "yes"}]})
    gw.flush()
    report = gw.compact(threshold=0.99)
    assert report["rewritten"] > 0, report
    check("after compaction")
    # A crash with versions and a marker acknowledged but not flushed.
    data = b"after the flush"
    content[("small/05", s3.put_object(Bucket="ver", Key="small/05", Body=data)["VersionId"])] = data
    markers.add(s3.delete_object(Bucket="ver", Key="small/06")["VersionId"])
    # Then the node's disk is lost: every version and marker comes back from the footers.
    assert segment_files(tmp_path / "cap")
    crash_then_lose_the_disk(gw, cap[:2], check)
    try:
        client = make_client(gw.endpoint)
        tags = client.get_object_tagging(Bucket="ver", Key=noncurrent[0], VersionId=noncurrent[1])["TagSet"]
        assert tags == [{"Key": "kept", "Value": "yes"}]
        # Writes go on after a recovery with fresh version ids.
        assert client.put_object(Bucket="ver", Key="new", Body=b"n")["VersionId"] > max(
            v for _, v in content if v != "null")
    finally:
        gw.stop()
    assert_consistent(gw)
