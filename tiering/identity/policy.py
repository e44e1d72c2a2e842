"""IAM-style policy documents: parsed once, evaluated without I/O.

A document is JSON: ``{"Version": ..., "Statement": [...]}``. A statement
has an ``Effect`` (``Allow`` or ``Deny``), ``Action`` or ``NotAction``
(``s3:GetObject``, ``s3:Get*``, ``s3:*``, ``*``), ``Resource`` or
``NotResource`` (``arn:aws:s3:::bucket``, ``arn:aws:s3:::bucket/prefix*``,
``*``), optionally a ``Condition`` block and a ``Sid``; a bucket policy's
statements also name their ``Principal``. What this gateway cannot honour
exactly (another service's actions, a condition operator it does not
implement, ``NotPrincipal``) is refused as malformed rather than read
loosely: a restriction silently dropped would grant more than was written.

Evaluation follows IAM's rules for one account (the IAM User Guide's
"policy evaluation logic"): root may do everything; otherwise an explicit
Deny in any policy that applies wins, then an Allow from any of them (the
user's own policies, or the bucket's policy where its Principal names the
caller), then a grant of a canned ACL, else the request is denied. Wildcards
are ``*`` (any run of characters, ``/`` included) and ``?`` (one
character); actions match without regard to case, resources with it.

Conditions: ``StringEquals``, ``StringNotEquals``, ``StringEqualsIgnoreCase``,
``StringNotEqualsIgnoreCase``, ``StringLike``, ``StringNotLike``, each also
with ``IfExists``, and ``Null``. A condition key absent from the request
fails a positive operator and satisfies a negated one, as in IAM; the keys
the gateway supplies are listed in docs/users-and-policies.md (``s3:prefix``
on listings above all).
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ARN = "arn:aws:s3:::"
VERSIONS = ("2012-10-17", "2008-10-17")
# S3 refuses a bucket policy above 20 KB once its whitespace is taken out;
# user policies are held to the same. Text of more than MAX_TEXT bytes is
# refused before it is parsed.
MAX_DOCUMENT = 20 * 1024
MAX_TEXT = 64 * 1024
_ACTION = re.compile(r"(\*|[sS]3:[A-Za-z*?]+)")
_USER_ARN = re.compile(r"arn:aws:iam::[0-9*]*:user/(.+)")
_ROOT_ARN = re.compile(r"arn:aws:iam::[0-9*]*:root")
_OPERATORS = ("StringEquals", "StringNotEquals", "StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase",
              "StringLike", "StringNotLike", "Null")
_STATEMENT_FIELDS = frozenset({"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource",
                               "Principal", "Condition"})

ANYONE = "*"  # a bucket policy's Principal "*": every caller, anonymous ones included


class PolicyError(ValueError):
    """A document that is not a policy this gateway reads (S3: MalformedPolicy)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who asks: ``root`` (the configured key pairs), a ``user`` by name, or
    ``anonymous`` (an unsigned request)."""

    kind: str
    name: str = ""

    @property
    def label(self) -> str:
        """How logs and metrics name it."""
        return self.name if self.kind == "user" else self.kind

    @property
    def ident(self) -> str:
        """What a bucket policy's Principal is matched against."""
        return f"user:{self.name}" if self.kind == "user" else self.kind


ROOT = Principal("root")
ANONYMOUS = Principal("anonymous")


def glob(pattern: str, flags: int = 0) -> re.Pattern[str]:
    """An IAM wildcard pattern as a regular expression to ``fullmatch``.

    ``fnmatch.translate`` emits the linear form of ``*`` (no catastrophic
    backtracking on a pattern of many stars); ``[`` is made literal, as IAM
    has no character classes."""
    return re.compile(fnmatch.translate(pattern.replace("[", "[[]")), flags)


@dataclass(frozen=True, slots=True)
class _Match:
    """A list of wildcard patterns, any of which may match."""

    patterns: tuple[re.Pattern[str], ...]
    exact: frozenset[str]  # patterns without wildcards: a set lookup
    lower: bool  # match case-insensitively (actions)

    def __call__(self, value: str) -> bool:
        if self.lower:
            value = value.lower()
        return value in self.exact or any(p.match(value) for p in self.patterns)


def _matcher(values: tuple[str, ...], lower: bool) -> _Match:
    if lower:
        values = tuple(v.lower() for v in values)
    exact = frozenset(v for v in values if "*" not in v and "?" not in v)
    return _Match(tuple(glob(v, re.DOTALL) for v in values if v not in exact), exact, lower)


@dataclass(frozen=True, slots=True)
class Condition:
    """One key of one operator of a Condition block."""

    operator: str  # as written, e.g. "StringLikeIfExists"
    key: str  # lower case: condition keys are not case-sensitive
    values: tuple[str, ...]
    likes: tuple[re.Pattern[str], ...] = ()  # the values as patterns, for StringLike and StringNotLike

    def holds(self, context: Mapping[str, str]) -> bool:
        base = self.operator.removesuffix("IfExists")
        value = context.get(self.key)
        if base == "Null":
            return (value is None) == (self.values[0] == "true")
        negated = "Not" in base
        if value is None:
            return negated or self.operator.endswith("IfExists")
        if base.endswith("IgnoreCase"):
            value = value.lower()
            found = value in (v.lower() for v in self.values)
        elif base.endswith("Like"):
            found = any(p.match(value) for p in self.likes)
        else:
            found = value in self.values
        return found != negated


