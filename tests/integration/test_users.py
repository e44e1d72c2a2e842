"""Users, keys, policies, bucket policies and canned ACLs through a real
gateway, with boto3, s3fs, presigned URLs and GetBatch (docs/users-and-policies.md).

One gateway for the module; each test makes its own users and buckets. A
change made through the admin API is served by the node that made it
before the API answers, so "refused from the next request on" is checked
on that next request; the read workers' copy is polled with a 1 s bound."""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from botocore import UNSIGNED
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from gateway.client.batch import BatchClient, BatchError, RequestFailed
from tests.conftest import assert_consistent, make_client
from tests.servers import ADMIN_TOKEN, Gateway

READ_WRITE_ACTIONS = ("put_object", "delete_object", "copy_object", "create_multipart_upload",
                      "put_object_tagging", "put_bucket_policy", "put_bucket_acl", "delete_bucket")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path_factory.mktemp("users") / "data").start()
    try:
        yield gateway
    finally:
        gateway.stop()
    assert_consistent(gateway)


def user_client(gw: Gateway, key: dict[str, str], **config: object):
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=key["access_key"],
                        aws_secret_access_key=key["secret_key"], region_name="us-east-1",
                        config=BotoConfig(retries={"max_attempts": 1}, **config))  # type: ignore[arg-type]


def anonymous(gw: Gateway):
    return boto3.client("s3", endpoint_url=gw.endpoint, region_name="us-east-1",
                        config=BotoConfig(signature_version=UNSIGNED, retries={"max_attempts": 1}))


def new_user(gw: Gateway, name: str, *policies: str) -> dict[str, str]:
    created = gw.admin("POST", "/users", json={"name": name, "policies": list(policies)}).json()
    assert created["user"]["policies"] == list(policies)
    return created["key"]


def code_of(call, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ClientError) as err:
        call(*args, **kwargs)
    return err.value.response["Error"]["Code"]


