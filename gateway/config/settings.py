"""Every setting flags, environment and the --config file can give, and how
its raw value is checked and typed.

Each coercer takes (name, raw value, source) and returns the typed value or
raises ValueError through _invalid(), naming the setting and where the value
came from.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from gateway.config.cores import MAX_WORKERS, auto_workers
from gateway.config.sizes import MiB, parse_size
from tiering.memo import KINDS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
ACCESS_LOG_FORMATS = ("off", "text", "json")  # see gateway/observability/accesslog.py

# Fields whose values never leave the process: not logged, not printed unless
# generated (see server banner), replaced by REDACTED in gateway.config.values.redacted().
SECRET_FIELDS = frozenset({"capacity_secret_key", "admin_token"})


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


def _table(name: str, raw: object, source: str, pair: str, table: str) -> dict[object, object]:
    """A TOML table, or the same as ``a=1,b=2`` (flags and environment);
    ``pair`` and ``table`` name what is expected, for the error."""
    if isinstance(raw, str):
        pairs = [item.partition("=") for item in raw.split(",") if item.strip()]
        if any(not sep for _, sep, _ in pairs):
            raise _invalid(name, raw, source, f"expected {pair} pairs separated by commas")
        raw = {left.strip(): right.strip() for left, _, right in pairs}
    if not isinstance(raw, dict):
        raise _invalid(name, raw, source, f"expected a table of {table}")
    return raw


def _peers(name: str, raw: object, source: str) -> dict[str, str]:
    """``{"n1": "http://...", ...}`` from a TOML table or ``n1=URL,n2=URL``."""
    raw = _table(name, raw, source, "node=URL", "node id = S3 endpoint URL")
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


_NO_LIMIT = ("0", "none", "off")


def _memory_limit(name: str, raw: object, source: str) -> int:
    """A size, or 0 / "none": no budget (not even the container's)."""
    if raw == 0 or (isinstance(raw, str) and raw.strip().lower() in _NO_LIMIT):
        return 0
    limit = _size(name, raw, source)
    if limit < 64 * MiB:
        raise _invalid(name, raw, source, "expected at least 64M (or none)")
    return limit


def _cache_sizes(name: str, raw: object, source: str) -> dict[str, int]:
    """``{"records": 268435456, ...}`` from a TOML table or ``records=256M,heads=16M``."""
    raw = _table(name, raw, source, "cache=size", "cache = size")
    if (unknown := next((kind for kind in raw if kind not in KINDS), None)) is not None:
        raise _invalid(name, raw, source, f"no cache is called {unknown!r} (known: {', '.join(KINDS)})")
    return {str(kind): _size(f"{name}.{kind}", size, source) for kind, size in raw.items()}


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


Coercer = Callable[[str, object, str], object]

# Every setting that flags, environment and file can give, in Config order.
# `credentials` is not here: it is a table, assembled by gateway.config.values.load_config().
COERCERS: dict[str, Coercer] = {
    "host": _text,
    "port": _port,
    "admin_host": _text,
    "admin_port": _port,
    "data_dir": _path,
    "hot_size": _size,
    "free_floor": _size,
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
    "memory_limit": _memory_limit,
    "cache_sizes": _cache_sizes,
    "workers": _workers,
    "node_id": _node_id,
    "lease_ttl": _lease_ttl,
    "lease_idle": _lease_idle,
    "follow_interval": _seconds,
    "follow_fallback": _seconds,
    "heartbeat_interval": _seconds,
    "members_interval": _seconds,
    "peers": _peers,
    "advertise_url": _endpoint,
    "tls_cert": _optional_path,
    "tls_key": _optional_path,
    "tls_ca": _optional_path,
    "secrets_key_file": _optional_path,
}