@dataclass(frozen=True, slots=True)
class Statement:
    allow: bool
    actions: _Match
    not_action: bool
    resources: _Match
    not_resource: bool
    principals: frozenset[str] | None  # None: a user's policy, it applies to its user
    conditions: tuple[Condition, ...]

    def applies(self, who: str, action: str, resource: str, context: Mapping[str, str]) -> bool:
        if self.principals is not None and ANYONE not in self.principals and who not in self.principals:
            return False
        if self.actions(action) == self.not_action:
            return False
        if self.resources(resource) == self.not_resource:
            return False
        return all(c.holds(context) for c in self.conditions)


@dataclass(frozen=True, slots=True)
class Policy:
    """A parsed document; ``text`` is the JSON as it was given."""

    statements: tuple[Statement, ...]
    text: str

    @property
    def public(self) -> bool:
        """Whether some statement allows anyone, anonymous callers included."""
        return any(s.allow and s.principals is not None and ANYONE in s.principals for s in self.statements)


# -- parsing -------------------------------------------------------------------------------


def parse(document: str | bytes, bucket: str | None = None) -> Policy:
    """A policy document; PolicyError saying what is wrong.

    ``bucket``: a bucket policy of that bucket (statements need a Principal,
    resources must lie in the bucket); None: a policy attached to users
    (no Principal)."""
    too_large = f"Policies must be at most {MAX_DOCUMENT} bytes without their whitespace"
    if isinstance(document, bytes | bytearray):
        if len(document) > MAX_TEXT:
            raise PolicyError(too_large)
        try:
            document = bytes(document).decode("utf-8")
        except UnicodeDecodeError:
            raise PolicyError("Policies must be valid JSON (UTF-8 text)") from None
    if len(document) > MAX_TEXT:
        raise PolicyError(too_large)
    if not document.lstrip().startswith("{"):
        raise PolicyError("Policies must be valid JSON and the first byte must be '{'")
    try:
        plain = json.loads(document)
        # JSON can spell text no UTF-8 can hold (a lone surrogate, "\ud800"):
        # such a document could not be shown or logged again.
        compact = json.dumps(plain, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        raise PolicyError("This policy contains invalid Json") from None
    if len(compact) > MAX_DOCUMENT:
        raise PolicyError(too_large)
    return Policy(statements_of(plain, bucket), document)


def statements_of(plain: Any, bucket: str | None = None) -> tuple[Statement, ...]:
    """The statements of a decoded document (see :func:`parse`)."""
    if not isinstance(plain, dict):
        raise PolicyError("Policies must be valid JSON and the first byte must be '{'")
    unknown = sorted(set(plain) - {"Version", "Id", "Statement"})
    if unknown:
        raise PolicyError(f"Unknown field {unknown[0]}")
    if "Version" in plain and plain["Version"] not in VERSIONS:
        raise PolicyError(f"The policy must contain a valid version string ({' or '.join(VERSIONS)})")
    if "Id" in plain and not isinstance(plain["Id"], str):
        raise PolicyError("Id must be a string")
    if "Statement" not in plain:
        raise PolicyError("Missing required field Statement")
    items = plain["Statement"]
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or not items:
        raise PolicyError("Statement must be an object or a non-empty array of objects")
    return tuple(_statement(item, bucket) for item in items)


def _strings(item: dict[str, Any], name: str) -> tuple[str, ...]:
    value = item[name]
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        raise PolicyError(f"{name} must be a non-empty string or array of non-empty strings")
    return tuple(values)


def _one_of(item: dict[str, Any], name: str) -> tuple[tuple[str, ...], bool]:
    """(values, negated) of ``Name`` or ``NotName``: exactly one of them."""
    has, has_not = name in item, f"Not{name}" in item
    if has == has_not:
        raise PolicyError(f"Statement must contain exactly one of {name} and Not{name}")
    return _strings(item, name if has else f"Not{name}"), has_not


def _statement(item: Any, bucket: str | None) -> Statement:
    if not isinstance(item, dict):
        raise PolicyError("Each Statement must be an object")
    unknown = sorted(set(item) - _STATEMENT_FIELDS - {"NotPrincipal"})
    if unknown:
        raise PolicyError(f"Unknown field {unknown[0]}")
    if "NotPrincipal" in item:
        raise PolicyError("NotPrincipal is not supported by this gateway")
    if "Sid" in item and not isinstance(item["Sid"], str):
        raise PolicyError("Sid must be a string")
    effect = item.get("Effect")
    if effect not in ("Allow", "Deny"):
        raise PolicyError(f"Invalid effect: {effect}" if isinstance(effect, str) else "Missing required field Effect")
    actions, not_action = _one_of(item, "Action")
    for action in actions:
        if not _ACTION.fullmatch(action):
            raise PolicyError(f"Policy has invalid action: {action}")
    resources, not_resource = _one_of(item, "Resource")
    for resource in resources:
        _check_resource(resource, bucket)
    return Statement(
        allow=effect == "Allow",
        actions=_matcher(actions, lower=True), not_action=not_action,
        resources=_matcher(resources, lower=False), not_resource=not_resource,
        principals=_principals(item, bucket),
        conditions=_conditions(item.get("Condition")),
    )


def _check_resource(resource: str, bucket: str | None) -> None:
    if resource == "*":
        return
    if not resource.startswith(ARN) or resource == ARN:
        raise PolicyError(f"Policy has invalid resource: {resource}")
    if bucket is not None:
        # A bucket's policy speaks of that bucket only (S3: "Policy has
        # invalid resource"); a pattern may still cover it by a wildcard.
        named = resource[len(ARN):]
        if not (glob(named.partition("/")[0]).match(bucket) if "/" in named else glob(named).match(bucket)):
            raise PolicyError(f"Policy has invalid resource: {resource} is not in bucket {bucket}")


def _principals(item: dict[str, Any], bucket: str | None) -> frozenset[str] | None:
    if bucket is None:
        if "Principal" in item:
            raise PolicyError("A policy attached to a user has no Principal")
        return None
    if "Principal" not in item:
        raise PolicyError("Missing required field Principal")
    value = item["Principal"]
    if value == ANYONE:
        return frozenset({ANYONE})
    if not isinstance(value, dict) or set(value) != {"AWS"}:
        raise PolicyError("Invalid principal in policy: only \"*\" and {\"AWS\": [...]} are supported")
    names = value["AWS"]
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise PolicyError("Invalid principal in policy")
    out = set()
    for name in names:
        if name == ANYONE:
            out.add(ANYONE)
        elif _ROOT_ARN.fullmatch(name):
            out.add(ROOT.ident)
        elif (user := _USER_ARN.fullmatch(name)) is not None:
            out.add(f"user:{user[1]}")
        elif not name.startswith("arn:"):
            out.add(f"user:{name}")  # a bare user name
        else:
            raise PolicyError(f"Invalid principal in policy: {name}")
    return frozenset(out)


def _conditions(block: Any) -> tuple[Condition, ...]:
    if block is None:
        return ()
    if not isinstance(block, dict):
        raise PolicyError("Condition must be an object")
    out = []
    for operator, keys in block.items():
        if operator.removesuffix("IfExists") not in _OPERATORS or operator == "NullIfExists":
            raise PolicyError(f"Unsupported condition operator: {operator}")
        if not isinstance(keys, dict) or not keys:
            raise PolicyError(f"Condition {operator} must map condition keys to values")
        for key, value in keys.items():
            values = [value] if isinstance(value, str | bool) else value
            if not isinstance(values, list) or not values or not all(isinstance(v, str | bool) for v in values):
                raise PolicyError(f"Condition {operator} {key}: expected a string or an array of strings")
            texts = tuple(str(v).lower() if isinstance(v, bool) else v for v in values)
            if operator == "Null" and texts not in (("true",), ("false",)):
                raise PolicyError(f"Condition Null {key}: expected \"true\" or \"false\"")
            likes = tuple(glob(v, re.DOTALL) for v in texts) if "Like" in operator else ()
            out.append(Condition(operator, key.lower(), texts, likes))
    return tuple(out)


# -- evaluation ------------------------------------------------------------------------------


def effect(who: Principal, action: str, resource: str, context: Mapping[str, str],
           policies: Iterable[Policy]) -> str | None:
    """``"Deny"`` if a statement that applies denies, else ``"Allow"`` if
    one allows, else None (no statement applies)."""
    allowed = False
    ident = who.ident
    for policy in policies:
        for statement in policy.statements:
            if statement.applies(ident, action, resource, context):
                if not statement.allow:
                    return "Deny"
                allowed = True
    return "Allow" if allowed else None


# What a canned ACL's AllUsers READ grant lets anyone do: list a bucket, or
# read an object (S3's ACL permission READ).
ACL_READ = {"bucket": "s3:ListBucket", "object": "s3:GetObject"}
# Anonymous callers get at most these, whatever a bucket policy says: a
# public data set is read and listed, never written (docs/users-and-policies.md).
ANONYMOUS_ACTIONS = frozenset({"s3:GetObject", "s3:ListBucket"})


def decide(who: Principal, action: str, resource: str, context: Mapping[str, str],
           policies: Iterable[Policy], acl_grants: bool = False) -> bool:
    """Whether ``who`` may take ``action`` on ``resource``.

    ``policies``: those that may apply (the user's own, and the bucket's
    policy); ``acl_grants``: a canned ACL grants this action to everyone.
    Root may do everything; an explicit Deny wins; then any Allow, then
    the ACL; by default, no."""
    if who.kind == "root":
        return True
    if who.kind == "anonymous" and action not in ANONYMOUS_ACTIONS:
        return False
    verdict = effect(who, action, resource, context, policies)
    if verdict is not None:
        return verdict == "Allow"
    return acl_grants
