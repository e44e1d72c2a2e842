"""Admin routes for users, their access keys and named policies
(docs/users-and-policies.md).

Every change is one compare-and-swap of the identities document in the
capacity store (``tiering/identity/store.py``): this node serves it the
moment the route answers, the read workers a moment later (pushed), the
other nodes of a cluster within their follow interval. A secret key is in
the answer of the route that made it, and nowhere else afterwards: the
document holds it sealed, and no route shows it again.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Response
from pydantic import BaseModel, Field

from gateway.admin.bodies import Text, TextList, admin_router, printable
from gateway.admin.context import AdminContext
from gateway.admin.errors import AdminError, responses
from gateway.admin.models import Strict
from gateway.s3.xml import iso8601
from tiering.errors import CapacityError
from tiering.identity import builtin
from tiering.identity.errors import (
    IdentityError,
    InvalidName,
    NoSuchAccessKey,
    NoSuchPolicy,
    NoSuchUser,
    PolicyInUse,
    UserExists,
)
from tiering.identity.policy import PolicyError
from tiering.identity.state import State, User
from tiering.identity.store import Identities
from tiering.meta import now_ms

# IdentityError -> admin error code (the codes are gateway/admin/errors.py's table).
_CODES: dict[type[IdentityError], str] = {
    NoSuchUser: "NoSuchUser", NoSuchAccessKey: "NoSuchAccessKey", NoSuchPolicy: "NoSuchPolicy",
    UserExists: "UserAlreadyExists", PolicyInUse: "PolicyInUse", InvalidName: "InvalidRequest",
}


class NewUser(Strict):
    name: Text = Field(description="1 to 64 of A-Z a-z 0-9 + = , . @ _ -")
    policies: TextList = Field(default_factory=list, max_length=20,
                               description="policy names: read-only, read-write, read-only:<bucket>, "
                               "read-write:<bucket>, or a named policy (PUT /policies/{name})")
    key: bool = Field(True, description="make an access key now (its secret is in this answer only)")


class UserChange(Strict):
    enabled: bool | None = None
    policies: TextList | None = Field(None, max_length=20, description="replaces the user's policies")


class KeyChange(Strict):
    enabled: bool


class KeyView(BaseModel):
    access_key: str
    enabled: bool
    created: str


class UserView(BaseModel):
    name: str
    enabled: bool
    created: str
    policies: list[str]
    keys: list[KeyView]


class UserList(BaseModel):
    users: list[UserView]


class NewKey(BaseModel):
    """A key pair just made: the only answer that holds its secret."""

    user: str
    access_key: str
    secret_key: str


class CreatedUser(BaseModel):
    user: UserView
    key: NewKey | None


class PolicyView(BaseModel):
    name: str
    builtin: bool
    document: dict[str, Any]
    users: list[str]  # the users it is attached to


class PolicyList(BaseModel):
    policies: list[PolicyView]


def user_view(user: User) -> UserView:
    return UserView(name=user.name, enabled=user.enabled, created=iso8601(user.created_ms),
                    policies=list(user.policies),
                    keys=[KeyView(access_key=k.access_key, enabled=k.enabled, created=iso8601(k.created_ms))
                          for k in user.keys.values()])


def _policy_view(state: State, name: str) -> PolicyView:
    document = json.loads(state.policy_document(name))
    users = sorted(u.name for u in state.users.values() if name in u.policies)
    return PolicyView(name=name, builtin=name not in state.policies, document=document, users=users)


def _failed(exc: Exception) -> AdminError:
    if isinstance(exc, PolicyError):
        return AdminError("MalformedPolicy", str(exc))
    if isinstance(exc, CapacityError):
        return AdminError("Unavailable", f"the capacity store did not take the change: {exc.message or exc}")
    assert isinstance(exc, IdentityError)
    code = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), "InvalidRequest")
    return AdminError(code, printable(exc.message or str(exc)))


def router(ctx: AdminContext) -> APIRouter:
    api = admin_router(responses=responses("Unavailable"))

    def identities() -> Identities:
        ctx.tiering()  # 503 while starting or stopping
        found = ctx.node.identities
        if found is None:
            raise AdminError("Unavailable", "the gateway is starting or stopping; retry shortly")
        return found

    async def change(mutate: Any) -> Any:
        try:
            return await identities().change(mutate)
        except (IdentityError, PolicyError, CapacityError) as exc:
            raise _failed(exc) from None

    @api.get("/users", tags=["users"], response_model=UserList)
    async def list_users() -> UserList:
        """Every user, with its keys (ids only) and policies."""
        state = identities().state
        return UserList(users=[user_view(u) for _, u in sorted(state.users.items())])

    @api.post("/users", tags=["users"], status_code=201, response_model=CreatedUser,
              responses=responses("InvalidRequest", "UserAlreadyExists", "NoSuchPolicy"))
    async def create_user(new: NewUser) -> CreatedUser:
        """Create a user, with an access key unless ``key`` is false: its
        secret is in this answer and nowhere else, ever."""
        await change(lambda state: state.create_user(new.name, list(new.policies), now_ms()))
        key = await _new_key(new.name) if new.key else None
        return CreatedUser(user=user_view(identities().state.user(new.name)), key=key)

    async def _new_key(name: str, replacing: str | None = None) -> NewKey:
        try:
            access_key, secret = await identities().add_key(name, replacing)
        except (IdentityError, CapacityError) as exc:
            raise _failed(exc) from None
        return NewKey(user=name, access_key=access_key, secret_key=secret)

    @api.get("/users/{name}", tags=["users"], response_model=UserView, responses=responses("NoSuchUser"))
    async def get_user(name: str) -> UserView:
        """One user."""
        try:
            return user_view(identities().state.user(name))
        except IdentityError as exc:
            raise _failed(exc) from None

    @api.patch("/users/{name}", tags=["users"], response_model=UserView,
               responses=responses("InvalidRequest", "NoSuchUser", "NoSuchPolicy"))
    async def update_user(name: str, update: UserChange) -> UserView:
        """Enable or disable a user (a disabled user's requests are refused
        from the next one on), or replace its policies."""
        policies = list(update.policies) if update.policies is not None else None
        return user_view(await change(lambda state: state.update_user(name, update.enabled, policies)))

    @api.delete("/users/{name}", tags=["users"], status_code=204, responses=responses("NoSuchUser"))
    async def delete_user(name: str) -> Response:
        """Delete a user and its keys."""
        await change(lambda state: state.delete_user(name))
        return Response(status_code=204)

    @api.post("/users/{name}/keys", tags=["users"], status_code=201, response_model=NewKey,
              responses=responses("InvalidRequest", "NoSuchUser"))
    async def add_key(name: str) -> NewKey:
        """Another access key for the user (at most 10): rotate by adding
        one, moving the clients to it, then revoking the old one."""
        return await _new_key(name)

    @api.post("/users/{name}/keys/{access_key}/rotate", tags=["users"], status_code=201,
              response_model=NewKey, responses=responses("NoSuchUser", "NoSuchAccessKey"))
    async def rotate_key(name: str, access_key: str) -> NewKey:
        """A new access key in place of ``access_key``, which is revoked in
        the same change."""
        return await _new_key(name, access_key)

    @api.patch("/users/{name}/keys/{access_key}", tags=["users"], response_model=UserView,
               responses=responses("InvalidRequest", "NoSuchUser", "NoSuchAccessKey"))
    async def update_key(name: str, access_key: str, update: KeyChange) -> UserView:
        """Disable (or enable again) one access key."""
        await change(lambda state: state.set_key(name, access_key, update.enabled))
        return user_view(identities().state.user(name))

    @api.delete("/users/{name}/keys/{access_key}", tags=["users"], status_code=204,
                responses=responses("NoSuchUser", "NoSuchAccessKey"))
    async def revoke_key(name: str, access_key: str) -> Response:
        """Revoke an access key: its next request is refused."""
        await change(lambda state: state.revoke_key(name, access_key))
        return Response(status_code=204)

    @api.put("/users/{name}/policies/{policy}", tags=["users"], response_model=UserView,
             responses=responses("InvalidRequest", "NoSuchUser", "NoSuchPolicy"))
    async def attach(name: str, policy: str) -> UserView:
        """Attach a policy to the user."""
        return user_view(await change(lambda state: state.attach(name, policy)))

    @api.delete("/users/{name}/policies/{policy}", tags=["users"], response_model=UserView,
                responses=responses("NoSuchUser", "NoSuchPolicy"))
    async def detach(name: str, policy: str) -> UserView:
        """Detach a policy from the user."""
        return user_view(await change(lambda state: state.detach(name, policy)))

    @api.get("/policies", tags=["users"], response_model=PolicyList)
    async def list_policies() -> PolicyList:
        """The ready-made policies (for every bucket; ``read-only:<bucket>``
        and ``read-write:<bucket>`` exist for each bucket too) and the named ones."""
        state = identities().state
        names = [builtin.READ_ONLY, builtin.READ_WRITE, *sorted(state.policies)]
        return PolicyList(policies=[_policy_view(state, n) for n in names])

    @api.get("/policies/{name}", tags=["users"], response_model=PolicyView, responses=responses("NoSuchPolicy"))
    async def get_policy(name: str) -> PolicyView:
        """One policy, ready-made or named, and the users it is attached to."""
        try:
            return _policy_view(identities().state, name)
        except IdentityError as exc:
            raise _failed(exc) from None

    @api.put("/policies/{name}", tags=["users"], response_model=PolicyView,
             responses=responses("InvalidRequest", "MalformedPolicy"))
    async def put_policy(name: str, document: Annotated[dict[str, Any], Body(
            description="an IAM policy document: Version, Statement")]) -> PolicyView:
        """Create or replace a named policy; the users it is attached to are
        held to the new document at once."""
        text = json.dumps(document, indent=2)
        await change(lambda state: state.put_policy(name, text, now_ms()))
        return _policy_view(identities().state, name)

    @api.delete("/policies/{name}", tags=["users"], status_code=204,
                responses=responses("NoSuchPolicy", "PolicyInUse"))
    async def delete_policy(name: str) -> Response:
        """Delete a named policy that no user has attached."""
        await change(lambda state: state.delete_policy(name))
        return Response(status_code=204)

    return api
