"""Where setting values come from: command-line flags, ``TIERSTORE_*``
environment variables and the TOML file given by ``--config``, and which of
them wins for one setting."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.settings import COERCERS

ENV_PREFIX = "TIERSTORE_"


def flag_name(name: str) -> str:
    """``hot_size`` -> ``--hot-size``."""
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    """``hot_size`` -> ``TIERSTORE_HOT_SIZE``."""
    return ENV_PREFIX + name.upper()


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """The parsed --config file: scalar settings and the [credentials] table."""

    path: Path
    values: dict[str, object]
    credentials: dict[str, str]

    def source(self, key: str) -> str:
        return f"config file {self.path}, key {key!r}"


def read_config_file(path: Path) -> ConfigFile:
    """Parse and check a --config file (unknown keys are refused)."""
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
    _reject_unknown_keys(path, data)
    return ConfigFile(path, data, _credential_table(path, table))


def _reject_unknown_keys(path: Path, data: Mapping[str, object]) -> None:
    unknown = sorted(set(data) - set(COERCERS))
    if not unknown:
        return
    key = unknown[0]
    hint = ""
    if key in ("access_key", "secret_key"):
        hint = ' (gateway key pairs go in a [credentials] table: access_key = "secret_key")'
    elif close := difflib.get_close_matches(key.replace("-", "_"), COERCERS, n=1):
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


def pick(
    name: str, cli: Mapping[str, object | None], env: Mapping[str, str], file: ConfigFile | None
) -> tuple[object, str] | None:
    """The winning raw value of one setting and a label saying where it came from."""
    if (value := cli.get(name)) is not None:
        return value, flag_name(name)
    if (text := env_value(env, env_name(name))) is not None:
        return text, env_name(name)
    if file is not None and name in file.values:
        return file.values[name], file.source(name)
    return None
