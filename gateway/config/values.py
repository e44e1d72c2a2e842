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

This module holds the Config and puts it together; the parts live beside it:
``gateway.config.settings`` (each setting's checks), ``gateway.config.sources``
(flags, environment, file), ``gateway.config.credentials`` (generated secrets),
``gateway.config.tls``, ``gateway.config.cores`` (``workers = "auto"``),
``gateway.config.memory`` (the memory budget and the caches' bounds) and
``gateway.config.sizes``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from gateway.client import sources as defaults
from gateway.client.sources import ConfigFile, env_key_pair, env_name, env_value
from gateway.config.cores import auto_workers
from gateway.config.credentials import generated_secrets
from gateway.config.memory import cache_bounds, cgroup_limit
from gateway.config.settings import COERCERS, SECRET_FIELDS
from gateway.config.sizes import GiB, MiB
from gateway.config.sources import pick, read_config_file
from gateway.config.tls import check_tls
from tiering.settings import TierSettings

REDACTED = "***"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # listen addresses that name no host another node can reach

# The hot tier's budget when none is configured: a share of the size of the
# filesystem that holds the data dir, at most HOT_CAP. Half leaves room for
# the index, the high watermark's overshoot and whatever else shares the
# disk; the cap keeps a gateway on a large shared filesystem from claiming
# it all. A fixed default would be too large for a small container volume
# (the disk fills before the evictor starts) and too small for an NVMe array.
HOT_SHARE = 0.5
HOT_CAP = 1024 * GiB
# The free space the hot tier leaves on that filesystem when none is
# configured (docs/operations.md#a-full-disk): FLOOR_SHARE of it, at least
# FLOOR_MIN (room for the index's own growth and the writes in flight between
# two passes of the evictor), at most FLOOR_CAP, and never more than a
# quarter of the filesystem, so a small volume still holds data.
FLOOR_SHARE = 0.02
FLOOR_MIN = 256 * MiB
FLOOR_CAP = 16 * GiB
# The index's reserve: a quarter of the floor, at most what one reopen of the
# index can need (RocksDB's 64 MiB memtable, replayed into a table file).
RESERVE_CAP = 64 * MiB


@dataclass(frozen=True, slots=True)
class Config:
    """Everything a gateway process needs to start, already validated.

    Secret fields are left out of ``repr`` so a config that ends up in a log
    line or a traceback does not leak them; use :func:`redacted` for a full,
    safe view.
    """

    host: str = defaults.HOST
    port: int = defaults.PORT
    admin_host: str = defaults.ADMIN_HOST  # the admin API is loopback-only unless asked
    admin_port: int = defaults.ADMIN_PORT
    data_dir: Path = defaults.DATA_DIR
    hot_size: int = 64 * GiB  # load_config() derives it from the data dir's filesystem
    # The size of that filesystem when hot_size was derived from it; 0 when configured.
    hot_size_from: int = 0
    # Free bytes the hot tier leaves on its filesystem (load_config() derives
    # it from the filesystem's size unless configured).
    free_floor: int = FLOOR_MIN
    free_floor_from: int = 0  # as hot_size_from
    capacity: str = ""  # "file:///dir" or "s3://bucket[/prefix]"; "" = embedded
    capacity_endpoint: str | None = None
    capacity_region: str | None = None
    capacity_access_key: str | None = None
    capacity_secret_key: str | None = field(default=None, repr=False)
    region: str = defaults.REGION
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
    # in the middle of a request body (gateway/serving/listener.py explains the bounds).
    client_timeout: float = 30.0
    # The process's memory budget in bytes (0: none), and each cache's
    # bound by kind (tiering/memo.py; load_config() derives both from the
    # machine unless configured, docs/configuration.md#memory).
    memory_limit: int = 0
    cache_sizes: dict[str, int] = field(default_factory=dict)
    # Processes serving S3 on the port: this one, or above 1 that many read
    # workers in front of it, this one the only writer (gateway/workers/worker.py).
    workers: int = field(default_factory=lambda: auto_workers())
    # Scale-out (docs/scale-out.md): a node id makes this gateway one of
    # several over one capacity store, the writer of the buckets whose
    # lease it holds.
    node_id: str | None = None
    lease_ttl: float = 30.0
    lease_idle: float = 0.0  # 0: a lease is never given up for idleness
    follow_interval: float = 2.0
    follow_fallback: float = 30.0
    heartbeat_interval: float = 10.0  # the node registry (docs/scale-out.md#membership)
    members_interval: float = 20.0
    peer_connections: int = 64  # to all other gateways together
    # The gateways a cooperative warm job shares its work with, by node id
    # (this one included): node id -> S3 endpoint URL.
    peers: dict[str, str] = field(default_factory=dict)
    # The S3 URL other nodes reach this one at, in the node registry that a
    # node with a node id and no peers joins (docs/scale-out.md#membership);
    # by default http(s)://host:port when host is an address others can use.
    advertise_url: str | None = None
    # TLS on both ports (S3 and admin) when a certificate and its key are
    # given: PEM files, the certificate file holding the chain. ``tls_ca``
    # is the CA bundle this gateway trusts for https peers (and the one
    # `tierstore env` tells clients to trust); unset, the system's.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    # The key users' secrets are sealed under (tiering/identity/sealing.py):
    # a file apart from the index, <data_dir>/secrets.key unless set; every
    # node of a cluster needs the same one (docs/security.md).
    secrets_key_file: Path | None = None

    @property
    def secrets_key_path(self) -> Path:
        """``secrets_key_file``, else ``secrets.key`` in the data dir."""
        return self.secrets_key_file if self.secrets_key_file is not None else self.data_dir / "secrets.key"

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
    def advertised_url(self) -> str | None:
        """``advertise_url``, else ``<scheme>://<host>:<port>`` unless host
        is a wildcard address (or port 0): None when others cannot be told."""
        if self.advertise_url is not None:
            return self.advertise_url
        if self.host in WILDCARD_HOSTS or self.port == 0:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def registry(self) -> bool:
        """True when this gateway joins the node registry: a node id and no peers."""
        return self.node_id is not None and not self.peers

    @property
    def scheme(self) -> str:
        """How both ports are reached: ``https`` with a certificate, else ``http``."""
        return "https" if self.tls_cert is not None else "http"


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
    if unknown := sorted(set(cli) - set(COERCERS)):
        raise ValueError(f"unknown setting {unknown[0]!r}")
    if config_file is None and (named := env_value(env, env_name("config"))) is not None:
        config_file = Path(named).expanduser()
    file = read_config_file(config_file) if config_file is not None else None

    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for name, coerce in COERCERS.items():
        if (picked := pick(name, cli, env, file)) is not None:
            raw, sources[name] = picked
            values[name] = coerce(name, raw, sources[name])
    config = Config(**values)  # type: ignore[arg-type]
    if "hot_size" not in values:
        budget, filesystem = default_hot_size(config.data_dir)
        config = replace(config, hot_size=budget, hot_size_from=filesystem)
    if "free_floor" not in values:
        filesystem = filesystem_size(config.data_dir)
        config = replace(config, free_floor=default_free_floor(filesystem), free_floor_from=filesystem)
    if "memory_limit" not in values:
        config = replace(config, memory_limit=cgroup_limit())
    config = replace(config, cache_sizes=cache_bounds(config.cache_sizes, config.memory_limit))
    _check_combinations(config, sources)
    return _with_secrets(config, env, file)


def default_hot_size(data_dir: Path) -> tuple[int, int]:
    """The hot tier's default budget for ``data_dir`` (HOT_SHARE of its
    filesystem, at most HOT_CAP, in whole MiB), and that filesystem's size."""
    filesystem = filesystem_size(data_dir)
    budget = min(HOT_CAP, int(filesystem * HOT_SHARE)) // MiB * MiB
    return max(budget, MiB), filesystem


def filesystem_size(data_dir: Path) -> int:
    """The size of the filesystem holding ``data_dir``, which need not exist
    yet: its nearest existing parent is measured."""
    where = Path(os.path.abspath(data_dir))
    while not where.exists() and where != where.parent:
        where = where.parent
    stat = os.statvfs(where)
    return stat.f_blocks * stat.f_frsize


def default_free_floor(filesystem: int) -> int:
    """The free-space floor for a filesystem of ``filesystem`` bytes, in whole MiB."""
    floor = min(FLOOR_CAP, max(FLOOR_MIN, int(filesystem * FLOOR_SHARE)), filesystem // 4)
    return max(floor // MiB * MiB, MiB)


def index_reserve(floor: int) -> int:
    """The index's reserve beside a free-space floor of ``floor`` bytes."""
    return max(MiB, min(RESERVE_CAP, floor // 4) // MiB * MiB)


def tier_settings(config: Config) -> TierSettings:
    """What the tiering layer needs of the configuration."""
    return TierSettings(
        hot_size=config.hot_size,
        free_floor=config.free_floor,
        index_reserve=index_reserve(config.free_floor),
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
        follow_fallback=config.follow_fallback,
        heartbeat_interval=config.heartbeat_interval,
        members_interval=config.members_interval,
        advertise_url=config.advertised_url if config.registry else None,
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
    check_tls(config.tls_cert, config.tls_key, config.tls_ca, sources)
    if config.port == config.admin_port != 0 and config.host == config.admin_host:
        raise ValueError(
            f"port and admin_port are both {config.port} "
            f"(from {sources.get('port', 'default')} and {sources.get('admin_port', 'default')})"
        )


def check_serving(config: Config) -> None:
    """What ``serve`` needs beyond a valid configuration (other commands
    load the same one): a node that joins the node registry must be able
    to say where the other nodes reach it. ValueError naming the setting."""
    if config.registry and config.advertised_url is None:
        raise ValueError(
            f"advertise_url is not set: with node_id and no peers this gateway joins the node registry, "
            f"and the other nodes must be told where to reach it, which host {config.host!r} and port "
            f"{config.port} do not say; set advertise_url (--advertise-url, TIERSTORE_ADVERTISE_URL: "
            "http://<address of this node>:<port>), or give peers"
        )


def _with_secrets(config: Config, env: Mapping[str, str], file: ConfigFile | None) -> Config:
    credentials = dict(file.credentials) if file is not None else {}
    credentials.update(env_key_pair(env))  # the environment wins for the same key id
    token = config.admin_token
    if credentials and token:
        return replace(config, credentials=credentials)
    pair, generated_token = generated_secrets(
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
