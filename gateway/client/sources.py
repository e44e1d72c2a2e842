"""Where a gateway's settings are written down, read the same way by the
gateway and by whatever looks for it (the CLI, a training job's hints):
the ``TIERSTORE_*`` environment names, the TOML file given by
``--config``, the secrets a gateway generates on first start
(``<data_dir>/credentials.toml``) and the defaults of the settings a client
needs to find the gateway (its addresses, data dir and region).

The gateway checks a file's keys against every setting it knows
(``gateway.config.sources``); a client reads the keys it needs and leaves
the others to the gateway, so a trainer's client of another version never
refuses a gateway's file.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_PREFIX = "TIERSTORE_"
CREDENTIALS_FILE = "credentials.toml"

# The defaults of what a client needs to reach a gateway; gateway.config.values.Config uses them.
HOST = "127.0.0.1"
PORT = 9100
ADMIN_HOST = "127.0.0.1"  # the admin API is loopback-only unless asked
ADMIN_PORT = 9101
DATA_DIR = Path("tierstore-data")
REGION = "us-east-1"


def env_name(name: str) -> str:
    """``hot_size`` -> ``TIERSTORE_HOT_SIZE``."""
    return ENV_PREFIX + name.upper()


def env_value(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None  # empty counts as unset


def env_key_pair(env: Mapping[str, str]) -> dict[str, str]:
    """TIERSTORE_ACCESS_KEY/SECRET_KEY as {access: secret}, {} if neither; both or neither."""
    access = env_value(env, env_name("access_key"))
    secret = env_value(env, env_name("secret_key"))
    if access is None and secret is None:
        return {}
    if access is None or secret is None:
        given, missing = (
            ("ACCESS_KEY", "SECRET_KEY") if secret is None else ("SECRET_KEY", "ACCESS_KEY")
        )
        raise ValueError(
            f"{ENV_PREFIX}{given} is set but {ENV_PREFIX}{missing} is not: set both or neither"
        )
    return {access.strip(): secret}


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """The parsed --config file: scalar settings and the [credentials] table."""

    path: Path
    values: dict[str, object]
    credentials: dict[str, str]

    def source(self, key: str) -> str:
        return f"config file {self.path}, key {key!r}"


def read_config_file(path: Path, known: Collection[str] | None = None) -> ConfigFile:
    """Parse a --config file; with ``known``, a key not in it is refused."""
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None
    table = data.pop("credentials", {})
    if known is not None:
        _reject_unknown_keys(path, data, known)
    return ConfigFile(path, data, _credential_table(path, table))


def _reject_unknown_keys(path: Path, data: Mapping[str, object], known: Collection[str]) -> None:
    unknown = sorted(set(data) - set(known))
    if not unknown:
        return
    key = unknown[0]
    hint = ""
    if key in ("access_key", "secret_key"):
        hint = ' (gateway key pairs go in a [credentials] table: access_key = "secret_key")'
    elif close := difflib.get_close_matches(key.replace("-", "_"), list(known), n=1):
        hint = f" (did you mean {close[0]!r}?)"
    names = ", ".join(repr(k) for k in unknown)
    raise ValueError(f"unknown key {names} in config file {path}{hint}")


def _credential_table(path: Path, table: object) -> dict[str, str]:
    shape = 'a [credentials] table of access_key = "secret_key" pairs'
    if not isinstance(table, dict):
        raise ValueError(f"key 'credentials' in config file {path} must be {shape}")
    pairs: dict[str, str] = {}
    for access_key, secret_key in table.items():
        if not access_key.strip() or not isinstance(secret_key, str) or not secret_key:
            raise ValueError(
                f"bad entry {access_key!r} in [credentials] of config file {path}: expected {shape}"
            )
        pairs[access_key.strip()] = secret_key
    return pairs


def credentials_path(data_dir: Path) -> Path:
    return data_dir / CREDENTIALS_FILE


def stored_secrets(data_dir: Path) -> dict[str, str]:
    """The generated secrets persisted under ``data_dir`` ({} if none yet).

    Keys: ``access_key``, ``secret_key``, ``admin_token`` (each optional).
    """
    path = credentials_path(data_dir)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ValueError(f"cannot read generated credentials {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"generated credentials {path} are not valid TOML: {exc}") from None
    wanted = ("access_key", "secret_key", "admin_token")
    if any(not isinstance(data.get(k, ""), str) for k in wanted):
        raise ValueError(f"generated credentials {path} are malformed; delete the file to renew")
    return {k: data[k] for k in wanted if data.get(k)}
