"""The policy evaluator held to a model of IAM's rules (hypothesis).

The model is written for reading, not speed: wildcards by plain recursion
on the pattern, statements and conditions as IAM's documentation words
them (an explicit Deny wins, then an Allow, then a canned ACL's grant, else
deny; root may do everything; anonymous callers at most read and list).
Random documents over a small alphabet, so that wildcards, case and
prefixes collide often, are parsed by ``tiering.identity.policy`` and both
decide the same random requests."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.identity import builtin
from tiering.identity.policy import ANONYMOUS, ROOT, PolicyError, Principal, decide, parse

ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:ListBucket", "s3:DeleteObject", "s3:GetObjectTagging"]
ACTION_PATTERNS = [*ACTIONS, "s3:*", "*", "s3:Get*", "s3:?etObject", "S3:GETOBJECT", "s3:*Object", "s3:List*"]
ARN = "arn:aws:s3:::"
PIECES = ["b", "c", "/", "k", "a/", "*", "?", "**"]
USERS = ["alice", "bob"]
PREFIXES = ["", "a/", "a/b", "team/", "team/x", "b*"]
OPERATORS = ["StringEquals", "StringNotEquals", "StringLike", "StringNotLike", "StringEqualsIgnoreCase",
             "StringLikeIfExists", "StringNotLikeIfExists", "Null"]


# -- the model ----------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def wild(pattern: str, text: str) -> bool:
    if not pattern:
        return not text
    if pattern[0] == "*":
        return wild(pattern[1:], text) or (bool(text) and wild(pattern, text[1:]))
    if text and pattern[0] in ("?", text[0]):
        return wild(pattern[1:], text[1:])
    return False


def listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def condition_holds(operator: str, values: list[str], present: str | None) -> bool:
    if operator == "Null":
        return (present is None) == (values[0] == "true")
    if present is None:
        return "Not" in operator or operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    if base.startswith("StringEqualsIgnoreCase"):
        hit = any(v.lower() == present.lower() for v in values)
    elif "Like" in base:
        hit = any(wild(v, present) for v in values)
    else:
        hit = present in values
    return not hit if "Not" in base else hit


def statement_applies(s: dict[str, Any], who: Principal, action: str, resource: str, ctx: dict[str, str]) -> bool:
    if "Principal" in s:
        named = ["*"] if s["Principal"] == "*" else listed(s["Principal"]["AWS"])
        idents = {"*" if n == "*" else f"user:{n.rsplit('/', 1)[-1]}" for n in named}
        if "*" not in idents and (who.kind != "user" or f"user:{who.name}" not in idents):
            return False
    if "Action" in s:
        if not any(wild(p.lower(), action.lower()) for p in listed(s["Action"])):
            return False
    elif any(wild(p.lower(), action.lower()) for p in listed(s["NotAction"])):
        return False
    if "Resource" in s:
        if not any(wild(p, resource) for p in listed(s["Resource"])):
            return False
    elif any(wild(p, resource) for p in listed(s["NotResource"])):
        return False
    for operator, keys in s.get("Condition", {}).items():
        for key, values in keys.items():
            if not condition_holds(operator, listed(values), ctx.get(key.lower())):
                return False
    return True


def model(who: Principal, action: str, resource: str, ctx: dict[str, str], docs: list[dict[str, Any]],
          acl: bool) -> bool:
    if who.kind == "root":
        return True
    if who.kind == "anonymous" and action not in ("s3:GetObject", "s3:ListBucket"):
        return False
    applying = [s for doc in docs for s in listed_statements(doc) if statement_applies(s, who, action, resource, ctx)]
    if any(s["Effect"] == "Deny" for s in applying):
        return False
    if applying:
        return True
    return acl


def listed_statements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    items = doc["Statement"]
    return [items] if isinstance(items, dict) else items


# -- documents ----------------------------------------------------------------------------------

patterns = st.lists(st.sampled_from(PIECES), min_size=0, max_size=4).map("".join)
resources = st.one_of(st.just("*"), patterns.map(lambda p: ARN + "b" + p), patterns.map(lambda p: ARN + p).filter(
    lambda r: r != ARN))
conditions = st.dictionaries(
    st.sampled_from(OPERATORS),
    st.dictionaries(st.sampled_from(["s3:prefix", "S3:Prefix", "s3:delimiter"]),
                    st.lists(st.sampled_from(PREFIXES + ["a/*", "*", "team/*"]), min_size=1, max_size=3),
                    min_size=1, max_size=1),
    max_size=2,
).map(lambda block: {op: ({k: ["true"] for k in keys} if op == "Null" else keys) for op, keys in block.items()})


def one_or_many(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str | list[str]]:
    return st.one_of(strategy, st.lists(strategy, min_size=1, max_size=3))


@st.composite
def statements(draw: st.DrawFn, bucket_policy: bool) -> dict[str, Any]:
    s: dict[str, Any] = {"Effect": draw(st.sampled_from(["Allow", "Deny"]))}
    s["NotAction" if draw(st.booleans()) and draw(st.booleans()) else "Action"] = draw(
        one_or_many(st.sampled_from(ACTION_PATTERNS)))
    s["NotResource" if draw(st.booleans()) and draw(st.booleans()) else "Resource"] = draw(one_or_many(resources))
    block = draw(conditions)
    if block:
        s["Condition"] = block
    if bucket_policy:
        s["Principal"] = draw(st.one_of(
            st.just("*"),
            st.builds(lambda names: {"AWS": names}, one_or_many(st.sampled_from(
                [*USERS, "arn:aws:iam::123456789012:user/alice", "arn:aws:iam::123456789012:user/bob"])))))
    return s


def documents(bucket_policy: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda items, version: {"Version": version, "Statement": items},
                     st.lists(statements(bucket_policy), min_size=1, max_size=4), st.sampled_from(VERSION_CHOICES))


VERSION_CHOICES = ["2012-10-17", "2008-10-17"]
principals = st.sampled_from([ROOT, ANONYMOUS, Principal("user", "alice"), Principal("user", "bob")])
requests = st.tuples(
    principals, st.sampled_from(ACTIONS + ["s3:getobject"]),
    st.lists(st.sampled_from(["b", "c", "/", "k", "a/", "*"]), max_size=5).map(lambda p: ARN + "b" + "".join(p)),
    st.dictionaries(st.sampled_from(["s3:prefix", "s3:delimiter"]), st.sampled_from(PREFIXES), max_size=2),
    st.booleans(),
)


# -- properties ---------------------------------------------------------------------------------


@settings(max_examples=600, deadline=None)
@given(st.lists(documents(False), max_size=2), st.one_of(st.none(), documents(True)),
       st.lists(requests, min_size=1, max_size=8))
def test_the_evaluator_agrees_with_the_model(user_docs, bucket_doc, asked) -> None:
    docs = list(user_docs) + ([bucket_doc] if bucket_doc is not None else [])
    for who, action, resource, ctx, acl in asked:
        # A user's own policies apply to that user only: alice holds them here.
        mine = [d for d in user_docs] if who == Principal("user", "alice") else []
        theirs = [bucket_doc] if bucket_doc is not None else []
        policies = [parse(json.dumps(d)) for d in mine] + [parse(json.dumps(d), "b") for d in theirs
                                                            if _in_bucket(d)]
        expected_docs = mine + [d for d in theirs if _in_bucket(d)]
        assert decide(who, action, resource, ctx, policies, acl) == model(
            who, action, resource, ctx, expected_docs, acl), (who, action, resource, ctx, acl, docs)


def _in_bucket(doc: dict[str, Any]) -> bool:
    """Whether every resource of a bucket policy lies in bucket "b" (else it is refused)."""
    try:
        parse(json.dumps(doc), "b")
    except PolicyError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.lists(documents(False), max_size=3), requests)
def test_an_explicit_deny_wins_and_nothing_is_allowed_by_default(docs, asked) -> None:
    who, action, resource, ctx, acl = asked
    policies = [parse(json.dumps(d)) for d in docs]
    deny_all = parse(json.dumps({"Statement": {"Effect": "Deny", "Action": "*", "Resource": "*"}}))
    assert decide(who, action, resource, ctx, [*policies, deny_all], acl) == (who.kind == "root")
    assert decide(who, action, resource, ctx, [], False) == (who.kind == "root")


def test_ready_made_policies() -> None:
    alice = Principal("user", "alice")
    read_one = parse(builtin.document("read-only:data"))
    write_all = parse(builtin.document("read-write"))
    assert decide(alice, "s3:GetObject", ARN + "data/x/y", {}, [read_one])
    assert decide(alice, "s3:ListBucket", ARN + "data", {"s3:prefix": ""}, [read_one])
    assert not decide(alice, "s3:PutObject", ARN + "data/x", {}, [read_one])
    assert not decide(alice, "s3:GetObject", ARN + "database/x", {}, [read_one])
    assert not decide(alice, "s3:ListAllMyBuckets", ARN + "*", {}, [read_one])
    assert decide(alice, "s3:PutObject", ARN + "any/x", {}, [write_all])
    assert decide(alice, "s3:ListAllMyBuckets", ARN + "*", {}, [write_all])
    assert not decide(alice, "s3:DeleteBucket", ARN + "any", {}, [write_all])
    assert not decide(alice, "s3:PutBucketPolicy", ARN + "any", {}, [write_all])
    assert builtin.document("read-only:") is None and builtin.document("write:x") is None


@pytest.mark.parametrize(("document", "bucket", "message"), [
    ("", None, "first byte"),
    ("[1]", None, "first byte"),
    ("{", None, "invalid Json"),
    ('{"Statement": []}', None, "non-empty"),
    ('{"Version": "2020-01-01", "Statement": {}}', None, "version"),
    ('{"Statement": {"Effect": "Permit", "Action": "s3:*", "Resource": "*"}}', None, "Invalid effect"),
    ('{"Statement": {"Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "*"}}', None, "invalid action"),
    ('{"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:ec2:::x"}}', None, "invalid resource"),
    ('{"Statement": {"Effect": "Allow", "Action": "s3:*", "NotAction": "s3:Get*", "Resource": "*"}}', None,
     "exactly one"),
    ('{"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Principal": "*"}}', None, "no Principal"),
    ('{"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}}', "b", "Principal"),
    ('{"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::other/*", "Principal": "*"}}',
     "b", "not in bucket"),
    ('{"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Principal": {"Service": "x"}}}', "b",
     "principal"),
    ('{"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*", "NotPrincipal": "*"}}', "b",
     "NotPrincipal"),
    ('{"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*", '
     '"Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}}', None, "Unsupported condition operator"),
    ('{"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Extra": 1}}', None, "Unknown field"),
    ("{" + '"Id": "' + "x" * 30000 + '", "Statement": {}}', None, "at most"),
    ("{" + " " * 70000 + "}", None, "at most"),
])
def test_malformed_documents_say_what_is_wrong(document: str, bucket: str | None, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse(document.encode(), bucket)


def test_many_stars_do_not_backtrack_for_ever() -> None:
    """A pattern of many stars against a long resource that does not match
    is decided at once (fnmatch's linear translation)."""
    document = json.dumps({"Statement": {"Effect": "Allow", "Action": "s3:GetObject",
                                         "Resource": "arn:aws:s3:::b/" + "a*" * 40 + "b"}})
    assert not decide(Principal("user", "alice"), "s3:GetObject", "arn:aws:s3:::b/" + "a" * 1000, {},
                      [parse(document)])
