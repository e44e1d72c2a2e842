"""Where setting values come from: command-line flags, ``TIERSTORE_*``
environment variables and the TOML file given by ``--config``, and which of
them wins for one setting. The names and the file's format are shared with
clients (``gateway.client.sources``); the gateway refuses a key no setting has."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gateway.client.sources import ConfigFile, env_name, env_value
from gateway.client.sources import read_config_file as read_file
from gateway.config.settings import COERCERS


def flag_name(name: str) -> str:
    """``hot_size`` -> ``--hot-size``."""
    return "--" + name.replace("_", "-")


def read_config_file(path: Path) -> ConfigFile:
    """Parse and check a --config file: a key that names no setting is refused."""
    return read_file(path, known=COERCERS)


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
