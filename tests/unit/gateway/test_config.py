"""Configuration: precedence, parsing, validation, generated secrets, redaction."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from gateway.client.sources import credentials_path
from gateway.config.cores import auto_workers, available_cores, quota_cores
from gateway.config.memory import cgroup_limit
from gateway.config.sizes import GiB, MiB, parse_size
from gateway.config.values import (
    REDACTED,
    Config,
    check_serving,
    default_hot_size,
    load_config,
    redacted,
    tier_settings,
)
from tests.tls import Pki, make_pki


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own TIERSTORE_* variables must not leak into tests."""
    for name in list(os.environ):
        if name.startswith("TIERSTORE_"):
            monkeypatch.delenv(name)


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tierstore.toml"
    path.write_text(text)
    return path


def _load(tmp_path: Path, cli: dict[str, object | None] | None = None, **kw: object) -> Config:
    """load_config with the data dir (and its generated secrets) under tmp."""
    flags: dict[str, object | None] = {"data_dir": tmp_path / "data"}
    flags.update(cli or {})
    kw.setdefault("env", {})
    return load_config(flags, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# Defaults and precedence


def test_defaults(tmp_path: Path) -> None:
    config = _load(tmp_path)
    assert (config.host, config.port) == ("127.0.0.1", 9100)
    assert (config.admin_host, config.admin_port) == ("127.0.0.1", 9101)
    assert (config.hot_size, config.hot_size_from) == default_hot_size(tmp_path / "data")
    assert config.region == "us-east-1"
    assert config.domain is None
    assert config.log_level == "info"
    assert config.capacity == ""
    assert config.capacity_url == (tmp_path / "data" / "capacity").resolve().as_uri()


def test_default_data_dir_is_relative() -> None:
    assert Config().data_dir == Path("tierstore-data")
    assert Config().capacity_url.startswith("file:///")  # absolute, never file://tierstore-data


@pytest.mark.parametrize(
    ("flag", "env", "file", "expected"),
    [
        (1111, "2222", 3333, 1111),
        (None, "2222", 3333, 2222),
        (None, None, 3333, 3333),
        (None, None, None, 9100),
    ],
)
def test_precedence_flag_env_file_default(
    tmp_path: Path, flag: int | None, env: str | None, file: int | None, expected: int
) -> None:
    path = _toml(tmp_path, f"port = {file}\n" if file is not None else "")
    environ = {"TIERSTORE_PORT": env} if env is not None else {}
    config = _load(tmp_path, {"port": flag}, env=environ, config_file=path)
    assert config.port == expected


def test_precedence_per_setting(tmp_path: Path) -> None:
    """Each setting is resolved on its own: sources mix."""
    path = _toml(tmp_path, 'hot_size = "1G"\nregion = "file-region"\ndomain = "s3.file"\n')
    env = {"TIERSTORE_HOT_SIZE": "2G", "TIERSTORE_REGION": "env-region"}
    config = _load(tmp_path, {"hot_size": "3G"}, env=env, config_file=path)
    assert config.hot_size == 3 * GiB  # flag
    assert config.region == "env-region"  # env over file
    assert config.domain == "s3.file"  # file over default


def test_empty_env_counts_as_unset(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'region = "file-region"\n')
    config = _load(tmp_path, env={"TIERSTORE_REGION": ""}, config_file=path)
    assert config.region == "file-region"


def test_env_names_config_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, "admin_port = 7000\n")
    config = _load(tmp_path, env={"TIERSTORE_CONFIG": str(path)})
    assert config.admin_port == 7000


def test_env_data_dir(tmp_path: Path) -> None:
    config = load_config({}, env={"TIERSTORE_DATA_DIR": str(tmp_path / "d")})
    assert config.data_dir == tmp_path / "d"
    assert credentials_path(tmp_path / "d").exists()


def test_capacity_urls(tmp_path: Path) -> None:
    env = {"TIERSTORE_CAPACITY": "s3://training/datasets"}
    assert _load(tmp_path, env=env).capacity_url == "s3://training/datasets"
    assert _load(tmp_path, {"capacity": "file:///srv/cap"}).capacity_url == "file:///srv/cap"


