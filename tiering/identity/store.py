"""The identities document in the capacity store, beside the leases.

One object, ``identity/state`` (``state.py``), holds every user, key,
named policy, bucket policy and canned ACL. A change is a compare-and-swap
of the whole document, as the leases are written (``tiering/cluster/lease.py``):
read it (its version tag kept), change a copy, write it with ``If-Match``
on that tag (``If-None-Match: *`` for the first), and on a conflict read
it again and redo the change on what another node wrote. The node that
made a change serves it at once and tells the others (the callbacks of
``tell``: a notice, ``tiering/cluster/push.py``); a node that gets the
notice reads the document soon (``nudge``). The node that made it also
names the new version in the cluster's follow head
(``tiering/cluster/head.py``), which every node reads conditionally every
``follow_fallback``: a node whose notice was lost is nudged by that read
and serves the change within the fallback, at no request of its own while
nothing changes. Its own read, every ``interval`` seconds (``BESIDE_HEAD``
fallbacks), with ``If-None-Match`` on the version it serves (a 304 and no
body while unchanged), only covers a node that stopped between writing the
document and updating the head. The local-directory store does the same
compare-and-swap under its lock, so processes sharing one directory agree
too.

A write whose answer was lost and that was retried may be told it
conflicted with itself: each write carries a random nonce, and a conflict
is first checked against it (as the lease does).

Building a snapshot (opening the secrets, parsing the policies) runs in the
pool: a few milliseconds for hundreds of users, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import string
from collections.abc import Callable
from typing import TypeVar

from tiering import pool
from tiering.capacity import CapacityStore
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound
from tiering.identity.directory import EMPTY, Directory
from tiering.identity.errors import SecretsKeyMismatch
from tiering.identity.sealing import Sealer
from tiering.identity.state import State
from tiering.meta import now_ms

log = logging.getLogger("tierstore.identity")

NAME = "identity/state"
# Conflicting writes in a row before a change gives up, and the most a try
# waits before the next (jittered, growing): nodes that race on the
# document take turns instead of colliding again at once.
MAX_TRIES = 32
MAX_BACKOFF = 0.5
# With a follow head (a cluster), follow fallbacks between a node's own
# reads of the document: the head says when it changed.
BESIDE_HEAD = 10
T = TypeVar("T")


class Identities:
    """This node's copy of the identities document, and the changes it makes."""

    def __init__(self, store: CapacityStore, sealer: Sealer, interval: float | None = None) -> None:
        self.store = store
        self.sealer = sealer
        self.interval = interval  # None: no other node writes (the only gateway)
        self.state = State()
        self.directory: Directory = EMPTY
        self.raw = b""  # the document as read or written last (b"": none yet)
        self._tag: str | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._subscribers: list[Callable[[bytes], None]] = []
        self._told: list[Callable[[], None]] = []
        self._nudged = asyncio.Event()
        self._said: set[str] = set()
        self.errors = 0
        self.last_error: str | None = None

    @property
    def tag(self) -> str | None:
        """The version tag of the document served (None: none yet)."""
        return self._tag

    def subscribe(self, callback: Callable[[bytes], None]) -> None:
        """``callback(document)`` after each new version is served (read workers)."""
        self._subscribers.append(callback)

    def tell(self, callback: Callable[[], None]) -> None:
        """``callback()`` after each change this node writes (it tells the other nodes)."""
        self._told.append(callback)

    def nudge(self) -> None:
        """Another node changed the document (its notice): read it soon."""
        self._nudged.set()

    # -- life -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the document (errors raise: SecretsKeyMismatch, CapacityError),
        then follow it every ``interval`` seconds."""
        await self.refresh(strict=True)
        if self.interval is not None:
            self._task = asyncio.create_task(self._follow(), name="tierstore identities")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _follow(self) -> None:
        assert self.interval is not None
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):  # not wait_for: see Flusher.run
                    await self._nudged.wait()
            self._nudged.clear()
            try:
                await self.refresh()
                self.last_error = None
            except (CapacityError, OSError) as exc:
                self.errors += 1
                self.last_error = str(exc) or type(exc).__name__
                log.warning("reading the identities document failed (%s); retrying", self.last_error)

    # -- reading ---------------------------------------------------------------------------

    async def refresh(self, strict: bool = False) -> bool:
        """Read the document; serve it if it changed. True if it did.

        A document this node cannot use (malformed, or sealed under another
        secrets key) raises with ``strict`` (at start), else is logged once
        and the version served so far stays."""
        found: tuple[bytes, str | None] | None
        try:
            if self._tag is None:
                found = await self.store.read_versioned(NAME)
            else:
                found = await self.store.read_if_changed(NAME, self._tag)  # a 304 while unchanged
        except CapacityNotFound:
            if self._tag is None:
                return False
            found = (b"", None)  # removed from the store: no users any more
        if found is None:
            return False
        data, tag = found
        if tag == self._tag and tag is not None:
            return False
        try:
            state = State.decode(data) if data else State()
            self._check_key(state)
        except (ValueError, SecretsKeyMismatch) as exc:
            if strict:
                raise
            self._say(f"the identities document in the store cannot be used ({exc}); "
                      f"serving version {self.state.version}")
            return False
        await self._serve(state, tag, data)
        return True

    def _check_key(self, state: State) -> None:
        sealed = any(u.keys for u in state.users.values())
        if sealed and state.key_check and state.key_check != self.sealer.check:
            raise SecretsKeyMismatch(
                "the users' secrets in the capacity store were sealed under another secrets key than "
                "this node's: every node of a cluster needs the same secrets key file (docs/security.md)")

    async def _serve(self, state: State, tag: str | None, data: bytes) -> None:
        directory = await pool.run(Directory, state, self.sealer)
        for problem in directory.problems:
            self._say(problem)
        self.state, self._tag, self.raw, self.directory = state, tag, data, directory
        for callback in self._subscribers:
            callback(data)

    def _say(self, problem: str) -> None:
        if problem not in self._said:
            self._said.add(problem)
            log.error("identities: %s", problem)

    # -- changing -----------------------------------------------------------------------------

    async def change(self, mutate: Callable[[State], T]) -> T:
        """Apply ``mutate`` to the latest document and write it; its result.

        ``mutate`` changes the State it is given, or raises (an
        IdentityError, a PolicyError) and nothing is written. It may run
        more than once, on a newer document each time, when other nodes
        write meanwhile. Served here once written."""
        async with self._lock:
            for attempt in range(MAX_TRIES):
                if attempt:
                    await asyncio.sleep(random.uniform(0, min(MAX_BACKOFF, 0.01 * 2 ** min(attempt, 6))))
                state = self.state.copy()
                result = mutate(state)
                state.version = self.state.version + 1
                state.key_check = self.sealer.check
                state.nonce = secrets.token_hex(8)
                data = state.encode()
                try:
                    tag = await self.store.put_conditional(NAME, data, self._tag)
                except CapacityConflict:
                    if await self._landed(state.nonce):
                        self._announce()
                        return result
                    await self.refresh()
                    continue
                await self._serve(state, tag, data)
                self._announce()
                return result
        raise CapacityError(f"the identities document was changed by other nodes {MAX_TRIES} times in a row; "
                            "retry", name=NAME)

    def _announce(self) -> None:
        for callback in self._told:
            callback()

    # -- keys ---------------------------------------------------------------------------------

    async def add_key(self, user: str, replacing: str | None = None) -> tuple[str, str]:
        """A new key pair of ``user`` (and ``replacing``, one of its keys,
        revoked in the same change): (access key, secret), the secret told
        this once and stored sealed."""
        access_key, secret = new_key_pair()
        sealed = self.sealer.seal(access_key, secret)

        def add(state: State) -> None:
            if replacing is not None:
                state.revoke_key(user, replacing)
            state.add_key(user, access_key, sealed, now_ms())

        await self.change(add)
        return access_key, secret

    async def _landed(self, nonce: str) -> bool:
        """After a conflict: was it our own write, whose answer was lost?"""
        try:
            data, tag = await self.store.read_versioned(NAME)
        except CapacityNotFound:
            return False
        try:
            state = State.decode(data)
        except ValueError:
            return False
        if state.nonce != nonce:
            return False
        await self._serve(state, tag, data)
        return True


def new_key_pair() -> tuple[str, str]:
    """An access key shaped like AWS's (20 upper-case letters and digits,
    ``TU`` for a tierstore user's) and a 40-character secret: tools that
    check key formats accept them."""
    alphabet = string.ascii_uppercase + string.digits
    return "TU" + "".join(secrets.choice(alphabet) for _ in range(18)), secrets.token_urlsafe(30)
