"""The admin API's one door for request bodies.

Every route with a body is a :class:`BoundedRoute` (routers come from
:func:`admin_router`): before FastAPI sees the body, it is read with a bound
on its size (413 ``EntityTooLarge`` past :data:`MAX_BODY`), parsed as JSON,
and refused (400 ``InvalidRequest``) when it is not JSON, nests deeper than
:data:`MAX_DEPTH` or holds more than :data:`MAX_ELEMENTS` values. Only then
is it validated into the route's model, whose text fields are :data:`Text`:
a string that cannot be encoded as UTF-8 (a lone surrogate, which JSON can
spell as ``"\\ud800"``) is refused there, naming the field. So no work
starts, and no job exists, for a body that is not bounded and well typed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from pydantic import AfterValidator

from gateway.admin.errors import AdminError
from gateway.client.order import MAX_KEYS
from tiering import pool
from tiering.model.names import unencodable

MiB = 1024 * 1024
# A body of at most this many bytes: an epoch or warm job of MAX_KEYS keys
# of ~20 bytes each, with room to spare.
MAX_BODY = 256 * MiB
# Objects and arrays nested at most this deep (the deepest model nests 2).
MAX_DEPTH = 32
# JSON values (objects, arrays, strings, numbers, true/false/null) in a body:
# a key list of MAX_KEYS keys and the rest of its request.
MAX_ELEMENTS = MAX_KEYS + 1024


# -- text --------------------------------------------------------------------------------


def _encodable(value: str) -> str:
    at = unencodable(value)
    if at is not None:
        raise ValueError(f"text that cannot be encoded as UTF-8 (a lone surrogate, "
                         f"U+{ord(value[at]):04X}, at character {at})")
    return value


def _all_encodable(values: list[str]) -> list[str]:
    # One encode of the whole list (millions of keys) instead of a call per key.
    if unencodable("\n".join(values)) is not None:
        for index, value in enumerate(values):
            at = unencodable(value)
            if at is not None:
                raise ValueError(f"item {index}: text that cannot be encoded as UTF-8 (a lone surrogate, "
                                 f"U+{ord(value[at]):04X}, at character {at})")
    return values


# Text from a client: a string UTF-8 can encode. Every string field of a
# request model is one (or a TextList), so it can be stored, logged, listed
# and answered back.
Text = Annotated[str, AfterValidator(_encodable)]
# A list of Text, checked in one pass.
TextList = Annotated[list[str], AfterValidator(_all_encodable)]


def printable(value: str) -> str:
    """``value`` with what UTF-8 cannot encode written as ``\\udXXX``: for
    answers and listings that must never fail on text a client sent."""
    if unencodable(value) is None:
        return value
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


# -- the body ----------------------------------------------------------------------------

# A JSON string, for counting the commas outside strings.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # one pass, no backtracking


def parse_body(body: bytes) -> Any:
    """``body`` as JSON within the limits, or AdminError."""
    if len(body) > MAX_BODY:
        raise AdminError("EntityTooLarge", f"the body is larger than {MAX_BODY} bytes")
    # Values in a body are at most its separators plus its containers plus one;
    # past the limit, counted again without the commas in strings, before any is built.
    bound = body.count(b",") + body.count(b"[") + body.count(b"{") + 1
    if bound > MAX_ELEMENTS:
        bare = _STRING.sub(b'""', body)
        if bare.count(b",") + bare.count(b"[") + bare.count(b"{") + 1 > MAX_ELEMENTS:
            raise AdminError("InvalidRequest", f"the body holds more than {MAX_ELEMENTS:,} JSON values")
    try:
        value = json.loads(body)
    except RecursionError:  # the decoder's own bound, far below the stack's
        raise AdminError("InvalidRequest", f"the body nests deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise AdminError("InvalidRequest", f"the body is not JSON: {exc.msg} at character {exc.pos}") from None
    except UnicodeDecodeError as exc:
        raise AdminError("InvalidRequest", f"the body is not UTF-8 text: byte {exc.start}") from None
    except ValueError as exc:  # a number of more digits than Python converts (4300), and the like
        raise AdminError("InvalidRequest", f"the body is not JSON this API reads: {exc}") from None
    _check_shape(value)
    return value


def _check_shape(value: Any) -> None:
    """Depth and element count, without recursion."""
    elements = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        elements += 1
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise AdminError("InvalidRequest", f"the body nests deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                # Member names are matched against the model's fields, which
                # cannot say which one it was: one that cannot be encoded is refused here.
                bad = next((name for name in item if unencodable(name) is not None), None)
                if bad is not None:
                    raise AdminError("InvalidRequest", f"the body has a member name that cannot be encoded "
                                     f"as UTF-8: \"{printable(bad)}\"")
            children = item.values() if isinstance(item, dict) else item
            if elements + len(children) > MAX_ELEMENTS:
                raise AdminError("InvalidRequest", f"the body holds more than {MAX_ELEMENTS:,} JSON values")
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
            elements += sum(1 for child in children if not isinstance(child, dict | list))


def _is_json(request: Request) -> bool:
    """Whether FastAPI would read the body as JSON (or refuse it anyway)."""
    kind = request.headers.get("content-type")
    if not kind:
        return True
    kind = kind.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


async def read_body(request: Request) -> bytes:
    """The whole body, refused with 413 as soon as it passes MAX_BODY."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise AdminError("EntityTooLarge", f"the body is larger than {MAX_BODY} bytes")
    chunks = bytearray()
    async for chunk in request.stream():
        chunks += chunk
        if len(chunks) > MAX_BODY:
            raise AdminError("EntityTooLarge", f"the body is larger than {MAX_BODY} bytes")
    return bytes(chunks)


class BoundedRoute(APIRoute):
    """An admin route whose body, if it takes one, goes through :func:`parse_body` first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def bounded(request: Request) -> Response:
            body = await read_body(request)
            request._body = body  # FastAPI reads it from here
            if body and _is_json(request):
                # A large body (millions of keys) takes a while: off the event loop.
                parsed = parse_body(body) if len(body) <= MiB else await pool.run(parse_body, body)
                request._json = parsed  # FastAPI reads this rather than parse the body again
            return await handler(request)

        return bounded


def admin_router(**kwargs: Any) -> APIRouter:
    """An APIRouter of :class:`BoundedRoute` routes."""
    return APIRouter(route_class=BoundedRoute, **kwargs)
