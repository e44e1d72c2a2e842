"""The ``tierstore users`` and ``tierstore policies`` commands: users, their
access keys and named policies, through the admin API (docs/users-and-policies.md).

Admin API commands like those of ``gateway/cli/admin.py``: the same shared
options, session and one-line errors. A secret key is printed once, by the
command that made it (``users create``, ``users add-key``, ``users
rotate-key``); nothing shows it again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli import render
from gateway.cli.admin import PANEL, Session, _ListByDefault, admin
from gateway.cli.common import EXIT_USAGE, fail

users_app = typer.Typer(cls=_ListByDefault, help="Users, their access keys and policies. Without a subcommand: list.")
policies_app = typer.Typer(cls=_ListByDefault, help="Named policies and the ready-made ones. Without a subcommand: "
                           "list.")

UserName = Annotated[str, typer.Argument(metavar="NAME", help="The user.")]
AccessKey = Annotated[str, typer.Argument(metavar="ACCESS_KEY", help="One of the user's access key ids.")]
PolicyName = Annotated[
    str, typer.Argument(metavar="POLICY", help="read-only, read-write, read-only:BUCKET, read-write:BUCKET, "
                        "or a named policy.")
]
Policies = Annotated[
    list[str] | None,
    typer.Option("--policy", "-p", metavar="POLICY",
                 help="A policy to attach (repeat for several): read-only, read-write, read-only:BUCKET, "
                 "read-write:BUCKET, or a named one."),
]


# -- rendering -------------------------------------------------------------------------------------


def _keys(user: Mapping[str, Any]) -> str:
    keys = user.get("keys") or []
    return ", ".join(f"{k.get('access_key')}{'' if k.get('enabled') else ' (disabled)'}" for k in keys) or "-"


def show_users(document: Mapping[str, Any]) -> None:
    rows = [[str(u.get("name")), "yes" if u.get("enabled") else "no", ", ".join(u.get("policies") or []) or "-",
             _keys(u), render.when(u.get("created"))] for u in document.get("users", [])]
    console = render._out()
    if rows:
        console.print(render._table(None, ("user", "enabled", "policies", "access keys", "created"), rows))
    else:
        console.print("no users")


def show_user(user: Mapping[str, Any]) -> None:
    render._out().print(render._pairs(f"user {user.get('name')}", [
        ("enabled", "yes" if user.get("enabled") else "no"),
        ("policies", ", ".join(user.get("policies") or []) or "- (can do nothing)"),
        ("access keys", _keys(user)),
        ("created", render.when(user.get("created"))),
    ]))


def show_new_key(key: Mapping[str, Any]) -> None:
    render._out().print(render._pairs(f"new access key of {key.get('user')}", [
        ("access key", str(key.get("access_key"))),
        ("secret key", str(key.get("secret_key"))),
    ]))
    print("The secret key is shown this once: keep it now.")


def show_created(document: Mapping[str, Any]) -> None:
    show_user(document.get("user") or {})
    if document.get("key"):
        show_new_key(document["key"])


def show_policies(document: Mapping[str, Any]) -> None:
    rows = [[str(p.get("name")), "ready-made" if p.get("builtin") else "named", ", ".join(p.get("users") or []) or "-"]
            for p in document.get("policies", [])]
    render._out().print(render._table(None, ("policy", "kind", "attached to"), rows))


def show_policy(policy: Mapping[str, Any]) -> None:
    print(f"policy {policy.get('name')} ({'ready-made' if policy.get('builtin') else 'named'}), attached to: "
          + (", ".join(policy.get("users") or []) or "-"))
    print(json.dumps(policy.get("document"), indent=2))


# -- users -----------------------------------------------------------------------------------------


@users_app.command("list")
@admin
def list_users(session: Session) -> None:
    """The users, their policies and access key ids."""
    session.show(session.api.users(), show_users)


@users_app.command("create")
@admin
def create_user(
    session: Session,
    name: UserName,
    policy: Policies = None,
    key: Annotated[bool, typer.Option("--key/--no-key", help="Make an access key now.")] = True,
) -> None:
    """Create a user (with an access key unless --no-key; its secret is printed once).

    A user with no policy can do nothing: attach read-only:BUCKET for a
    training job, read-write:BUCKET for the job that writes its data set.
    """
    session.show(session.api.create_user(name, policy or [], key), show_created)


@users_app.command("show")
@admin
def show(session: Session, name: UserName) -> None:
    """One user."""
    session.show(session.api.user(name), show_user)


@users_app.command("disable")
@admin
def disable(session: Session, name: UserName) -> None:
    """Refuse the user's requests from the next one on (its keys are kept)."""
    session.show(session.api.update_user(name, {"enabled": False}), show_user)