# --------------------------------------------------------------------------
# Sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("4096", 4096),
        ("1K", 1024),
        ("512M", 512 * 1024**2),
        ("512m", 512 * 1024**2),
        ("64G", 64 * GiB),
        ("64GiB", 64 * GiB),
        ("64GB", 64 * GiB),
        ("2T", 2 * 1024**4),
        ("1.5G", 3 * GiB // 2),
        (" 100B ", 100),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "12Q", "-1G", "1.2.3M", "0.1K", "1e9", "64 G B"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_hot_size_zero_names_setting_and_source(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"hot_size.*TIERSTORE_HOT_SIZE"):
        _load(tmp_path, env={"TIERSTORE_HOT_SIZE": "0"})


def test_hot_size_bad_suffix_from_flag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"invalid hot_size '12Q' \(from --hot-size\)"):
        _load(tmp_path, {"hot_size": "12Q"})


def test_hot_size_integer_in_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, "hot_size = 1048576\n")
    assert _load(tmp_path, config_file=path).hot_size == 1024**2


# --------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize("port", ["65536", "-1", "http", "80.5"])
def test_bad_port_from_env(tmp_path: Path, port: str) -> None:
    with pytest.raises(ValueError, match=r"invalid port .*from TIERSTORE_PORT"):
        _load(tmp_path, env={"TIERSTORE_PORT": port})


@pytest.mark.parametrize("workers", ["0", "65", "two", "1.5", "-2"])
def test_bad_workers_from_env(tmp_path: Path, workers: str) -> None:
    with pytest.raises(ValueError, match=r"invalid workers .*from TIERSTORE_WORKERS.*1\.\.64"):
        _load(tmp_path, env={"TIERSTORE_WORKERS": workers})


def test_workers(tmp_path: Path) -> None:
    assert _load(tmp_path).workers == auto_workers(available_cores())
    assert _load(tmp_path, env={"TIERSTORE_WORKERS": "4"}).workers == 4
    assert _load(tmp_path, env={"TIERSTORE_WORKERS": "auto"}).workers == auto_workers()
    assert _load(tmp_path, config_file=_toml(tmp_path, 'workers = "auto"\n')).workers == auto_workers()
    with pytest.raises(ValueError, match="workers"):
        _load(tmp_path, config_file=_toml(tmp_path, "workers = true\n"))


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (8, 1), (15, 1), (16, 2), (24, 3),
                                                (64, 8), (256, 8)])
def test_auto_workers_leave_most_cores_to_the_clients(cores: int, workers: int) -> None:
    assert auto_workers(cores) == workers


@pytest.mark.parametrize(("cpu_max", "cores"), [("max 100000", None), ("200000 100000", 2), ("150000 100000", 2),
                                                ("50000 100000", 1), ("1600000 100000\n", 16), ("", None),
                                                ("max", None), ("12 0", None), ("-1 100000", None)])
def test_a_containers_cpu_quota_counts_as_its_cores(cpu_max: str, cores: int | None) -> None:
    assert quota_cores(cpu_max) == cores


