"""Generated secrets: the client key pair and admin token a gateway creates on
first start when nothing configures them, persisted in
``<data_dir>/credentials.toml`` (mode 0600)."""

from __future__ import annotations

import json
import os
import secrets
import string
from collections.abc import Mapping
from pathlib import Path

from gateway.client.sources import credentials_path, stored_secrets


def _new_key_pair() -> tuple[str, str]:
    # Shaped like AWS keys (20-char upper-case id, 40-char secret) so tools
    # that sanity-check key formats accept them.
    alphabet = string.ascii_uppercase + string.digits
    access = "TS" + "".join(secrets.choice(alphabet) for _ in range(18))
    return access, secrets.token_urlsafe(30)


def _write_secrets(path: Path, values: Mapping[str, str]) -> None:
    """Write atomically with mode 0600: temp file, fsync, rename, fsync dir."""
    lines = [
        "# tierstore: secrets generated on first start. Keep this file private.",
        "# Configured values (TIERSTORE_ACCESS_KEY/TIERSTORE_SECRET_KEY,",
        "# TIERSTORE_ADMIN_TOKEN, --config) take precedence over these.",
    ]
    # A JSON string with ensure_ascii=False is a valid TOML basic string.
    lines += [f"{k} = {json.dumps(v, ensure_ascii=False)}" for k, v in values.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # in case a stale temp file had other bits
        os.write(fd, ("\n".join(lines) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def generated_secrets(
    data_dir: Path, *, need_pair: bool, need_token: bool
) -> tuple[dict[str, str], str]:
    """Load, or create once and persist, the secrets that nothing configured."""
    stored = stored_secrets(data_dir)
    fresh = dict(stored)
    if need_pair and not ("access_key" in stored and "secret_key" in stored):
        fresh["access_key"], fresh["secret_key"] = _new_key_pair()
    if need_token and "admin_token" not in stored:
        fresh["admin_token"] = secrets.token_urlsafe(32)
    if fresh != stored:
        path = credentials_path(data_dir)
        try:
            _write_secrets(path, fresh)
        except OSError as exc:
            raise ValueError(
                f"cannot write generated credentials {path} (data_dir): {exc.strerror}"
            ) from None
    pair = {fresh["access_key"]: fresh["secret_key"]} if need_pair else {}
    return pair, fresh["admin_token"] if need_token else ""