@users_app.command("enable")
@admin
def enable(session: Session, name: UserName) -> None:
    """Serve a disabled user again."""
    session.show(session.api.update_user(name, {"enabled": True}), show_user)


@users_app.command("delete")
@admin
def delete(session: Session, name: UserName) -> None:
    """Delete a user and its keys."""
    session.api.delete_user(name)
    session.done(f"deleted user {name}")


@users_app.command("attach")
@admin
def attach(session: Session, name: UserName, policy: PolicyName) -> None:
    """Attach a policy to a user."""
    session.show(session.api.attach(name, policy), show_user)


@users_app.command("detach")
@admin
def detach(session: Session, name: UserName, policy: PolicyName) -> None:
    """Detach a policy from a user."""
    session.show(session.api.detach(name, policy), show_user)


@users_app.command("add-key")
@admin
def add_key(session: Session, name: UserName) -> None:
    """Another access key for a user (at most 10); its secret is printed once."""
    session.show(session.api.add_key(name), show_new_key)


@users_app.command("rotate-key")
@admin
def rotate_key(session: Session, name: UserName, access_key: AccessKey) -> None:
    """A new access key in place of ACCESS_KEY, which is revoked at once.

    For a rotation without a gap: add-key, move the clients, then revoke-key.
    """
    session.show(session.api.rotate_key(name, access_key), show_new_key)


@users_app.command("revoke-key")
@admin
def revoke_key(session: Session, name: UserName, access_key: AccessKey) -> None:
    """Revoke an access key: its next request is refused."""
    session.api.revoke_key(name, access_key)
    session.done(f"revoked {access_key} of {name}")


@users_app.command("disable-key")
@admin
def disable_key(session: Session, name: UserName, access_key: AccessKey) -> None:
    """Refuse one access key's requests, keeping it (enable-key serves it again)."""
    session.show(session.api.set_key(name, access_key, False), show_user)


@users_app.command("enable-key")
@admin
def enable_key(session: Session, name: UserName, access_key: AccessKey) -> None:
    """Serve a disabled access key again."""
    session.show(session.api.set_key(name, access_key, True), show_user)


# -- policies ----------------------------------------------------------------------------------------


@policies_app.command("list")
@admin
def list_policies(session: Session) -> None:
    """The ready-made policies and the named ones, with the users they are attached to."""
    session.show(session.api.policies(), show_policies)


@policies_app.command("show")
@admin
def show_policy_command(session: Session, name: PolicyName) -> None:
    """One policy's document."""
    session.show(session.api.policy(name), show_policy)


@policies_app.command("put")
@admin
def put_policy(
    session: Session,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The policy's name (no colon).")],
    document: Annotated[Path, typer.Argument(metavar="FILE", help="The policy document, JSON; - for stdin.")],
) -> None:
    """Create or replace a named policy from a JSON file."""
    try:
        text = typer.get_text_stream("stdin").read() if str(document) == "-" else document.read_text()
        parsed = json.loads(text)
    except (OSError, ValueError) as exc:
        fail(f"{document}: {exc}", EXIT_USAGE)
    if not isinstance(parsed, dict):
        fail(f"{document}: a policy document is a JSON object", EXIT_USAGE)
    session.show(session.api.put_policy(name, parsed), show_policy)


@policies_app.command("delete")
@admin
def delete_policy(session: Session, name: PolicyName) -> None:
    """Delete a named policy no user has attached."""
    session.api.delete_policy(name)
    session.done(f"deleted policy {name}")


def register(app: typer.Typer) -> None:
    """Add ``tierstore users`` and ``tierstore policies`` to the app."""
    app.add_typer(users_app, name="users", rich_help_panel=PANEL)
    app.add_typer(policies_app, name="policies", rich_help_panel=PANEL)
