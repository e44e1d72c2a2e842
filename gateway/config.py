"""Configuration: the one :class:`Config` object and where its values come from.

Every setting has one name, used three ways: a command-line flag
(``--hot-size``), an environment variable (``TIERSTORE_HOT_SIZE``) and a key in
the TOML file given by ``--config`` (``hot_size``). Precedence, highest first:
flags, environment, file, built-in defaults. An empty environment variable
counts as unset, so ``FOO=`` lines in env files do not override the file.

Secrets the gateway cannot run without (one client key pair, the admin token)
are generated on first start when nothing configures them, and persisted in
``<data_dir>/credentials.toml`` (mode 0600) so the keys printed by the first
``tierstore serve`` keep working after a restart.

Every invalid value raises ``ValueError`` with a one-line message naming the
setting and where the value came from; the CLI prints it and exits 2.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import secrets
import ssl
import string
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from decimal import Decimal
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

from tiering.settings import TierSettings

MiB = 1024**2
GiB = 1024**3
ENV_PREFIX = "TIERSTORE_"
CREDENTIALS_FILE = "credentials.toml"
REDACTED = "***"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
ACCESS_LOG_FORMATS = ("off", "text", "json")  # see gateway/accesslog.py
MAX_WORKERS = 64  # S3 processes on one port: far above the cores a node has
# ``workers = "auto"`` (the default): one read worker per this many cores
# the process may run on (its affinity, or its cgroup's CPU quota when
# lower), at most AUTO_WORKERS_MAX; one process below two.
# A hot GET costs the same CPU in one process or spread over workers
# (docs/performance.md#read-workers), so workers only pay with cores the
# clients leave free; on a training node the trainer and its data-loading
# processes take most of them.
CORES_PER_WORKER = 8
AUTO_WORKERS_MAX = 8
# The hot tier's budget when none is configured: a share of the size of the
# filesystem that holds the data dir, at most HOT_CAP. Half leaves room for
# the index, the high watermark's overshoot and whatever else shares the
# disk; the cap keeps a gateway on a large shared filesystem from claiming
# it all. A fixed default would be too large for a small container volume
# (the disk fills before the evictor starts) and too small for an NVMe array.
HOT_SHARE = 0.5
HOT_CAP = 1024 * GiB


def _package_version() -> str:
    try:
        return metadata.version("tierstore")
    except metadata.PackageNotFoundError:
        # Running from a source tree that was never pip-installed.
        return "0.1.0"


# Reported by --version, the start-up banner and the admin API's OpenAPI info.
VERSION = _package_version()


@dataclass(frozen=True, slots=True)
class Config:
    """Everything a gateway process needs to start, already validated.

    Secret fields are left out of ``repr`` so a config that ends up in a log
    line or a traceback does not leak them; use :func:`redacted` for a full,
    safe view.
    """

    host: str = "127.0.0.1"
    port: int = 9100
    admin_host: str = "127.0.0.1"  # the admin API is loopback-only unless asked
    admin_port: int = 9101
    data_dir: Path = Path("tierstore-data")
    hot_size: int = 64 * GiB  # load_config() derives it from the data dir's filesystem
    # The size of that filesystem when hot_size was derived from it; 0 when configured.
    hot_size_from: int = 0
    capacity: str = ""  # "file:///dir" or "s3://bucket[/prefix]"; "" = embedded
    capacity_endpoint: str | None = None
    capacity_region: str | None = None
    capacity_access_key: str | None = None
    capacity_secret_key: str | None = field(default=None, repr=False)
    region: str = "us-east-1"
    domain: str | None = None
    credentials: dict[str, str] = field(default_factory=dict, repr=False)
    admin_token: str = field(default="", repr=False)
    log_level: str = "info"
    access_log: str = "text"  # one line per S3 request on stderr: off, text or json
    # Capacity-tier layout and timing (docs/configuration.md explains each).
    small_object_size: int = 4 * MiB
    part_size: int = 8 * MiB
    segment_size: int = 64 * MiB
    flush_delay: float = 5.0
    compression: bool = True
    write_through: bool = False  # the policy new buckets get
    compact_threshold: float = 0.5
    # Seconds a client may take to send a whole request head, or stay silent
    # in the middle of a request body (gateway/listener.py explains the bounds).
    client_timeout: float = 30.0
    # Processes serving S3 on the port: this one, or above 1 that many read
    # workers in front of it, this one the only writer (gateway/worker.py).
    workers: int = field(default_factory=lambda: auto_workers())
    # Scale-out (docs/scale-out.md): a node id makes this gateway one of
    # several over one capacity store, the writer of the buckets whose
    # lease it holds.
    node_id: str | None = None
    lease_ttl: float = 30.0
    lease_idle: float = 0.0  # 0: a lease is never given up for idleness
    follow_interval: float = 2.0
    # The gateways a cooperative warm job shares its work with, by node id
    # (this one included): node id -> S3 endpoint URL.
    peers: dict[str, str] = field(default_factory=dict)
    # TLS on both ports (S3 and admin) when a certificate and its key are
    # given: PEM files, the certificate file holding the chain. ``tls_ca``
    # is the CA bundle this gateway trusts for https peers (and the one
    # `tierstore env` tells clients to trust); unset, the system's.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None

    @property
    def capacity_url(self) -> str:
        """The capacity store URL, with the embedded default resolved.

        The default is absolute: a relative ``file://tierstore-data/...`` would
        read ``tierstore-data`` as a host name (RFC 8089).
        """
        if self.capacity:
            return self.capacity
        return Path(os.path.abspath(self.data_dir / "capacity")).as_uri()

    @property
    def scheme(self) -> str:
        """How both ports are reached: ``https`` with a certificate, else ``http``."""
        return "https" if self.tls_cert is not None else "http"


# Fields whose values never leave the process: not logged, not printed unless
# generated (see server banner), replaced by REDACTED in redacted().
SECRET_FIELDS = frozenset({"capacity_secret_key", "admin_token"})


# --------------------------------------------------------------------------
# Sizes


_SIZE = re.compile(r"(?P<num>\d+(?:\.\d+)?)\s*(?:(?P<unit>[KMGT])(?:I?B)?|B)?", re.IGNORECASE)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Parse a byte count: ``"512M"`` -> 536870912.

    Accepts a plain integer or a number with a binary K/M/G/T suffix
    (1K = 1024), optionally followed by ``B`` or ``iB``; case does not matter.
    Fractions are allowed when they come to a whole number of bytes (``1.5G``).
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"invalid size {text!r}: expected a number of bytes with an optional "
            "K, M, G or T suffix (binary, 1K = 1024), e.g. 512M or 64G"
        )
    value = Decimal(match["num"]) * _UNIT[(match["unit"] or "").upper()]
    if value != value.to_integral_value():
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


# --------------------------------------------------------------------------
# Per-setting validation. Each coercer takes (name, raw value, source) and
# returns the typed value or raises ValueError through _invalid().


def _invalid(name: str, raw: object, source: str, why: str) -> ValueError:
    shown = "" if name in SECRET_FIELDS else f" {raw!r}"
    return ValueError(f"invalid {name}{shown} (from {source}): {why}")


def _text(name: str, raw: object, source: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise _invalid(name, raw, source, "expected a non-empty string")
    return raw.strip()


def _optional_text(name: str, raw: object, source: str) -> str | None:
    if isinstance(raw, str) and not raw.strip():
        return None
    return _text(name, raw, source)


def _port(name: str, raw: object, source: str) -> int:
    # bool is an int subclass: `port = true` in TOML must not mean port 1.
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 65535:
        raise _invalid(name, raw, source, "expected a port number 0..65535 (0 picks a free port)")
    return raw


def auto_workers(cores: int | None = None) -> int:
    """``workers = "auto"``: the processes serving S3 for ``cores`` (by
    default :func:`available_cores`), see CORES_PER_WORKER."""
    if cores is None:
        cores = available_cores()
    workers = min(AUTO_WORKERS_MAX, cores // CORES_PER_WORKER)
    return workers if workers >= 2 else 1


def available_cores(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may run on (its CPU affinity), fewer when its
    cgroup has a CPU quota (a container started with ``--cpus``)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota = quota_cores(cpu_max.read_text())
    except OSError:  # no cgroup v2 here
        return cores
    return min(cores, quota) if quota is not None else cores


def quota_cores(cpu_max: str) -> int | None:
    """The cores a cgroup v2 ``cpu.max`` ("QUOTA PERIOD", or "max PERIOD")
    allows, rounded up; None without a quota, or for what it cannot read."""
    fields = cpu_max.split()
    if len(fields) != 2 or not fields[0].isdigit() or not fields[1].isdigit() or int(fields[1]) == 0:
        return None
    return max(1, -(-int(fields[0]) // int(fields[1])))


def _workers(name: str, raw: object, source: str) -> int:
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return auto_workers()
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_WORKERS:
        raise _invalid(name, raw, source, f'expected "auto" or a number of processes, 1..{MAX_WORKERS}')
    return raw


_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _node_id(name: str, raw: object, source: str) -> str | None:
    text = _optional_text(name, raw, source)
    if text is not None and not _NODE_ID.fullmatch(text):
        raise _invalid(name, raw, source, "expected 1..63 letters, digits, '.', '_' or '-'")
    return text


def _peers(name: str, raw: object, source: str) -> dict[str, str]:
    """``{"n1": "http://...", ...}`` from a TOML table or ``n1=URL,n2=URL``."""
    if isinstance(raw, str):
        pairs = [item.partition("=") for item in raw.split(",") if item.strip()]
        if any(not sep for _, sep, _ in pairs):
            raise _invalid(name, raw, source, "expected node=URL pairs separated by commas")
        raw = {node.strip(): url.strip() for node, _, url in pairs}
    if not isinstance(raw, dict):
        raise _invalid(name, raw, source, "expected a table of node id = S3 endpoint URL")
    peers = {}
    for node, url in raw.items():
        endpoint = _endpoint(name, url, source)
        if endpoint is None:
            raise _invalid(name, raw, source, f"no URL for node {node!r}")
        peers[_node_id(name, node, source)] = endpoint
    return peers


def _lease_ttl(name: str, raw: object, source: str) -> float:
    ttl = _seconds(name, raw, source)
    if ttl < 2:
        raise _invalid(name, raw, source, "expected at least 2 seconds")
    return ttl


def _lease_idle(name: str, raw: object, source: str) -> float:
    try:
        value = float(raw) if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else None
    except ValueError:
        value = None
    if value is None or not (value == 0 or 1 <= value <= 86_400):
        raise _invalid(name, raw, source, "expected 0 (never) or a number of seconds from 1 to 86400")
    return value


def _size(name: str, raw: object, source: str) -> int:
    if isinstance(raw, str):
        try:
            raw = parse_size(raw)
        except ValueError as exc:
            raise _invalid(name, raw, source, str(exc).partition(": ")[2]) from None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
        raise _invalid(name, raw, source, "expected a size greater than 0, e.g. 512M or 64G")
    return raw


def _path(name: str, raw: object, source: str) -> Path:
    if isinstance(raw, Path):
        raw = str(raw)
    return Path(_text(name, raw, source)).expanduser()


def _optional_path(name: str, raw: object, source: str) -> Path | None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    return _path(name, raw, source)


def _capacity(name: str, raw: object, source: str) -> str:
    if isinstance(raw, str) and not raw.strip():
        return ""  # the embedded default, resolved by Config.capacity_url
    url = _text(name, raw, source)
    parts = urlsplit(url)
    if parts.scheme == "file":
        # RFC 8089: file://host/path; only the local host makes sense here.
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise _invalid(name, raw, source, "expected file:///absolute/dir")
    elif parts.scheme == "s3":
        if not parts.netloc or parts.query or parts.fragment or "@" in parts.netloc:
            raise _invalid(name, raw, source, "expected s3://bucket or s3://bucket/prefix")
    else:
        raise _invalid(name, raw, source, "expected file:///dir or s3://bucket[/prefix]")
    return url


def _endpoint(name: str, raw: object, source: str) -> str | None:
    url = _optional_text(name, raw, source)
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _invalid(name, raw, source, "expected an http:// or https:// URL")
    if parts.username or parts.password:
        # Keys in a URL end up in logs and in redacted(); they have their own settings.
        raise _invalid(
            name, raw, source, "use capacity_access_key/capacity_secret_key, not user:pass@"
        )
    return url


def _domain(name: str, raw: object, source: str) -> str | None:
    domain = _optional_text(name, raw, source)
    if domain is None:
        return None
    if "/" in domain or ":" in domain:
        raise _invalid(name, raw, source, "expected a bare DNS name such as s3.example.com")
    return domain.strip(".").lower()


def _log_level(name: str, raw: object, source: str) -> str:
    level = _text(name, raw, source).lower()
    if level not in LOG_LEVELS:
        raise _invalid(name, raw, source, f"expected one of {', '.join(LOG_LEVELS)}")
    return level


def _access_log(name: str, raw: object, source: str) -> str:
    fmt = _text(name, raw, source).lower()
    if fmt not in ACCESS_LOG_FORMATS:
        raise _invalid(name, raw, source, f"expected one of {', '.join(ACCESS_LOG_FORMATS)}")
    return fmt


def _seconds(name: str, raw: object, source: str) -> float:
    try:
        value = float(raw) if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else None
    except ValueError:
        value = None
    if value is None or not 0 < value <= 3600:
        raise _invalid(name, raw, source, "expected a number of seconds, more than 0 and at most 3600")
    return value


def _fraction(name: str, raw: object, source: str) -> float:
    try:
        value = float(raw) if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else None
    except ValueError:
        value = None
    if value is None or not 0 <= value <= 1:
        raise _invalid(name, raw, source, "expected a fraction between 0 and 1")
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _bool(name: str, raw: object, source: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _TRUE + _FALSE:
        return raw.strip().lower() in _TRUE
    raise _invalid(name, raw, source, "expected true or false")


def _part_size(name: str, raw: object, source: str) -> int:
    size = _size(name, raw, source)
    # S3 multipart parts (segments are streamed as them) are at least 5 MiB.
    if size < 5 * MiB:
        raise _invalid(name, raw, source, "expected at least 5M")
    return size


_Coercer = Callable[[str, object, str], object]

# Every setting that flags, environment and file can give, in Config order.
# `credentials` is not here: it is a table, assembled by _credentials().
_COERCE: dict[str, _Coercer] = {
    "host": _text,
    "port": _port,
    "admin_host": _text,
    "admin_port": _port,
    "data_dir": _path,
    "hot_size": _size,
    "capacity": _capacity,
    "capacity_endpoint": _endpoint,
    "capacity_region": _optional_text,
    "capacity_access_key": _optional_text,
    "capacity_secret_key": _optional_text,
    "region": _text,
    "domain": _domain,
    "admin_token": _optional_text,
    "log_level": _log_level,
    "access_log": _access_log,
    "small_object_size": _size,
    "part_size": _part_size,
    "segment_size": _part_size,
    "flush_delay": _seconds,
    "compression": _bool,
    "write_through": _bool,
    "compact_threshold": _fraction,
    "client_timeout": _seconds,
    "workers": _workers,
    "node_id": _node_id,
    "lease_ttl": _lease_ttl,
    "lease_idle": _lease_idle,
    "follow_interval": _seconds,
    "peers": _peers,
    "tls_cert": _optional_path,
    "tls_key": _optional_path,
    "tls_ca": _optional_path,
}


# --------------------------------------------------------------------------
# Sources


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
    unknown = sorted(set(data) - set(_COERCE))
    if not unknown:
        return
    key = unknown[0]
    hint = ""
    if key in ("access_key", "secret_key"):
        hint = ' (gateway key pairs go in a [credentials] table: access_key = "secret_key")'
    elif close := difflib.get_close_matches(key.replace("-", "_"), _COERCE, n=1):
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


def _env(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None  # empty counts as unset


def env_key_pair(env: Mapping[str, str]) -> dict[str, str]:
    """TIERSTORE_ACCESS_KEY/SECRET_KEY as {access: secret}, {} if neither; both or neither."""
    access = _env(env, env_name("access_key"))
    secret = _env(env, env_name("secret_key"))
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


def _pick(
    name: str, cli: Mapping[str, object | None], env: Mapping[str, str], file: ConfigFile | None
) -> tuple[object, str] | None:
    """The winning raw value of one setting and a label saying where it came from."""
    if (value := cli.get(name)) is not None:
        return value, flag_name(name)
    if (text := _env(env, env_name(name))) is not None:
        return text, env_name(name)
    if file is not None and name in file.values:
        return file.values[name], file.source(name)
    return None


# --------------------------------------------------------------------------
# Generated secrets


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


def _generated(data_dir: Path, *, need_pair: bool, need_token: bool) -> tuple[dict[str, str], str]:
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


# --------------------------------------------------------------------------
# Loading


def load_config(
    cli: Mapping[str, object | None],
    env: Mapping[str, str] = os.environ,
    config_file: Path | None = None,
) -> Config:
    """Build the Config from flags, environment, file and defaults.

    ``cli`` maps setting names (``hot_size``) to flag values; None means the
    flag was not given. Without ``config_file``, ``TIERSTORE_CONFIG`` names
    the file, if set. May create ``<data_dir>/credentials.toml``.
    """
    if unknown := sorted(set(cli) - set(_COERCE)):
        raise ValueError(f"unknown setting {unknown[0]!r}")
    if config_file is None and (named := _env(env, env_name("config"))) is not None:
        config_file = Path(named).expanduser()
    file = read_config_file(config_file) if config_file is not None else None

    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for name, coerce in _COERCE.items():
        if (picked := _pick(name, cli, env, file)) is not None:
            raw, sources[name] = picked
            values[name] = coerce(name, raw, sources[name])
    config = Config(**values)  # type: ignore[arg-type]
    if "hot_size" not in values:
        budget, filesystem = default_hot_size(config.data_dir)
        config = replace(config, hot_size=budget, hot_size_from=filesystem)
    _check_combinations(config, sources)
    return _with_secrets(config, env, file)


def default_hot_size(data_dir: Path) -> tuple[int, int]:
    """The hot tier's default budget for ``data_dir`` (HOT_SHARE of its
    filesystem, at most HOT_CAP, in whole MiB), and that filesystem's size.
    The data dir need not exist yet: its nearest existing parent is measured."""
    where = Path(os.path.abspath(data_dir))
    while not where.exists() and where != where.parent:
        where = where.parent
    stat = os.statvfs(where)
    filesystem = stat.f_blocks * stat.f_frsize
    budget = min(HOT_CAP, int(filesystem * HOT_SHARE)) // MiB * MiB
    return max(budget, MiB), filesystem


def tier_settings(config: Config) -> TierSettings:
    """What the tiering layer needs of the configuration."""
    return TierSettings(
        hot_size=config.hot_size,
        small_object_size=config.small_object_size,
        part_size=config.part_size,
        segment_size=config.segment_size,
        flush_delay=config.flush_delay,
        compression=config.compression,
        compact_threshold=config.compact_threshold,
        write_through=config.write_through,
        node_id=config.node_id,
        lease_ttl=config.lease_ttl,
        lease_idle=config.lease_idle,
        follow_interval=config.follow_interval,
    )


def _check_combinations(config: Config, sources: Mapping[str, str]) -> None:
    if config.small_object_size > config.segment_size:
        raise ValueError(
            f"small_object_size ({config.small_object_size}) is larger than segment_size "
            f"({config.segment_size}): a packed segment must hold at least one small object"
        )
    if (config.capacity_access_key is None) != (config.capacity_secret_key is None):
        given, missing = ("capacity_access_key", "capacity_secret_key")
        if config.capacity_access_key is None:
            given, missing = missing, given
        raise ValueError(f"{given} is set (from {sources[given]}) but {missing} is not: set both")
    _check_tls(config, sources)
    if config.port == config.admin_port != 0 and config.host == config.admin_host:
        raise ValueError(
            f"port and admin_port are both {config.port} "
            f"(from {sources.get('port', 'default')} and {sources.get('admin_port', 'default')})"
        )


def _check_tls(config: Config, sources: Mapping[str, str]) -> None:
    """Certificate and key both or neither, and loadable: a mistake here is
    one line at start, not a server that fails every handshake."""
    if (config.tls_cert is None) != (config.tls_key is None):
        given, missing = ("tls_cert", "tls_key") if config.tls_key is None else ("tls_key", "tls_cert")
        raise ValueError(f"{given} is set (from {sources[given]}) but {missing} is not: set both")
    if config.tls_cert is not None and config.tls_key is not None:
        try:
            server_tls(config.tls_cert, config.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot use tls_cert {config.tls_cert} (from {sources['tls_cert']}) with tls_key "
                f"{config.tls_key} (from {sources['tls_key']}): {_tls_reason(exc)}"
            ) from None
    if config.tls_ca is not None:
        try:
            client_tls(config.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot use tls_ca {config.tls_ca} (from {sources['tls_ca']}): {_tls_reason(exc)}"
            ) from None


def server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for ``cert`` (the chain) and ``key``, as uvicorn
    makes one (Python's default: TLS 1.2 at least)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def client_tls(ca: Path | None) -> ssl.SSLContext:
    """A client context that verifies servers against ``ca`` (a PEM bundle),
    or the system's CAs when None."""
    return ssl.create_default_context(cafile=None if ca is None else str(ca))


def _tls_reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)  # e.g. KEY_VALUES_MISMATCH, NO_START_LINE
    return exc.strerror or str(exc)


def _with_secrets(config: Config, env: Mapping[str, str], file: ConfigFile | None) -> Config:
    credentials = dict(file.credentials) if file is not None else {}
    credentials.update(env_key_pair(env))  # the environment wins for the same key id
    token = config.admin_token
    if credentials and token:
        return replace(config, credentials=credentials)
    pair, generated_token = _generated(
        config.data_dir, need_pair=not credentials, need_token=not token
    )
    return replace(config, credentials=credentials or pair, admin_token=token or generated_token)


def redacted(config: Config) -> dict[str, object]:
    """A JSON-able view of ``config`` with every secret replaced by ``***``.

    Access key ids stay visible (they identify, they do not authenticate);
    their secret keys do not.
    """
    view: dict[str, object] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        if f.name in SECRET_FIELDS and value:
            value = REDACTED
        elif f.name == "credentials":
            value = {access_key: REDACTED for access_key in value}
        elif isinstance(value, Path):
            value = str(value)
        view[f.name] = value
    view["capacity_url"] = config.capacity_url
    return view
