"""Where the CLI finds a running gateway's admin API, and the token it needs;
and, for ``tierstore env``, its S3 endpoint and a key pair.

The address: ``--admin-url``, then ``TIERSTORE_ADMIN_URL``, then the
``admin_host``/``admin_port`` the gateway itself would use
(``TIERSTORE_ADMIN_HOST``/``TIERSTORE_ADMIN_PORT``, then the ``--config``
file), then ``http://127.0.0.1:9101``.

The token: ``--token``, then ``TIERSTORE_ADMIN_TOKEN``, then ``admin_token`` in
the ``--config`` file, then the token the gateway generated on first start in
``<data dir>/credentials.toml``; the data dir is ``--data-dir``, then
``TIERSTORE_DATA_DIR``, then ``data_dir`` in the file, then ``./tierstore-data``.

The S3 endpoint and key pair follow the same order: ``TIERSTORE_HOST``/
``TIERSTORE_PORT`` and ``TIERSTORE_ACCESS_KEY``/``TIERSTORE_SECRET_KEY``, then
the ``--config`` file (its first ``[credentials]`` pair), then the pair the
gateway generated in the data dir.

TLS: an address built from host and port is ``https`` when the gateway has
a certificate (``TIERSTORE_TLS_CERT``, then ``tls_cert`` in the file); the
CA bundle that verifies it is ``TIERSTORE_TLS_CA``, then ``tls_ca`` in the
file, else the system's CAs.

Unlike the gateway's own ``load_config`` this never writes anything: a client
must not generate a token of its own. Errors are ``ValueError`` with a
one-line message; the CLI exits 2 with it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gateway.client import sources as defaults
from gateway.client.sources import (
    ConfigFile,
    credentials_path,
    env_key_pair,
    env_name,
    read_config_file,
    stored_secrets,
)

_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


@dataclass(frozen=True, slots=True)
class Target:
    """The admin API to talk to; ``token_source`` says where the token came from."""

    url: str
    token: str = field(repr=False)
    token_source: str
    ca: Path | None = None  # the CA bundle an https URL is verified with; None: the system's


@dataclass(frozen=True, slots=True)
class S3Target:
    """What an S3 client needs to reach the gateway."""

    endpoint: str
    region: str
    access_key: str
    secret_key: str = field(repr=False)
    ca: Path | None = None


@dataclass(frozen=True, slots=True)
class _Source:
    """One place a value can come from, e.g. ``("--token", "abc")``."""

    label: str
    value: object
    setting: str = ""  # the setting it is a value of, e.g. "admin_port"


def resolve_target(
    *,
    admin_url: str | None,
    token: str | None,
    config_file: Path | None,
    data_dir: Path | None,
    env: Mapping[str, str] = os.environ,
    known: Collection[str] | None = None,
) -> Target:
    """Apply the precedence rules of the module docstring, once, for every command.
    ``known``: the settings a --config file may name (the CLI's check); None reads
    the keys needed here and leaves the others to the gateway."""
    parsed, label = _config_file(config_file, env, known)
    file = parsed.values if parsed is not None else {}
    url = _url(admin_url, env, file, label)
    found = _token(token, data_dir, env, file, label)
    return Target(url=url, token=str(found.value), token_source=found.label, ca=_ca(env, file, label))


def resolve_s3(
    *, config_file: Path | None, data_dir: Path | None, env: Mapping[str, str] = os.environ,
    known: Collection[str] | None = None,
) -> S3Target:
    """The S3 side of the gateway, by the precedence rules of the module docstring."""
    parsed, label = _config_file(config_file, env, known)
    file = parsed.values if parsed is not None else {}
    host = _env(env, "host") or _file(file, label, "host")
    port = _env(env, "port") or _file(file, label, "port")
    region = _env(env, "region") or _file(file, label, "region")
    endpoint = _url_of(
        _host(host) if host else defaults.HOST,
        _port(port) if port else defaults.PORT,
        _scheme(env, file, label),
    )
    access, secret = _key_pair(data_dir, env, file, parsed.credentials if parsed else {}, label)
    region_name = str(region.value) if region else defaults.REGION
    return S3Target(endpoint, region_name, access, secret, _ca(env, file, label))


def _key_pair(
    data_dir: Path | None,
    env: Mapping[str, str],
    file: Mapping[str, object],
    credentials: Mapping[str, str],
    label: str,
) -> tuple[str, str]:
    configured = env_key_pair(env) or credentials  # as the gateway: one half alone is an error
    if configured:
        return next(iter(configured.items()))
    where = _data_dir(data_dir, env, file, label)
    stored = stored_secrets(where)
    if "access_key" not in stored or "secret_key" not in stored:
        raise ValueError(
            f"no S3 key pair: set TIERSTORE_ACCESS_KEY and TIERSTORE_SECRET_KEY, or a [credentials] "
            f"table in --config, or start the gateway once so it generates {credentials_path(where)}"
        )
    return stored["access_key"], stored["secret_key"]


def _config_file(
    config_file: Path | None, env: Mapping[str, str], known: Collection[str] | None
) -> tuple[ConfigFile | None, str]:
    """The --config file (else TIERSTORE_CONFIG's, as for the gateway), read, and its label."""
    if config_file is None and (named := env.get(env_name("config"))):
        config_file = Path(named).expanduser()
    parsed = read_config_file(config_file, known) if config_file is not None else None
    return parsed, f"config file {config_file}"


def _env(env: Mapping[str, str], name: str) -> _Source | None:
    value = env.get(env_name(name)) or None  # empty counts as unset, as for the gateway
    return None if value is None else _Source(env_name(name), value, name)


def _file(file: Mapping[str, object], label: str, key: str) -> _Source | None:
    return _Source(f"{label}, key {key!r}", file[key], key) if key in file else None


def _url(flag: str | None, env: Mapping[str, str], file: Mapping[str, object], label: str) -> str:
    if flag:
        return _checked_url(flag, "--admin-url")
    if (given := _env(env, "admin_url")) is not None:
        return _checked_url(str(given.value), given.label)
    host = _env(env, "admin_host") or _file(file, label, "admin_host")
    port = _env(env, "admin_port") or _file(file, label, "admin_port")
    return _url_of(
        _host(host) if host else defaults.ADMIN_HOST,
        _port(port) if port else defaults.ADMIN_PORT,
        _scheme(env, file, label),
    )


def _checked_url(url: str, source: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"invalid admin URL {url!r} (from {source}): expected http://host:port")
    return url.rstrip("/")


def _host(source: _Source) -> str:
    if not isinstance(source.value, str):
        raise ValueError(f"invalid {source.setting} {source.value!r} (from {source.label})")
    # A gateway listening on every address is reached on loopback.
    return _WILDCARDS.get(source.value.strip(), source.value.strip())


def _port(source: _Source) -> int:
    raw = source.value
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)
    name = source.setting
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 65535:
        raise ValueError(f"invalid {name} {source.value!r} (from {source.label})")
    if raw == 0:
        flag = "--admin-url" if name == "admin_port" else "TIERSTORE_PORT"
        raise ValueError(
            f"{name} is 0 (from {source.label}): the gateway picked a free port, "
            f"pass the port it printed with {flag}"
        )
    return raw


def _url_of(host: str, port: int, scheme: str) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _scheme(env: Mapping[str, str], file: Mapping[str, object], label: str) -> str:
    """``https`` when the gateway is configured with a certificate."""
    return "https" if _env(env, "tls_cert") or _file(file, label, "tls_cert") else "http"


def _ca(env: Mapping[str, str], file: Mapping[str, object], label: str) -> Path | None:
    found = _env(env, "tls_ca") or _file(file, label, "tls_ca")
    if found is None:
        return None
    if not isinstance(found.value, str) or not found.value.strip():
        raise ValueError(f"invalid tls_ca {found.value!r} (from {found.label}): expected a file name")
    return Path(found.value).expanduser()


def _token(
    flag: str | None,
    data_dir: Path | None,
    env: Mapping[str, str],
    file: Mapping[str, object],
    label: str,
) -> _Source:
    if flag:
        return _Source("--token", flag)
    found = _env(env, "admin_token") or _file(file, label, "admin_token")
    if found is not None:
        if not isinstance(found.value, str) or not found.value.strip():
            raise ValueError(f"invalid admin_token (from {found.label}): expected a string")
        return found
    return _generated_token(_data_dir(data_dir, env, file, label))


def _data_dir(
    flag: Path | None, env: Mapping[str, str], file: Mapping[str, object], label: str
) -> Path:
    if flag is not None:
        return flag.expanduser()
    found = _env(env, "data_dir") or _file(file, label, "data_dir")
    if found is None:
        return defaults.DATA_DIR
    if not isinstance(found.value, str) or not found.value.strip():
        raise ValueError(f"invalid data_dir {found.value!r} (from {found.label})")
    return Path(found.value).expanduser()


def _generated_token(data_dir: Path) -> _Source:
    path = credentials_path(data_dir)
    token = stored_secrets(data_dir).get("admin_token")
    if token is None:
        why = "holds no admin_token" if path.exists() else "does not exist"
        raise ValueError(
            f"no admin token: pass --token, set TIERSTORE_ADMIN_TOKEN or admin_token in --config, "
            f"or point --data-dir at the gateway's data dir ({path} {why})"
        )
    return _Source(str(path), token)