def test_available_cores_are_the_affinity_or_the_quota_below_it(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert available_cores(tmp_path / "absent") == affinity
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cores(tmp_path / "cpu.max") == affinity
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert available_cores(tmp_path / "cpu.max") == 1


def test_scale_out_settings(tmp_path: Path) -> None:
    config = _load(tmp_path)
    assert (config.node_id, config.lease_ttl, config.follow_interval, config.peers) == (None, 30.0, 2.0, {})
    assert config.lease_idle == 0
    assert (config.heartbeat_interval, config.members_interval, config.peer_connections) == (10.0, 20.0, 64)
    config = _load(tmp_path, env={"TIERSTORE_NODE_ID": "node-a.1", "TIERSTORE_LEASE_TTL": "6",
                                  "TIERSTORE_LEASE_IDLE": "600", "TIERSTORE_HEARTBEAT_INTERVAL": "3",
                                  "TIERSTORE_MEMBERS_INTERVAL": "4.5", "TIERSTORE_PEER_CONNECTIONS": "16",
                                  "TIERSTORE_PEERS": "node-a.1=http://10.0.0.1:9100, b=https://b:443"})
    assert config.node_id == "node-a.1" and config.lease_ttl == 6.0
    assert (tier_settings(config).heartbeat_interval, tier_settings(config).members_interval) == (3.0, 4.5)
    assert config.peer_connections == 16
    assert config.lease_idle == 600 and tier_settings(config).lease_idle == 600
    assert config.peers == {"node-a.1": "http://10.0.0.1:9100", "b": "https://b:443"}
    table = _toml(tmp_path, 'node_id = "a"\n[peers]\na = "http://a:9100"\nb = "http://b:9100"\n')
    assert _load(tmp_path, config_file=table).peers == {"a": "http://a:9100", "b": "http://b:9100"}
    assert tier_settings(config).node_id == "node-a.1"


def test_advertise_url_and_the_node_registry(tmp_path: Path) -> None:
    # A node id without peers joins the registry, at http(s)://host:port by default.
    config = _load(tmp_path, env={"TIERSTORE_NODE_ID": "a", "TIERSTORE_HOST": "10.0.0.5", "TIERSTORE_PORT": "9200"})
    assert config.registry and config.advertised_url == "http://10.0.0.5:9200"
    assert tier_settings(config).advertise_url == "http://10.0.0.5:9200"
    check_serving(config)
    assert _load(tmp_path, env={"TIERSTORE_NODE_ID": "a", "TIERSTORE_HOST": "fd00::5"}).advertised_url == \
        "http://[fd00::5]:9100"
    # On a wildcard address it must be given.
    wildcard = _load(tmp_path, env={"TIERSTORE_NODE_ID": "a", "TIERSTORE_HOST": "0.0.0.0"})
    assert wildcard.advertised_url is None
    with pytest.raises(ValueError, match="advertise_url is not set.*0.0.0.0"):
        check_serving(wildcard)
    given = _load(tmp_path, cli={"host": "::", "advertise_url": "https://node-a.example:9100"},
                  env={"TIERSTORE_NODE_ID": "a"})
    assert given.advertised_url == "https://node-a.example:9100"
    check_serving(given)
    table = _toml(tmp_path, 'node_id = "a"\nhost = "0.0.0.0"\nadvertise_url = "http://10.1.1.1:9100"\n')
    assert tier_settings(_load(tmp_path, config_file=table)).advertise_url == "http://10.1.1.1:9100"
    # With peers (or without a node id) there is no registry, and nothing to check.
    static = _load(tmp_path, env={"TIERSTORE_NODE_ID": "a", "TIERSTORE_HOST": "0.0.0.0",
                                  "TIERSTORE_PEERS": "a=http://a:9100,b=http://b:9100"})
    assert not static.registry and tier_settings(static).advertise_url is None
    check_serving(static)
    check_serving(_load(tmp_path, env={"TIERSTORE_HOST": "0.0.0.0"}))
    with pytest.raises(ValueError, match="advertise_url"):
        _load(tmp_path, env={"TIERSTORE_ADVERTISE_URL": "node-a:9100"})


@pytest.mark.parametrize(("env", "problem"), [
    ({"TIERSTORE_NODE_ID": "has space"}, "node_id"),
    ({"TIERSTORE_NODE_ID": "-leading"}, "node_id"),
    ({"TIERSTORE_LEASE_TTL": "1"}, "at least 2 seconds"),
    ({"TIERSTORE_FOLLOW_INTERVAL": "0"}, "follow_interval"),
    ({"TIERSTORE_HEARTBEAT_INTERVAL": "0"}, "heartbeat_interval"),
    ({"TIERSTORE_MEMBERS_INTERVAL": "-1"}, "members_interval"),
    ({"TIERSTORE_PEER_CONNECTIONS": "0"}, "peer_connections"),
    ({"TIERSTORE_PEER_CONNECTIONS": "many"}, "peer_connections"),
    ({"TIERSTORE_LEASE_IDLE": "0.5"}, "lease_idle"),
    ({"TIERSTORE_LEASE_IDLE": "-1"}, "lease_idle"),
    ({"TIERSTORE_PEERS": "a"}, "node=URL pairs"),
    ({"TIERSTORE_PEERS": "a=ftp://x"}, "http"),
    ({"TIERSTORE_PEERS": "a b=http://x"}, "letters, digits"),
])
def test_bad_scale_out_settings(tmp_path: Path, env: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        _load(tmp_path, env=env)


def test_port_zero_allowed(tmp_path: Path) -> None:
    config = _load(tmp_path, {"port": 0, "admin_port": 0})
    assert (config.port, config.admin_port) == (0, 0)


def test_bool_is_not_a_port(tmp_path: Path) -> None:
    path = _toml(tmp_path, "admin_port = true\n")
    with pytest.raises(ValueError, match=r"admin_port.*config file .*'admin_port'"):
        _load(tmp_path, config_file=path)


def test_same_port_twice(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="port and admin_port are both 9100"):
        _load(tmp_path, {"admin_port": 9100})


@pytest.mark.parametrize(
    "url", ["http://bucket", "s3://", "file://relative/dir", "/plain/path", "s3://b?x=1"]
)
def test_bad_capacity(tmp_path: Path, url: str) -> None:
    with pytest.raises(ValueError, match=r"invalid capacity .*from --capacity"):
        _load(tmp_path, {"capacity": url})


def test_bad_endpoint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="capacity_endpoint"):
        _load(tmp_path, {"capacity_endpoint": "minio:9000"})
    with pytest.raises(ValueError, match="user:pass"):
        _load(tmp_path, {"capacity_endpoint": "http://k:s@minio:9000"})


def test_bad_log_level(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="log_level"):
        _load(tmp_path, {"log_level": "loud"})
    assert _load(tmp_path, {"log_level": "DEBUG"}).log_level == "debug"


def test_access_log(tmp_path: Path) -> None:
    assert _load(tmp_path).access_log == "text"
    assert _load(tmp_path, env={"TIERSTORE_ACCESS_LOG": "JSON"}).access_log == "json"
    path = _toml(tmp_path, 'access_log = "off"\n')
    assert _load(tmp_path, config_file=path).access_log == "off"
    assert _load(tmp_path, env={"TIERSTORE_ACCESS_LOG": "json"}, config_file=path).access_log == "json"
    with pytest.raises(ValueError, match=r"access_log 'yaml' \(from TIERSTORE_ACCESS_LOG\): expected one of off"):
        _load(tmp_path, env={"TIERSTORE_ACCESS_LOG": "yaml"})
    with pytest.raises(ValueError, match="access_log"):
        _load(tmp_path, config_file=_toml(tmp_path, "access_log = false\n"))


def test_capacity_keys_come_in_pairs(tmp_path: Path) -> None:
    env = {"TIERSTORE_CAPACITY_ACCESS_KEY": "AK"}
    with pytest.raises(ValueError, match=r"capacity_access_key is set .* capacity_secret_key"):
        _load(tmp_path, env=env)


def test_unknown_toml_key(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'hot-size = "1G"\n')
    with pytest.raises(ValueError, match=r"unknown key 'hot-size'.*did you mean 'hot_size'"):
        _load(tmp_path, config_file=path)


def test_toml_access_key_hints_at_credentials_table(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'access_key = "AK"\n')
    with pytest.raises(ValueError, match=r"unknown key 'access_key'.*\[credentials\]"):
        _load(tmp_path, config_file=path)


def test_invalid_toml(tmp_path: Path) -> None:
    path = _toml(tmp_path, "port = \n")
    with pytest.raises(ValueError, match="not valid TOML"):
        _load(tmp_path, config_file=path)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        _load(tmp_path, config_file=tmp_path / "nope.toml")


def test_unknown_cli_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown setting 'colour'"):
        _load(tmp_path, {"colour": "blue"})


# --------------------------------------------------------------------------
# Credentials and the admin token


def test_secrets_generated_once_and_reused(tmp_path: Path) -> None:
    first = _load(tmp_path)
    ((access_key, secret_key),) = first.credentials.items()
    assert len(access_key) == 20 and access_key.isupper()
    assert len(secret_key) == 40
    assert len(first.admin_token) >= 32

    path = credentials_path(tmp_path / "data")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = _load(tmp_path)
    assert again.credentials == first.credentials
    assert again.admin_token == first.admin_token


def test_configured_pair_is_not_replaced(tmp_path: Path) -> None:
    env = {"TIERSTORE_ACCESS_KEY": "AKID", "TIERSTORE_SECRET_KEY": "s3cret"}
    config = _load(tmp_path, env=env)
    assert config.credentials == {"AKID": "s3cret"}
    # The token was still needed: it is generated, and only it is persisted.
    text = credentials_path(tmp_path / "data").read_text()
    assert config.admin_token in text
    assert "access_key" not in text


def test_env_token_wins_over_generated(tmp_path: Path) -> None:
    generated = _load(tmp_path).admin_token
    config = _load(tmp_path, env={"TIERSTORE_ADMIN_TOKEN": "tok"})
    assert config.admin_token == "tok" != generated


def test_file_table_and_env_pair_merge(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[credentials]\nAK1 = "one"\nAK2 = "two"\n')
    env = {"TIERSTORE_ACCESS_KEY": "AK2", "TIERSTORE_SECRET_KEY": "env"}
    config = _load(tmp_path, env=env, config_file=path)
    assert config.credentials == {"AK1": "one", "AK2": "env"}


def test_half_an_env_pair(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TIERSTORE_ACCESS_KEY is set but TIERSTORE_SECRET_KEY"):
        _load(tmp_path, env={"TIERSTORE_ACCESS_KEY": "AK"})


def test_bad_credentials_table(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[credentials]\nAK1 = 5\n")
    with pytest.raises(ValueError, match=r"\[credentials\]"):
        _load(tmp_path, config_file=path)


def test_unwritable_data_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"cannot (read|write) generated credentials .*directory"):
        load_config({"data_dir": blocker / "data"}, env={})


# --------------------------------------------------------------------------
# Redaction


def test_redacted_hides_every_secret(tmp_path: Path) -> None:
    env = {
        "TIERSTORE_ACCESS_KEY": "AKID",
        "TIERSTORE_SECRET_KEY": "gateway-secret",
        "TIERSTORE_ADMIN_TOKEN": "admin-token",
        "TIERSTORE_CAPACITY_ACCESS_KEY": "CAPAK",
        "TIERSTORE_CAPACITY_SECRET_KEY": "capacity-secret",
    }
    config = _load(tmp_path, env=env)
    view = redacted(config)
    text = json.dumps(view)  # JSON-able as is
    for secret in ("gateway-secret", "admin-token", "capacity-secret"):
        assert secret not in text
        assert secret not in repr(config)
    assert view["credentials"] == {"AKID": REDACTED}
    assert view["admin_token"] == REDACTED
    assert view["capacity_secret_key"] == REDACTED
    assert view["capacity_access_key"] == "CAPAK"
    assert view["data_dir"] == str(tmp_path / "data")
    assert view["capacity_url"] == config.capacity_url


def test_errors_do_not_echo_secrets(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'capacity_access_key = "AK"\ncapacity_secret_key = ["leak"]\n')
    with pytest.raises(ValueError) as info:
        _load(tmp_path, config_file=path)
    assert "capacity_secret_key" in str(info.value)
    assert "leak" not in str(info.value)


# --------------------------------------------------------------------------
# The hot tier's default budget


def _filesystem(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """Make the data dir's filesystem ``size`` bytes large (4 KiB blocks)."""
    real = os.statvfs

    def statvfs(path: object) -> os.statvfs_result:
        st = real(path)  # type: ignore[arg-type]
        fields = list(st)
        fields[0], fields[1], fields[2] = 4096, 4096, size // 4096  # bsize, frsize, blocks
        return os.statvfs_result(fields)

    monkeypatch.setattr(os, "statvfs", statvfs)


@pytest.mark.parametrize(
    ("filesystem", "budget"),
    [
        (20 * GiB, 10 * GiB),  # a small container volume: half of it, not 64 GiB
        (3 * 1024 * GiB, 1024 * GiB),  # a large array: capped
        (1 * GiB + 4096 * 3, 512 * MiB),  # whole MiB
    ],
)
def test_hot_size_defaults_to_a_share_of_the_data_dirs_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filesystem: int, budget: int
) -> None:
    _filesystem(monkeypatch, filesystem)
    config = _load(tmp_path, {"data_dir": tmp_path / "not" / "made" / "yet"})
    assert (config.hot_size, config.hot_size_from) == (budget, filesystem // 4096 * 4096)
    assert tier_settings(config).hot_size == budget


def test_a_configured_hot_size_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _filesystem(monkeypatch, 20 * GiB)
    config = _load(tmp_path, env={"TIERSTORE_HOT_SIZE": "64G"})
    assert (config.hot_size, config.hot_size_from) == (64 * GiB, 0)


# --------------------------------------------------------------------------
# TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_tls_settings_from_flags_env_and_file(tmp_path: Path, pki: Pki) -> None:
    config = _load(tmp_path, {"tls_cert": str(pki.cert)}, env={"TIERSTORE_TLS_KEY": str(pki.key)},
                   config_file=_toml(tmp_path, f'tls_ca = "{pki.ca}"\n'))
    assert (config.tls_cert, config.tls_key, config.tls_ca) == (pki.cert, pki.key, pki.ca)
    assert config.scheme == "https"
    assert _load(tmp_path).scheme == "http"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tls_cert": "cert"}, "tls_cert is set (from --tls-cert) but tls_key is not"),
        ({"tls_key": "key"}, "tls_key is set (from --tls-key) but tls_cert is not"),
        ({"tls_cert": "missing", "tls_key": "key"}, "No such file or directory"),
        ({"tls_cert": "cert", "tls_key": "other_ca"}, "cannot use tls_cert"),  # not a key
        ({"tls_cert": "ca", "tls_key": "key"}, "KEY_VALUES_MISMATCH"),  # the CA's cert, the server's key
        ({"tls_ca": "key"}, "cannot use tls_ca"),  # a key is no CA bundle
    ],
)
def test_bad_tls_settings_are_one_line_errors(
    tmp_path: Path, pki: Pki, settings: dict[str, str], message: str
) -> None:
    files = {"cert": pki.cert, "key": pki.key, "ca": pki.ca, "other_ca": pki.other_ca,
             "missing": tmp_path / "missing.pem"}
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        _load(tmp_path, {name: str(files[which]) for name, which in settings.items()})
    assert "\n" not in str(error.value)


def test_memory_limit_and_cache_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.config.values.cgroup_limit", lambda: 3 * GiB)
    derived = load_config({"data_dir": str(tmp_path)}, env={})
    assert derived.memory_limit == 3 * GiB  # the container's limit
    assert derived.cache_sizes["records"] == 3 * GiB // 64  # a share of the budget
    file = _toml(tmp_path, 'memory_limit = "none"\n[cache_sizes]\nrecords = "100M"\n')
    config = load_config({"data_dir": str(tmp_path), "cache_sizes": "heads=2M"}, env={}, config_file=file)
    assert config.memory_limit == 0  # none: not even the container's
    assert config.cache_sizes["heads"] == 2 * MiB and config.cache_sizes["records"] > 100 * MiB  # the flag won
    env = {"TIERSTORE_MEMORY_LIMIT": "2GiB", "TIERSTORE_CACHE_SIZES": "records=100M"}
    config = load_config({"data_dir": str(tmp_path)}, env=env)
    assert config.memory_limit == 2 * GiB and config.cache_sizes["records"] == 100 * MiB
    for cli, why in (({"memory_limit": "1M"}, "at least 64M"), ({"cache_sizes": "rows=1M"}, "no cache is called"),
                     ({"cache_sizes": "records"}, "pairs"), ({"cache_sizes": "records=big"}, "invalid cache_sizes.records")):
        with pytest.raises(ValueError, match=why):
            load_config({"data_dir": str(tmp_path), **cli}, env={})


def test_cgroup_memory_limit(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    assert cgroup_limit((v2, v1), machine=8 * GiB) == 0  # no cgroup files
    v1.write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_limit((v2, v1), machine=8 * GiB) == 0
    v1.write_text(f"{GiB}\n")
    assert cgroup_limit((v2, v1), machine=8 * GiB) == GiB
    v2.write_text("max\n")
    assert cgroup_limit((v2, v1), machine=8 * GiB) == 0  # v2 first
    v2.write_text(f"{2 * GiB}\n")
    assert cgroup_limit((v2, v1), machine=8 * GiB) == 2 * GiB