def denied(call, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
    assert code_of(call, *args, **kwargs) == "AccessDenied"


def fill(root, bucket: str, keys: list[str]) -> None:  # type: ignore[no-untyped-def]
    root.create_bucket(Bucket=bucket)
    for key in keys:
        root.put_object(Bucket=bucket, Key=key, Body=f"body of {key}".encode())


def test_a_read_only_user_of_one_bucket_reads_it_and_nothing_else(gw: Gateway) -> None:
    root = make_client(gw.endpoint)
    fill(root, "ro-data", ["a/1", "a/2", "b/3"])
    fill(root, "ro-other", ["x"])
    key = new_user(gw, "reader", "read-only:ro-data")
    s3 = user_client(gw, key)

    assert s3.get_object(Bucket="ro-data", Key="a/1")["Body"].read() == b"body of a/1"
    assert s3.head_object(Bucket="ro-data", Key="b/3")["ContentLength"] == len(b"body of b/3")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="ro-data")["Contents"]] == ["a/1", "a/2", "b/3"]
    assert [o["Key"] for o in s3.list_objects(Bucket="ro-data", Prefix="a/")["Contents"]] == ["a/1", "a/2"]
    s3.head_bucket(Bucket="ro-data")

    # Every write, the other bucket, bucket administration: AccessDenied.
    denied(s3.put_object, Bucket="ro-data", Key="new", Body=b"x")
    denied(s3.delete_object, Bucket="ro-data", Key="a/1")
    denied(s3.copy_object, Bucket="ro-data", Key="copy", CopySource={"Bucket": "ro-data", "Key": "a/1"})
    denied(s3.create_multipart_upload, Bucket="ro-data", Key="mp")
    denied(s3.put_object_tagging, Bucket="ro-data", Key="a/1", Tagging={"TagSet": []})
    denied(s3.put_bucket_policy, Bucket="ro-data", Policy=json.dumps({"Statement": []}))
    denied(s3.put_bucket_acl, Bucket="ro-data", ACL="public-read")
    denied(s3.put_bucket_versioning, Bucket="ro-data", VersioningConfiguration={"Status": "Enabled"})
    denied(s3.delete_bucket, Bucket="ro-data")
    denied(s3.create_bucket, Bucket="ro-new")
    denied(s3.list_buckets)
    denied(s3.get_object, Bucket="ro-other", Key="x")
    denied(s3.list_objects_v2, Bucket="ro-other")
    denied(s3.put_object, Bucket="ro-other", Key="y", Body=b"y")
    denied(s3.delete_objects, Bucket="ro-data", Delete={"Objects": [{"Key": "a/1"}]})  # every key refused
    assert [o["Key"] for o in root.list_objects_v2(Bucket="ro-data")["Contents"]] == ["a/1", "a/2", "b/3"]

    # GetBatch: each member is a read; another bucket's members are refused.
    with BatchClient(gw.endpoint, key["access_key"], key["secret_key"]) as batches:
        assert dict(batches.get_batch("ro-data", ["a/1", "b/3"])) == {"a/1": b"body of a/1", "b/3": b"body of b/3"}
        with pytest.raises(RequestFailed) as refused:
            list(batches.get_batch("ro-other", ["x"]))
        assert refused.value.code == "AccessDenied"
        root.put_object(Bucket="ro-data", Key="manifest", Body=b"a/2\nb/3\n")
        url = batches.presign_batch("ro-data", "manifest")
        assert dict(batches.read_url(url)) == {"a/2": b"body of a/2", "b/3": b"body of b/3"}

    # Presigned URLs carry the signer's permissions.
    get = s3.generate_presigned_url("get_object", Params={"Bucket": "ro-data", "Key": "a/2"})
    assert httpx.get(get).content == b"body of a/2"
    put = s3.generate_presigned_url("put_object", Params={"Bucket": "ro-data", "Key": "p"})
    assert httpx.put(put, content=b"no").status_code == 403
    other = s3.generate_presigned_url("get_object", Params={"Bucket": "ro-other", "Key": "x"})
    answer = httpx.get(other)
    assert answer.status_code == 403 and b"<Code>AccessDenied</Code>" in answer.content

    # The admin API stays behind its token: a user's keys are no admin credential.
    for token in (key["secret_key"], key["access_key"]):
        assert httpx.get(f"{gw.admin_url}/users", headers={"Authorization": f"Bearer {token}"}).status_code == 401


def test_s3fs_sees_what_the_policy_allows(gw: Gateway) -> None:
    import s3fs

    root = make_client(gw.endpoint)
    fill(root, "fs-data", ["train/0", "train/1"])
    key = new_user(gw, "fs-reader", "read-only:fs-data")
    fs = s3fs.S3FileSystem(key=key["access_key"], secret=key["secret_key"], endpoint_url=gw.endpoint,
                           use_listings_cache=False, skip_instance_cache=True,
                           client_kwargs={"region_name": "us-east-1"})
    assert sorted(fs.ls("fs-data/train")) == ["fs-data/train/0", "fs-data/train/1"]
    assert fs.cat("fs-data/train/1") == b"body of train/1"
    with pytest.raises(PermissionError):
        fs.pipe("fs-data/train/2", b"x")
    with pytest.raises(PermissionError):
        fs.rm("fs-data/train/0")
    assert fs.exists("fs-data/train/0")


