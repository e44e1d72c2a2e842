"""Users' secret keys sealed at rest: AES-256-GCM under a key of this
cluster's, kept in a file apart from the index and the capacity store.

The document in the store (``store.py``) holds each secret sealed, never in
the clear: someone who can read the capacity store (or a backup of it)
learns the access key ids and the policies, not the secrets. The data plane
needs the clear secret to check a signature (SigV4 is an HMAC keyed by it),
so every node holds the key: a 32-byte random value, base64 on one line of
``secrets.key`` in the data dir unless ``secrets_key_file`` names another
path, created with mode 0600 on a node's first start. The nodes of one
cluster must share the file (docs/security.md): the document records a
check value of the key (a keyed hash, which tells nothing of the key), and a
node whose key does not match refuses to start.

Each secret is sealed with a fresh 96-bit nonce and the access key id as
associated data, so a sealed secret copied onto another key id does not open.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tiering.files import sync_dir, write_all
from tiering.identity.errors import SecretsKeyMismatch

KEY_FILE = "secrets.key"
KEY_BYTES = 32
_NONCE = 12
_FORMAT = "v1:"


def load_key(path: Path) -> bytes:
    """The key in ``path``, created (mode 0600, fsynced) if the file does not
    exist. ValueError with a one-line reason when it cannot be used."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return _create(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the secrets key file {path}: {exc}") from None
    try:
        key = base64.b64decode(text, validate=True)
    except binascii.Error:
        key = b""
    if len(key) != KEY_BYTES:
        raise ValueError(f"the secrets key file {path} does not hold a {KEY_BYTES}-byte key in base64 "
                         "(copy it whole from another node of the cluster)")
    return key


def loose_permissions(path: Path) -> bool:
    """Whether others than the owner may read the key file."""
    try:
        return bool(path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))
    except OSError:
        return False


def _create(path: Path) -> bytes:
    key = os.urandom(KEY_BYTES)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it meanwhile: that one holds
        return load_key(path)
    except OSError as exc:
        raise ValueError(f"cannot create the secrets key file {path}: {exc.strerror}") from None
    try:
        write_all(fd, base64.b64encode(key) + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_dir(path.parent)
    return key


class Sealer:
    """Seals and opens secrets under one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a secrets key is {KEY_BYTES} bytes")
        self._aead = AESGCM(key)
        # Written into the document, so that a node with another key is
        # told at start instead of refusing every user's signature.
        self.check = hmac.new(key, b"tierstore secrets key check", hashlib.sha256).hexdigest()[:16]

    def seal(self, access_key: str, secret: str) -> str:
        nonce = os.urandom(_NONCE)
        sealed = self._aead.encrypt(nonce, secret.encode(), access_key.encode())
        return _FORMAT + base64.b64encode(nonce + sealed).decode()

    def open(self, access_key: str, sealed: str) -> str:
        """The secret; SecretsKeyMismatch if it was sealed under another key
        (or for another key id), ValueError if it is not a sealed secret."""
        if not sealed.startswith(_FORMAT):
            raise ValueError("not a sealed secret")
        try:
            raw = base64.b64decode(sealed[len(_FORMAT):], validate=True)
        except binascii.Error:
            raise ValueError("not a sealed secret") from None
        try:
            return self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], access_key.encode()).decode()
        except (InvalidTag, ValueError):
            raise SecretsKeyMismatch(f"the secret of access key {access_key} was sealed under another "
                                     "secrets key") from None