def test_a_prefix_scoped_user_lists_and_reads_its_prefix_only(gw: Gateway) -> None:
    root = make_client(gw.endpoint)
    fill(root, "teams", ["team-a/1", "team-a/2", "team-b/1"])
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::teams",
         "Condition": {"StringLike": {"s3:prefix": ["team-a/", "team-a/*"]}}},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"], "Resource": "arn:aws:s3:::teams/team-a/*"},
    ]}
    gw.admin("PUT", "/policies/team-a", json=policy)
    key = new_user(gw, "team-a-job", "team-a")
    s3 = user_client(gw, key)

    assert [o["Key"] for o in s3.list_objects_v2(Bucket="teams", Prefix="team-a/")["Contents"]] == [
        "team-a/1", "team-a/2"]
    denied(s3.list_objects_v2, Bucket="teams")
    denied(s3.list_objects_v2, Bucket="teams", Prefix="team-b/")
    denied(s3.list_objects, Bucket="teams", Prefix="team")
    s3.put_object(Bucket="teams", Key="team-a/3", Body=b"3")
    assert s3.get_object(Bucket="teams", Key="team-a/3")["Body"].read() == b"3"
    denied(s3.get_object, Bucket="teams", Key="team-b/1")
    denied(s3.put_object, Bucket="teams", Key="team-b/2", Body=b"2")
    # A copy needs read permission on its source.
    denied(s3.copy_object, Bucket="teams", Key="team-a/stolen", CopySource={"Bucket": "teams", "Key": "team-b/1"})
    s3.copy_object(Bucket="teams", Key="team-a/4", CopySource={"Bucket": "teams", "Key": "team-a/1"})
    # Multipart parts are writes of the key.
    upload = s3.create_multipart_upload(Bucket="teams", Key="team-a/big")["UploadId"]
    etag = s3.upload_part(Bucket="teams", Key="team-a/big", UploadId=upload, PartNumber=1, Body=b"p")["ETag"]
    s3.complete_multipart_upload(Bucket="teams", Key="team-a/big", UploadId=upload,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    denied(s3.create_multipart_upload, Bucket="teams", Key="team-b/big")
    # A batch across prefixes: the other team's member is refused, the rest is sent.
    with BatchClient(gw.endpoint, key["access_key"], key["secret_key"]) as batches:
        members = dict(batches.get_batch("teams", ["team-a/1", "team-b/1"]))
    assert members["team-a/1"] == b"body of team-a/1"
    assert isinstance(members["team-b/1"], BatchError) and members["team-b/1"].code == "AccessDenied"
    assert gw.admin("GET", "/policies/team-a").json()["users"] == ["team-a-job"]


def test_an_explicit_deny_beats_an_allow(gw: Gateway) -> None:
    root = make_client(gw.endpoint)
    fill(root, "deny-data", ["open/1", "secret/1"])
    gw.admin("PUT", "/policies/no-secrets", json={"Statement": [
        {"Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::deny-data/secret/*"}]})
    s3 = user_client(gw, new_user(gw, "denied-user", "read-write:deny-data", "no-secrets"))
    assert s3.get_object(Bucket="deny-data", Key="open/1")["Body"].read() == b"body of open/1"
    s3.put_object(Bucket="deny-data", Key="open/2", Body=b"2")
    denied(s3.get_object, Bucket="deny-data", Key="secret/1")
    denied(s3.delete_object, Bucket="deny-data", Key="secret/1")
    # A bucket policy's Deny holds against a user's Allow too.
    root.put_bucket_policy(Bucket="deny-data", Policy=json.dumps({"Statement": [
        {"Effect": "Deny", "Principal": {"AWS": "arn:aws:iam::000000000000:user/denied-user"},
         "Action": "s3:PutObject", "Resource": "arn:aws:s3:::deny-data/*"}]}))
    denied(s3.put_object, Bucket="deny-data", Key="open/3", Body=b"3")
    root.delete_bucket_policy(Bucket="deny-data")
    s3.put_object(Bucket="deny-data", Key="open/3", Body=b"3")
    # A user with no policy can do nothing.
    nobody = user_client(gw, new_user(gw, "nobody"))
    denied(nobody.get_object, Bucket="deny-data", Key="open/1")
    denied(nobody.list_objects_v2, Bucket="deny-data")
    # Root may do everything, whatever the policies say.
    assert root.get_object(Bucket="deny-data", Key="secret/1")["Body"].read() == b"body of secret/1"


def test_disabling_a_user_or_revoking_a_key_refuses_the_next_request(gw: Gateway) -> None:
    root = make_client(gw.endpoint)
    fill(root, "live-data", ["k"])
    first = new_user(gw, "live-user", "read-only:live-data")
    second = gw.admin("POST", "/users/live-user/keys").json()
    one, two = user_client(gw, first), user_client(gw, second)
    for client in (one, two):
        assert client.get_object(Bucket="live-data", Key="k")["Body"].read() == b"body of k"

    gw.admin("PATCH", "/users/live-user", json={"enabled": False})
    denied(one.get_object, Bucket="live-data", Key="k")
    denied(two.get_object, Bucket="live-data", Key="k")
    gw.admin("PATCH", "/users/live-user", json={"enabled": True})
    assert one.get_object(Bucket="live-data", Key="k")["Body"].read() == b"body of k"

    gw.admin("DELETE", f"/users/live-user/keys/{first['access_key']}")
    assert code_of(one.get_object, Bucket="live-data", Key="k") == "InvalidAccessKeyId"
    assert two.get_object(Bucket="live-data", Key="k")["Body"].read() == b"body of k"

    rotated = gw.admin("POST", f"/users/live-user/keys/{second['access_key']}/rotate").json()
    assert code_of(two.get_object, Bucket="live-data", Key="k") == "InvalidAccessKeyId"
    assert user_client(gw, rotated).get_object(Bucket="live-data", Key="k")["Body"].read() == b"body of k"
    listed = gw.admin("GET", "/users/live-user").json()
    assert [k["access_key"] for k in listed["keys"]] == [rotated["access_key"]]
    assert "secret_key" not in json.dumps(gw.admin("GET", "/users").json())

    gw.admin("DELETE", "/users/live-user")
    assert code_of(user_client(gw, rotated).get_object, Bucket="live-data", Key="k") == "InvalidAccessKeyId"


def test_a_public_read_bucket_answers_anonymous_reads_and_nothing_else(gw: Gateway) -> None:
    root = make_client(gw.endpoint)
    root.create_bucket(Bucket="public-acl", ACL="public-read")
    root.put_object(Bucket="public-acl", Key="open", Body=b"open", ACL="public-read")
    root.put_object(Bucket="public-acl", Key="closed", Body=b"closed")
    anon = anonymous(gw)
    assert [o["Key"] for o in anon.list_objects_v2(Bucket="public-acl")["Contents"]] == ["closed", "open"]
    assert anon.get_object(Bucket="public-acl", Key="open")["Body"].read() == b"open"
    assert anon.head_object(Bucket="public-acl", Key="open")["ContentLength"] == 4
    denied(anon.get_object, Bucket="public-acl", Key="closed")
    for call, kwargs in (
        (anon.put_object, {"Bucket": "public-acl", "Key": "new", "Body": b"x"}),
        (anon.delete_object, {"Bucket": "public-acl", "Key": "open"}),
        (anon.put_bucket_acl, {"Bucket": "public-acl", "ACL": "private"}),
        (anon.get_bucket_acl, {"Bucket": "public-acl"}),
        (anon.get_bucket_versioning, {"Bucket": "public-acl"}),
        (anon.create_multipart_upload, {"Bucket": "public-acl", "Key": "mp"}),
        (anon.list_buckets, {}),
    ):
        denied(call, **kwargs)
    grants = root.get_object_acl(Bucket="public-acl", Key="open")["Grants"]
    assert {"Type": "Group", "URI": "http://acs.amazonaws.com/groups/global/AllUsers"} in [g["Grantee"] for g in grants]
    assert [g["Permission"] for g in root.get_object_acl(Bucket="public-acl", Key="closed")["Grants"]] == [
        "FULL_CONTROL"]
    assert len(root.get_bucket_acl(Bucket="public-acl")["Grants"]) == 2
    # An overwrite without an ACL is private again, as in S3.
    root.put_object(Bucket="public-acl", Key="open", Body=b"again")
    denied(anon.get_object, Bucket="public-acl", Key="open")
    root.put_object_acl(Bucket="public-acl", Key="open", ACL="public-read")
    assert anon.get_object(Bucket="public-acl", Key="open")["Body"].read() == b"again"
    root.put_bucket_acl(Bucket="public-acl", ACL="private")
    denied(anon.list_objects_v2, Bucket="public-acl")

    # A bucket policy with Principal "*": a public data set.
    fill(root, "public-policy", ["d/1", "d/2"])
    root.put_bucket_policy(Bucket="public-policy", Policy=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:ListBucket"],
         "Resource": ["arn:aws:s3:::public-policy", "arn:aws:s3:::public-policy/*"]}]}))
    assert json.loads(root.get_bucket_policy(Bucket="public-policy")["Policy"])["Statement"][0]["Principal"] == "*"
    assert anon.get_object(Bucket="public-policy", Key="d/1")["Body"].read() == b"body of d/1"
    assert len(anon.list_objects_v2(Bucket="public-policy")["Contents"]) == 2
    assert httpx.get(f"{gw.endpoint}/public-policy/d/2").content == b"body of d/2"
    denied(anon.put_object, Bucket="public-policy", Key="d/3", Body=b"3")
    denied(anon.delete_object, Bucket="public-policy", Key="d/1")
    denied(anon.get_bucket_policy, Bucket="public-policy")
    answer = httpx.post(f"{gw.endpoint}/public-policy?batch", json={"keys": ["d/1"]})
    assert answer.status_code == 200
    # Anything else anonymous is still refused, as before.
    assert httpx.get(f"{gw.endpoint}/ro-data/a/1").status_code == 403
    root.delete_bucket_policy(Bucket="public-policy")
    denied(anon.get_object, Bucket="public-policy", Key="d/1")
    assert code_of(root.get_bucket_policy, Bucket="public-policy") == "NoSuchBucketPolicy"


def test_a_bucket_policy_names_users(gw: Gateway) -> None:
    root = make_client(gw.endpoint)
    fill(root, "shared-data", ["k"])
    carol = user_client(gw, new_user(gw, "carol"))
    denied(carol.get_object, Bucket="shared-data", Key="k")
    root.put_bucket_policy(Bucket="shared-data", Policy=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": {"AWS": ["arn:aws:iam::000000000000:user/carol"]},
         "Action": "s3:GetObject", "Resource": "arn:aws:s3:::shared-data/*"}]}))
    assert carol.get_object(Bucket="shared-data", Key="k")["Body"].read() == b"body of k"
    denied(carol.put_object, Bucket="shared-data", Key="k", Body=b"x")
    # Deleting the bucket deletes its policy (a new bucket of that name has none).
    root.delete_object(Bucket="shared-data", Key="k")
    root.delete_bucket(Bucket="shared-data")
    root.create_bucket(Bucket="shared-data")
    assert code_of(root.get_bucket_policy, Bucket="shared-data") == "NoSuchBucketPolicy"


@pytest.mark.parametrize("policy", [
    b"not json", b"[]", b'{"Statement": []}', b'{"Version": "1999-01-01", "Statement": {}}',
    b'{"Statement": {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::elsewhere/*",'
    b' "Principal": "*"}}',
    b'{"Statement": {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}}',
    b'{"Statement": {"Effect": "Allow", "Action": "iam:*", "Resource": "*", "Principal": "*"}}',
    b"\xff\xfe", b'{"Statement": {"Sid": "\\ud800", "Effect": "Allow", "Action": "s3:*", "Resource": "*",'
    b' "Principal": "*"}}',
])
def test_a_malformed_bucket_policy_is_malformed_policy(gw: Gateway, policy: bytes) -> None:
    root = make_client(gw.endpoint)
    root.create_bucket(Bucket="malformed")
    assert code_of(root.put_bucket_policy, Bucket="malformed", Policy=policy.decode("latin-1")) == "MalformedPolicy"


def test_admin_routes_refuse_what_they_cannot_do(gw: Gateway) -> None:
    def error(method: str, path: str, **kwargs: object) -> tuple[int, str]:
        answer = httpx.request(method, gw.admin_url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                               **kwargs)  # type: ignore[arg-type]
        return answer.status_code, answer.json()["error"]["code"]

    new_user(gw, "dup")
    assert error("POST", "/users", json={"name": "dup"}) == (409, "UserAlreadyExists")
    assert error("POST", "/users", json={"name": "bad name"}) == (400, "InvalidRequest")
    assert error("POST", "/users", json={"name": "x", "policies": ["no-such"]}) == (404, "NoSuchPolicy")
    assert error("GET", "/users/ghost") == (404, "NoSuchUser")
    assert error("DELETE", "/users/dup/keys/AKNONE") == (404, "NoSuchAccessKey")
    assert error("PUT", "/policies/read-only", json={"Statement": []}) == (400, "InvalidRequest")
    assert error("PUT", "/policies/bad", json={"Statement": [{"Effect": "Allow"}]}) == (400, "MalformedPolicy")
    gw.admin("PUT", "/policies/used", json={"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}})
    gw.admin("PUT", "/users/dup/policies/used")
    assert error("DELETE", "/policies/used") == (409, "PolicyInUse")
    gw.admin("DELETE", "/users/dup/policies/used")
    gw.admin("DELETE", "/policies/used")
    assert error("GET", "/policies/used") == (404, "NoSuchPolicy")
    assert gw.admin("GET", "/policies/read-only:some-bucket").json()["builtin"] is True


def test_the_log_and_metrics_name_the_user_and_secrets_stay_sealed(gw: Gateway) -> None:
    root = make_client(gw.endpoint)
    fill(root, "named", ["k"])
    key = new_user(gw, "named-user", "read-only:named")
    s3 = user_client(gw, key)
    s3.get_object(Bucket="named", Key="k")
    denied(s3.put_object, Bucket="named", Key="k", Body=b"x")

    def logged() -> None:
        lines = [line for line in gw.log().splitlines() if "user=named-user" in line]
        assert any("op=GetObject" in line and "status=200" in line for line in lines)
        assert any("op=PutObject" in line and "status=403" in line for line in lines)

    _eventually(logged, 10.0)  # the access log is written in batches
    metrics = gw.admin("GET", "/metrics").text
    assert 'tierstore_s3_user_requests_total{code="403",user="named-user"} 1.0' in metrics
    assert 'tierstore_s3_user_requests_total{code="200",user="named-user"}' in metrics

    # At rest: the document holds the secret sealed; the key file is the owner's only.
    stored = (gw.data_dir / "capacity" / "identity" / "state").read_bytes()
    assert key["access_key"].encode() in stored and key["secret_key"].encode() not in stored
    key_file = gw.data_dir / "secrets.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key["secret_key"] not in gw.log()
    assert key["secret_key"] not in json.dumps(gw.admin("GET", "/config").json())


def _eventually(check, bound: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + bound
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_cli_manages_users(gw: Gateway, tmp_path: Path) -> None:
    import subprocess
    import sys

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "gateway", *args, "--admin-url", gw.admin_url,
                               "--token", ADMIN_TOKEN], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    make_client(gw.endpoint).create_bucket(Bucket="cli-data")
    created = json.loads(cli("users", "create", "cli-user", "--policy", "read-only:cli-data", "--json"))
    key = created["key"]
    assert user_client(gw, key).list_objects_v2(Bucket="cli-data")["KeyCount"] == 0
    assert "cli-user" in cli("users")
    policy = tmp_path / "p.json"
    policy.write_text(json.dumps({"Statement": {"Effect": "Allow", "Action": "s3:PutObject",
                                                "Resource": "arn:aws:s3:::cli-data/*"}}))
    cli("policies", "put", "cli-writes", str(policy))
    cli("users", "attach", "cli-user", "cli-writes")
    user_client(gw, key).put_object(Bucket="cli-data", Key="k", Body=b"k")
    new = json.loads(cli("users", "rotate-key", "cli-user", key["access_key"], "--json"))
    assert code_of(user_client(gw, key).list_objects_v2, Bucket="cli-data") == "InvalidAccessKeyId"
    assert user_client(gw, new).list_objects_v2(Bucket="cli-data")["KeyCount"] == 1
    cli("users", "disable", "cli-user")
    denied(user_client(gw, new).list_objects_v2, Bucket="cli-data")
    cli("users", "delete", "cli-user")
    cli("policies", "delete", "cli-writes")
