"""The CLI, and process start-up (serve() and the admin API) with a fake data plane.

The real node and ``S3App`` are not needed here: ``FakeS3App`` stands for
both (the node's start/stop/started/tiering, and a raw ASGI app), so these
tests pin down what ``serve()`` promises: both ports answer, /health follows
the data plane, /config needs the token, and ``stop`` shuts everything down
in order.

The admin commands are tested without a gateway too: against nothing (a free
port) and against ``FakeApi``, answers from a table through httpx's
MockTransport; tests/integration/test_cli_admin.py runs them for real.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from gateway import server
from gateway.admin import build_admin_app
from gateway.cli import admin as cli_admin
from gateway.cli import app as cli
from gateway.cli.admin import S3Location, parse_object_url, parse_s3_url
from gateway.client.admin import AdminClient
from gateway.client.sources import credentials_path
from gateway.client.target import resolve_s3, resolve_target
from gateway.config.values import Config, load_config
from gateway.observability.metrics import Metrics
from gateway.version import VERSION
from tests.servers import free_port


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own TIERSTORE_* variables must not leak into tests."""
    for name in list(os.environ):
        if name.startswith("TIERSTORE_"):
            monkeypatch.delenv(name)


class FakeS3App:
    """Stands in for gateway.node.Node and gateway.app.S3App: answers every
    request with 200."""

    tiering = None

    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Metrics()
        self.calls: list[str] = []
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    async def start(self) -> None:
        self.calls.append("startup")
        self._started = True

    async def stop(self) -> None:
        self.calls.append("shutdown")
        self._started = False

    def workers_listening(self) -> None:
        pass

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        headers = [(b"content-type", b"text/plain"), (b"server", b"fake-s3")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"fake s3"})


def _plane(fake: FakeS3App) -> Callable[[Config], tuple[FakeS3App, FakeS3App]]:
    """serve()'s ``data_plane``: the fake as the node and as its S3 app."""
    return lambda _: (fake, fake)


def _config(tmp_path: Path, **flags: object) -> Config:
    values: dict[str, object | None] = {"data_dir": tmp_path / "data", "port": 0, "admin_port": 0}
    values.update(flags)
    return load_config(values, env={})


async def _serving(
    config: Config,
    body: Callable[[int, int], Awaitable[None]],
    fake: FakeS3App | None = None,
) -> FakeS3App:
    """Run serve() with a fake S3 app, run ``body(s3_port, admin_port)``, stop."""
    fake = fake or FakeS3App(config)
    stop = asyncio.Event()
    ready: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        server.serve(
            config,
            stop=stop,
            on_ready=lambda s3, admin: ready.set_result((s3, admin)),
            data_plane=_plane(fake),
        )
    )
    try:
        ports = await asyncio.wait_for(asyncio.shield(ready), 10)
        await body(*ports)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    return fake


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, timeout=5)  # no proxies for loopback


# --------------------------------------------------------------------------
# serve()


def test_serve_both_ports_then_clean_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    token = config.admin_token
    seen: dict[str, int] = {}

    async def body(s3_port: int, admin_port: int) -> None:
        seen.update(s3=s3_port, admin=admin_port)
        assert s3_port != 0 and admin_port != 0 and s3_port != admin_port
        async with _client() as client:
            s3 = await client.get(f"http://127.0.0.1:{s3_port}/bucket/key")
            assert (s3.status_code, s3.text) == (200, "fake s3")
            assert s3.headers.get_list("server") == ["fake-s3"]  # no second uvicorn header
            assert "date" in s3.headers

            admin = f"http://127.0.0.1:{admin_port}"
            health = await client.get(f"{admin}/health")
            assert (health.status_code, health.json()) == (200, {"status": "ok"})

            anonymous = await client.get(f"{admin}/config")
            assert anonymous.status_code == 401
            assert anonymous.json()["error"]["code"] == "Unauthorized"

            wrong = await client.get(f"{admin}/config", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401

            auth = {"Authorization": f"Bearer {token}"}
            shown = await client.get(f"{admin}/config", headers=auth)
            assert shown.status_code == 200
            assert shown.json()["admin_token"] == "***"
            assert token not in shown.text
            assert all(secret not in shown.text for secret in config.credentials.values())

            assert (await client.get(f"{admin}/openapi.json")).status_code == 200

    fake = asyncio.run(_serving(config, body))
    assert fake.calls == ["startup", "shutdown"]

    # Both ports are released once serve() returns.
    for port in (seen["s3"], seen["admin"]):
        with socket.create_server(("127.0.0.1", port)):
            pass

    out = capsys.readouterr().out
    access_key, secret_key = next(iter(config.credentials.items()))
    assert f"tierstore {VERSION} serving S3 at http://127.0.0.1:{seen['s3']}" in out
    assert access_key in out and secret_key in out  # generated: the user needs them
    assert f"admin API: http://127.0.0.1:{seen['admin']}  (token: {token})" in out


def test_banner_hides_configured_secrets(tmp_path: Path) -> None:
    env = {"TIERSTORE_ACCESS_KEY": "AKID", "TIERSTORE_SECRET_KEY": "s3cret"}
    config = load_config({"data_dir": tmp_path}, env={**env, "TIERSTORE_ADMIN_TOKEN": "tok"})
    text = server.banner(config, 9100, 9101)
    assert "AKID" in text
    assert "s3cret" not in text and "tok)" not in text


def test_health_is_503_until_s3_started() -> None:
    config = Config(admin_token="tok")
    fake = FakeS3App(config)
    app = build_admin_app(config, fake)

    async def probe() -> tuple[int, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            before = (await client.get("/health")).status_code
            await fake.start()
            after = (await client.get("/health")).status_code
        return before, after

    assert asyncio.run(probe()) == (503, 200)


def test_admin_errors_use_the_json_envelope() -> None:
    config = Config(admin_token="tok")
    app = build_admin_app(config, FakeS3App(config))

    async def get(path: str, token: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            return await client.get(path, headers=headers)

    missing = asyncio.run(get("/config", None))
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert set(missing.json()["error"]) == {"code", "message"}
    unknown = asyncio.run(get("/nope", "tok"))
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "NotFound"


def test_busy_port_fails_before_startup(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        config = _config(tmp_path, port=port)
        fake = FakeS3App(config)

        async def attempt() -> None:
            await server.serve(config, data_plane=_plane(fake))

        with pytest.raises(server.StartupError, match=f"cannot listen for S3 on 127.0.0.1:{port}"):
            asyncio.run(attempt())
    assert fake.calls == []


def test_failed_s3_startup_stops_admin_server(tmp_path: Path) -> None:
    config = _config(tmp_path)

    class Broken(FakeS3App):
        async def start(self) -> None:
            raise RuntimeError("data dir is corrupt")

    with pytest.raises(RuntimeError, match="corrupt"):
        asyncio.run(server.serve(config, data_plane=_plane(Broken(config))))


def test_cancelling_serve_still_shuts_down(tmp_path: Path) -> None:
    config = _config(tmp_path)
    fake = FakeS3App(config)

    async def scenario() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(
            server.serve(config, on_ready=lambda *_: ready.set(), data_plane=_plane(fake))
        )
        await asyncio.wait_for(ready.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert fake.calls == ["startup", "shutdown"]


# --------------------------------------------------------------------------
# The command line


runner = CliRunner()


def test_version() -> None:
    result = runner.invoke(cli.app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"tierstore {VERSION}"


def test_config_error_exits_2_with_one_line(tmp_path: Path) -> None:
    result = runner.invoke(cli.app, ["serve", "--data-dir", str(tmp_path), "--hot-size", "12Q"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("tierstore: invalid hot_size '12Q' (from --hot-size)")
    assert "Traceback" not in result.output


def test_env_error_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERSTORE_PORT", "99999")
    result = runner.invoke(cli.app, ["serve", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "TIERSTORE_PORT" in result.stderr


def _capture_run(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    started: list[Config] = []
    monkeypatch.setattr(server, "run", started.append)
    return started


def test_serve_without_arguments_uses_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    started = _capture_run(monkeypatch)
    result = runner.invoke(cli.app, ["serve"])
    assert result.exit_code == 0, result.output
    (config,) = started
    assert (config.host, config.port, config.admin_host, config.admin_port) == (
        "127.0.0.1",
        9100,
        "127.0.0.1",
        9101,
    )
    assert config.data_dir == Path("tierstore-data")
    assert credentials_path(tmp_path / "tierstore-data").exists()


def test_serve_flags_reach_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = _capture_run(monkeypatch)
    toml = tmp_path / "t.toml"
    toml.write_text('region = "eu-west-1"\nport = 1234\n')
    args = ["serve", "--data-dir", str(tmp_path), "--port", "0", "--hot-size", "1G"]
    result = runner.invoke(cli.app, [*args, "--config", str(toml), "--domain", "s3.local"])
    assert result.exit_code == 0, result.output
    (config,) = started
    assert (config.port, config.hot_size, config.region) == (0, 1 << 30, "eu-west-1")
    assert config.domain == "s3.local"


def test_serve_access_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = _capture_run(monkeypatch)
    result = runner.invoke(cli.app, ["serve", "--data-dir", str(tmp_path), "--access-log", "json"])
    assert result.exit_code == 0, result.output
    assert started[0].access_log == "json"
    bad = runner.invoke(cli.app, ["serve", "--data-dir", str(tmp_path), "--access-log", "loud"])
    assert bad.exit_code == 2 and "--access-log" in bad.stderr


def test_recover_shares_the_storage_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway import storage

    seen: list[Config] = []

    async def fake_recover(config: Config, progress: object) -> object:
        seen.append(config)
        raise RuntimeError("stop here")

    monkeypatch.setattr(storage, "run_recover", fake_recover)
    args = ["--data-dir", str(tmp_path), "--capacity", "s3://cap/prefix", "--region", "eu-west-1"]
    result = runner.invoke(cli.app, ["recover", *args])
    assert (result.exit_code, result.stderr) == (1, "tierstore: stop here\n")
    assert (seen[0].capacity, seen[0].region) == ("s3://cap/prefix", "eu-west-1")
    assert "--hot-size" not in runner.invoke(cli.app, ["recover", "--help"]).stdout


def test_startup_error_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def busy(_: Config) -> None:
        raise server.StartupError("cannot listen for S3 on 127.0.0.1:9100: Address already in use")

    monkeypatch.setattr(server, "run", busy)
    result = runner.invoke(cli.app, ["serve", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.strip().endswith("Address already in use")


# --------------------------------------------------------------------------
# Admin API commands, without a gateway: option resolution, s3:// URLs, errors


@pytest.mark.parametrize(
    ("url", "location"),
    [
        ("s3://b", S3Location("b", "")),
        ("s3://b/", S3Location("b", "")),
        ("s3://b/data/train/", S3Location("b", "data/train/")),
        ("s3://b/a?x=1#frag", S3Location("b", "a?x=1#frag")),  # key characters, not URL syntax
    ],
)
def test_s3_urls(url: str, location: S3Location) -> None:
    assert parse_s3_url(url) == location


@pytest.mark.parametrize("url", ["b/prefix", "s3:///prefix", "http://b/k", ""])
def test_bad_s3_urls(url: str) -> None:
    with pytest.raises(ValueError, match="expected s3://bucket"):
        parse_s3_url(url)


def test_object_url_needs_a_key() -> None:
    assert parse_object_url("s3://b/k/../x") == S3Location("b", "k/../x")
    with pytest.raises(ValueError, match="no key"):
        parse_object_url("s3://b/")


def _write_token(data_dir: Path, token: str) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    credentials_path(data_dir).write_text(f'admin_token = "{token}"\n')


def test_token_precedence_flag_env_file_credentials(tmp_path: Path) -> None:
    _write_token(tmp_path / "data", "from-credentials")
    toml = tmp_path / "gw.toml"
    toml.write_text(f'data_dir = "{tmp_path / "data"}"\n')

    def token(flag: str | None, env: dict[str, str]) -> tuple[str, str]:
        target = resolve_target(
            admin_url=None, token=flag, config_file=toml, data_dir=None, env=env
        )
        return target.token, target.token_source

    assert token(None, {}) == ("from-credentials", str(tmp_path / "data" / "credentials.toml"))
    toml.write_text(f'data_dir = "{tmp_path / "data"}"\nadmin_token = "from-file"\n')
    assert token(None, {}) == ("from-file", f"config file {toml}, key 'admin_token'")
    env = {"TIERSTORE_ADMIN_TOKEN": "from-env"}
    assert token(None, env) == ("from-env", "TIERSTORE_ADMIN_TOKEN")
    assert token("from-flag", env) == ("from-flag", "--token")
    assert token(None, {"TIERSTORE_ADMIN_TOKEN": ""})[0] == "from-file"  # empty = unset


def test_generated_token_follows_the_data_dir(tmp_path: Path) -> None:
    for name in ("flag", "env", "file"):
        _write_token(tmp_path / name, f"token-{name}")
    toml = tmp_path / "gw.toml"
    toml.write_text(f'data_dir = "{tmp_path / "file"}"\n')
    env = {"TIERSTORE_DATA_DIR": str(tmp_path / "env")}

    def token(data_dir: Path | None, env: dict[str, str]) -> str:
        return resolve_target(
            admin_url=None, token=None, config_file=toml, data_dir=data_dir, env=env
        ).token

    assert token(tmp_path / "flag", env) == "token-flag"
    assert token(None, env) == "token-env"
    assert token(None, {}) == "token-file"


def test_default_data_dir_is_the_gateways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write_token(tmp_path / "tierstore-data", "generated")
    target = resolve_target(admin_url=None, token=None, config_file=None, data_dir=None, env={})
    assert (target.url, target.token) == ("http://127.0.0.1:9101", "generated")


def test_url_precedence_flag_env_file_default(tmp_path: Path) -> None:
    toml = tmp_path / "gw.toml"
    toml.write_text('admin_host = "0.0.0.0"\nadmin_port = 9201\n')

    def url(flag: str | None, env: dict[str, str], config: Path | None = toml) -> str:
        return resolve_target(
            admin_url=flag, token="t", config_file=config, data_dir=None, env=env
        ).url

    assert url(None, {}, config=None) == "http://127.0.0.1:9101"
    assert url(None, {}) == "http://127.0.0.1:9201"  # a wildcard listener is reached on loopback
    assert url(None, {"TIERSTORE_ADMIN_PORT": "9301"}) == "http://127.0.0.1:9301"
    assert url(None, {"TIERSTORE_CONFIG": str(toml)}, config=None) == "http://127.0.0.1:9201"
    env = {"TIERSTORE_ADMIN_URL": "http://gw.local:9401/"}
    assert url(None, env) == "http://gw.local:9401"
    assert url("https://[::1]:9501", env) == "https://[::1]:9501"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--admin-url", "gw:9101"], "invalid admin URL 'gw:9101' (from --admin-url)"),
        (["--config", "missing.toml"], "config file missing.toml does not exist"),
        (["--data-dir", "nowhere"], "no admin token: pass --token"),
    ],
)
def test_bad_target_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    if "--data-dir" not in flags:
        flags = [*flags, "--token", "t"]
    result = runner.invoke(cli.app, ["status", *flags])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"tierstore: {message}")
    assert result.stderr.count("\n") == 1


def test_nothing_listening_exits_1_with_a_hint() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # free: nothing listens there
    for args in (["status"], ["buckets"], ["flush"], ["jobs", "wait", "j1"]):
        result = runner.invoke(cli.app, [*args, "--admin-url", url, "--token", "t"])
        assert result.exit_code == 1, args
        assert result.stderr == (
            f"tierstore: no gateway answers at {url}: is `tierstore serve` running?\n"
        )
        assert result.stdout == ""


# A fake admin API: answers from a table, through httpx's MockTransport.

Answer = httpx.Response | Callable[[httpx.Request], httpx.Response]


class FakeApi:
    """The admin API as the CLI sees it; records every request."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[Answer]] = {}
        self.requests: list[httpx.Request] = []

    def on(self, method: str, path: str, *answers: Answer) -> None:
        """Answer ``method path`` with ``answers`` in turn, repeating the last."""
        self.routes[(method, path)] = list(answers)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.raw_path.decode().partition("?")[0]  # as sent: still quoted
        answers = self.routes.get((request.method, path))
        if not answers:
            return _api_error(404, "NotFound", f"no route {request.method} {path}")
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return answer(request) if callable(answer) else answer

    def body(self, index: int = -1) -> object:
        content = self.requests[index].content
        return json.loads(content) if content else None


def _api_error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message}})


def _job(state: str = "running", done: int = 0, **fields: object) -> dict[str, object]:
    job: dict[str, object] = {
        "id": "j1", "kind": "flush", "params": {}, "state": state,
        "created": "2026-12-03T07:10:00.000Z", "started": "2026-12-03T07:10:00.000Z",
        "finished": None if state == "running" else "2026-12-03T07:10:02.500Z",
        "progress": {"items_done": done, "items_total": 4, "bytes_done": done << 20,
                     "bytes_total": 4 << 20, "fraction": done / 4},
        "rate_bytes_per_s": 1 << 20, "eta_s": 4 - done, "errors": [], "result": None,
    }
    job.update(fields)
    return job


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()

    def client(url: str, token: str, ca: Path | None = None) -> AdminClient:
        return AdminClient(url, token, transport=httpx.MockTransport(fake), ca=ca)

    monkeypatch.setattr(cli_admin, "AdminClient", client)
    monkeypatch.setattr(cli_admin, "POLL_INTERVAL", 0)
    return fake


def _admin(*args: str) -> Any:
    return runner.invoke(cli.app, [*args, "--admin-url", "http://gw:9101", "--token", "tok"])


def test_the_resolved_url_and_token_are_used(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.on("GET", "/buckets", httpx.Response(200, json={"buckets": []}))
    _write_token(tmp_path / "data", "generated")
    monkeypatch.setenv("TIERSTORE_ADMIN_URL", "http://env-host:9201")
    result = runner.invoke(cli.app, ["buckets", "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    (request,) = api.requests
    assert str(request.url) == "http://env-host:9201/buckets"
    assert request.headers["authorization"] == "Bearer generated"
    assert "no buckets" in result.stdout


def test_refused_token_names_where_it_came_from(api: FakeApi) -> None:
    api.on("GET", "/tiers", _api_error(401, "Unauthorized", "invalid admin token"))
    result = _admin("status")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "tierstore: the admin API refused the token from --token (invalid admin token)"
    )
    assert "Traceback" not in result.output


def test_api_errors_print_the_apis_message(api: FakeApi) -> None:
    api.on("GET", "/buckets/nope", _api_error(404, "NoSuchBucket", "no bucket named 'nope'"))
    result = _admin("buckets", "show", "nope")
    assert (result.exit_code, result.stderr) == (1, "tierstore: no bucket named 'nope'\n")


def test_an_answer_that_is_not_the_admin_api(api: FakeApi) -> None:
    api.on("GET", "/pins", httpx.Response(403, text="<Error><Code>AccessDenied</Code></Error>"))
    result = _admin("pins")
    assert result.exit_code == 1
    assert "HTTP 403 Forbidden" in result.stderr and "admin port" in result.stderr


def test_json_prints_the_document_and_nothing_else(api: FakeApi) -> None:
    bucket = {"name": "b", "created": "2026-12-03T07:10:00Z", "region": "us-east-1",
              "write_through": False, "compression": True, "part_size": 8 << 20,
              "small_object_size": 4 << 20, "pinned": False}
    api.on("GET", "/buckets", httpx.Response(200, json={"buckets": [bucket]}))
    for args in (["buckets", "--json"], ["buckets", "list", "--json"]):
        result = _admin(*args)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"buckets": [bucket]}
    table = _admin("buckets")
    assert "8.0 MiB" in table.stdout and "4.0 MiB" in table.stdout


def test_bucket_flags_send_only_what_is_given(api: FakeApi) -> None:
    api.on("PATCH", "/buckets/b", httpx.Response(200, json={"name": "b"}))
    api.on("POST", "/buckets", httpx.Response(201, json={"name": "b"}))
    assert _admin("buckets", "set", "b", "--write-through", "--part-size", "16M").exit_code == 0
    assert api.body() == {"write_through": True, "part_size": 16 << 20}
    assert _admin("buckets", "create", "b", "--no-compression", "--pinned").exit_code == 0
    assert api.body() == {"name": "b", "compression": False, "pinned": True}
    nothing = _admin("buckets", "set", "b")
    assert nothing.exit_code == 2 and "nothing to change" in nothing.stderr
    bad = _admin("buckets", "create", "b", "--small-object-size", "lots")
    assert bad.exit_code == 2 and bad.stderr.startswith("tierstore: --small-object-size: invalid")


def test_job_commands_send_their_scope(api: FakeApi) -> None:
    for kind in ("flush", "compact", "evict", "pin"):
        api.on("POST", f"/jobs/{kind}", httpx.Response(202, json=_job()))
    cases = [
        (["flush"], None),
        (["compact", "--threshold", "0.25"], {"threshold": 0.25}),
        (["evict"], {}),
        (["evict", "s3://b"], {"bucket": "b"}),
        (["pin", "s3://b/train/"], {"bucket": "b", "prefix": "train/"}),
    ]
    for args, body in cases:
        result = _admin(*args, "--no-wait")
        assert result.exit_code == 0, (args, result.output)
        assert result.stdout == "j1\n"  # just the id, for scripts
        assert "tierstore jobs wait j1" in result.stderr
        assert api.body() == body
    assert _admin("compact", "--threshold", "2").exit_code == 2


def test_key_lists_are_sent_literally_and_the_key_forms_only_when_asked(api: FakeApi, tmp_path: Path) -> None:
    listing = tmp_path / "keys.txt"
    listing.write_text("s3://b/train/a.bin\na{1,2}.bin\nx/../y\n")
    api.on("POST", "/jobs/warm", httpx.Response(202, json=_job()))
    api.on("POST", "/epochs", httpx.Response(201, json={"id": "e1"}))
    keys = ["s3://b/train/a.bin", "a{1,2}.bin", "x/../y"]
    assert _admin("warm", "s3://b", "--keys-from", str(listing), "--no-wait").exit_code == 0
    assert api.body() == {"bucket": "b", "keys": keys}
    assert _admin("warm", "s3://b", "--manifest", "m.txt", "--patterns", "--urls", "--no-wait").exit_code == 0
    assert api.body() == {"bucket": "b", "manifest": "m.txt", "patterns": True, "urls": True}
    assert _admin("epochs", "start", "s3://b", "--keys-from", str(listing), "--patterns", "--json").exit_code == 0
    assert api.body() == {"bucket": "b", "readers": 1, "keys": keys, "patterns": True}
    wrong = _admin("warm", "s3://b/train/", "--patterns", "--no-wait")
    assert wrong.exit_code == 2 and "--patterns and --urls go with" in wrong.stderr
    assert _admin("epochs", "start", "s3://b/train/", "--urls").exit_code == 2


def test_wait_follows_the_job_to_success(api: FakeApi) -> None:
    done = _job("succeeded", 4, result={"segments_written": 2, "bytes_written": 3 << 20})
    api.on("POST", "/jobs/flush", httpx.Response(202, json=_job()))
    polls = (_job(done=1), _job(done=3), done)
    api.on("GET", "/jobs/j1", *(httpx.Response(200, json=j) for j in polls))
    result = _admin("flush")
    assert result.exit_code == 0, result.output
    assert [r.url.path for r in api.requests] == ["/jobs/flush", *["/jobs/j1"] * 3]
    assert "flush job j1 succeeded in 0:02" in result.stdout
    assert "3.0 MiB" in result.stdout  # bytes in results read as sizes


def test_wait_with_json_prints_the_final_job(api: FakeApi) -> None:
    done = _job("succeeded", 4, result={"evicted_bytes": 5})
    api.on("POST", "/jobs/evict", httpx.Response(202, json=_job()))
    api.on("GET", "/jobs/j1", httpx.Response(200, json=done))
    result = _admin("evict", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == done


@pytest.mark.parametrize("state", ["failed", "cancelled"])
def test_a_job_that_does_not_succeed_exits_1(api: FakeApi, state: str) -> None:
    api.on("GET", "/jobs/j1", httpx.Response(200, json=_job(state, 1, errors=["disk full"])))
    result = _admin("jobs", "wait", "j1")
    assert result.exit_code == 1
    assert result.stderr.strip().endswith(f"tierstore: job j1 {state}: disk full")


def test_ctrl_c_stops_waiting_not_the_job(api: FakeApi) -> None:
    def interrupt(_: httpx.Request) -> httpx.Response:
        raise KeyboardInterrupt

    api.on("POST", "/jobs/compact", httpx.Response(202, json=_job(kind="compact")))
    api.on("GET", "/jobs/j1", interrupt)
    result = _admin("compact")
    assert result.exit_code == 130
    assert "job j1 keeps running (`tierstore jobs cancel j1` cancels it)" in result.stderr
    assert not any(r.url.path.endswith("/cancel") for r in api.requests)


def test_where_quotes_the_key(api: FakeApi) -> None:
    obj = {"bucket": "b", "key": "a b/../c", "size": 10, "where": "hot", "chunks": [
        {"size": 10, "state": "cached", "file_id": "f1", "segment": None, "offset": None,
         "stored": None, "codec": None}]}
    api.on("GET", "/objects/b/a%20b/%2E%2E/c", httpx.Response(200, json=obj))
    result = _admin("where", "s3://b/a b/../c")
    assert result.exit_code == 0, result.output
    assert api.requests[0].url.raw_path == b"/objects/b/a%20b/%2E%2E/c"
    assert "s3://b/a b/../c" in result.stdout and "cached" in result.stdout


def test_api_text_is_not_rich_markup(api: FakeApi) -> None:
    failed = _job("failed", 1, errors=["key [/x] [bold]gone"], params={"prefix": "[/p]"})
    api.on("GET", "/jobs/j1", httpx.Response(200, json=failed))
    api.on("GET", "/jobs", httpx.Response(200, json={"jobs": [failed]}))
    for args, code, shown in [
        (["jobs"], 0, "prefix=[/p]"),
        (["jobs", "show", "j1"], 0, "key [/x] [bold]gone"),
        (["jobs", "wait", "j1"], 1, "key [/x] [bold]gone"),
    ]:
        result = _admin(*args)
        assert (result.exit_code, shown in result.stdout) == (code, True), result.output


def test_unpin_and_delete_print_empty_json(api: FakeApi) -> None:
    api.on("DELETE", "/pins", httpx.Response(204))
    api.on("DELETE", "/buckets/b", httpx.Response(204))
    result = _admin("unpin", "s3://b/p/", "--json")
    assert (result.exit_code, result.stdout.strip()) == (0, "{}")
    assert dict(api.requests[-1].url.params) == {"bucket": "b", "prefix": "p/"}
    assert _admin("buckets", "delete", "b").stdout == "deleted bucket b\n"


# Mounted buckets: mount, unmount, mounts


def _mount(**fields: object) -> dict[str, object]:
    mount: dict[str, object] = {
        "name": "data", "source": "s3://src/train", "endpoint": None, "region": None,
        "access_key": None, "secret_key": None, "freshness": 60, "serve_stale": True,
        "created": "2026-12-03T07:10:00.000Z",
    }
    mount.update(fields)
    return mount


def test_mount_sends_only_what_is_given(api: FakeApi) -> None:
    api.on("POST", "/mounts", httpx.Response(201, json=_mount()))
    result = _admin("mount", "data", "s3://src/train")
    assert result.exit_code == 0, result.output
    assert api.body() == {"name": "data", "source": "s3://src/train"}
    assert "mount data" in result.stdout and "60 s" in result.stdout

    answer = _mount(endpoint="http://minio:9000", region="eu-west-1", access_key="AK",
                    secret_key="***", freshness=300.0, serve_stale=False)
    api.on("POST", "/mounts", httpx.Response(201, json=answer))
    flags = ["--endpoint", "http://minio:9000", "--region", "eu-west-1", "--access-key", "AK",
             "--secret-key", "SK", "--freshness", "300", "--no-serve-stale"]
    result = _admin("mount", "data", "s3://src/train", *flags)
    assert result.exit_code == 0, result.output
    assert api.body() == {
        "name": "data", "source": "s3://src/train", "endpoint": "http://minio:9000",
        "region": "eu-west-1", "access_key": "AK", "secret_key": "SK", "freshness": 300.0,
        "serve_stale": False,
    }
    assert "***" in result.stdout and "SK" not in result.stdout.replace("***", "")

    result = _admin("mount", "data", "s3://src", "--freshness", "immutable", "--serve-stale",
                    "--json")
    assert result.exit_code == 0, result.output
    assert api.body() == {"name": "data", "source": "s3://src", "freshness": "immutable",
                          "serve_stale": True}
    assert json.loads(result.stdout) == answer  # the API's answer, as it is


def test_mount_secret_key_from_env(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    api.on("POST", "/mounts", httpx.Response(201, json=_mount(access_key="AK", secret_key="***")))
    monkeypatch.setenv("TIERSTORE_MOUNT_SECRET_KEY", "from-env")
    assert _admin("mount", "data", "s3://src/train", "--access-key", "AK").exit_code == 0
    assert api.body() == {"name": "data", "source": "s3://src/train", "access_key": "AK",
                          "secret_key": "from-env"}
    flag = _admin("mount", "data", "s3://src/train", "--access-key", "AK", "--secret-key", "f")
    assert flag.exit_code == 0, flag.output
    assert api.body() == {"name": "data", "source": "s3://src/train", "access_key": "AK",
                          "secret_key": "f"}  # the flag wins over the environment


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["src/train"], "expected s3://bucket or s3://bucket/prefix"),
        (["s3://src", "--freshness", "soon"], "--freshness: expected immutable or a number"),
        (["s3://src", "--freshness", "-1"], "--freshness: expected immutable or a number"),
        (["s3://src", "--freshness", "0"], "--freshness: expected immutable or a number"),
        (["s3://src", "--access-key", "AK"], "--access-key and --secret-key"),
        (["s3://src", "--secret-key", "SK"], "--access-key and --secret-key"),
    ],
)
def test_mount_usage_errors_send_nothing(api: FakeApi, args: list[str], message: str) -> None:
    result = _admin("mount", "data", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"tierstore: {message}")
    assert result.stderr.count("\n") == 1
    assert api.requests == []


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        (502, "SourceUnavailable", "source s3://src/train does not answer: AccessDenied"),
        (409, "BucketAlreadyExists", "bucket 'data' already exists"),
        (400, "InvalidBucketName", "invalid bucket name 'Data'"),
    ],
)
def test_mount_api_errors_are_one_line(
    api: FakeApi, status: int, code: str, message: str
) -> None:
    api.on("POST", "/mounts", _api_error(status, code, message))
    result = _admin("mount", "data", "s3://src/train")
    assert (result.exit_code, result.stderr) == (1, f"tierstore: {message}\n")
    assert result.stdout == "" and "Traceback" not in result.output


def test_unmount(api: FakeApi) -> None:
    api.on("DELETE", "/mounts/data", httpx.Response(204))
    result = _admin("unmount", "data")
    assert (result.exit_code, result.stdout) == (0, "unmounted data\n")
    assert _admin("unmount", "data", "--json").stdout.strip() == "{}"
    api.on("DELETE", "/mounts/nope", _api_error(404, "NoSuchMount", "no mount named 'nope'"))
    missing = _admin("unmount", "nope")
    assert (missing.exit_code, missing.stderr) == (1, "tierstore: no mount named 'nope'\n")


def test_mounts_lists_them(api: FakeApi) -> None:
    listed = {"mounts": [
        _mount(),
        _mount(name="imgs", source="s3://pics", endpoint="http://minio:9000", access_key="AK",
               secret_key="***", freshness="immutable", serve_stale=False),
    ]}
    api.on("GET", "/mounts", httpx.Response(200, json=listed), httpx.Response(200, json=listed),
           httpx.Response(200, json={"mounts": []}))
    result = _admin("mounts")
    assert result.exit_code == 0, result.output
    assert [r.url.path for r in api.requests] == ["/mounts"]
    lines = result.stdout.splitlines()
    (data,) = [line for line in lines if " data " in line]
    assert "s3://src/train" in data and "60 s" in data and "yes" in data
    (imgs,) = [line for line in lines if " imgs " in line]
    assert "http://minio:9000" in imgs and "immutable" in imgs and "no" in imgs
    assert json.loads(_admin("mounts", "--json").stdout) == listed
    assert _admin("mounts").stdout == "no mounts\n"


# --------------------------------------------------------------------------
# docs/cli.md


def _command_paths(command: Any, path: str) -> list[str]:
    """``tierstore``, ``tierstore buckets``, ``tierstore buckets create``, ..."""
    paths = [path]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        paths += _command_paths(sub, f"{path} {name}")
    return paths


def test_every_command_is_documented() -> None:
    docs = (Path(__file__).parents[3] / "docs" / "cli.md").read_text(encoding="utf-8")
    paths = _command_paths(typer.main.get_command(cli.app), "tierstore")
    assert len(paths) > 20
    missing = [p for p in paths if f"$ {p} --help" not in docs]
    assert not missing, f"docs/cli.md lacks the --help output of: {', '.join(missing)}"


def test_s3_target_precedence_env_file_generated(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    credentials_path(data).write_text('access_key = "GEN"\nsecret_key = "gen-secret"\n')
    toml = tmp_path / "gw.toml"
    toml.write_text(f'data_dir = "{data}"\nhost = "0.0.0.0"\nport = 9200\nregion = "eu-west-1"\n')

    def target(env: dict[str, str]) -> tuple[str, str, str, str]:
        s3 = resolve_s3(config_file=toml, data_dir=None, env=env)
        return s3.endpoint, s3.region, s3.access_key, s3.secret_key

    assert target({}) == ("http://127.0.0.1:9200", "eu-west-1", "GEN", "gen-secret")
    toml.write_text(f'data_dir = "{data}"\n[credentials]\nFILE = "file-secret"\n')
    assert target({}) == ("http://127.0.0.1:9100", "us-east-1", "FILE", "file-secret")
    env = {"TIERSTORE_ACCESS_KEY": "ENV", "TIERSTORE_SECRET_KEY": "env-secret", "TIERSTORE_PORT": "9300"}
    assert target(env) == ("http://127.0.0.1:9300", "us-east-1", "ENV", "env-secret")
    assert "env-secret" not in repr(resolve_s3(config_file=toml, data_dir=None, env=env))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no S3 key pair: set TIERSTORE_ACCESS_KEY"),
        ({"TIERSTORE_PORT": "0"}, "port is 0 (from TIERSTORE_PORT): the gateway picked a free port"),
        ({"TIERSTORE_PORT": "http"}, "invalid port 'http' (from TIERSTORE_PORT)"),
    ],
)
def test_env_command_errors_exit_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("TIERSTORE_ACCESS_KEY", "TIERSTORE_SECRET_KEY", "TIERSTORE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    if env:
        monkeypatch.setenv("TIERSTORE_ACCESS_KEY", "AK")
        monkeypatch.setenv("TIERSTORE_SECRET_KEY", "SK")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = runner.invoke(cli.app, ["env"])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"tierstore: {message}")
    assert result.stderr.count("\n") == 1


def test_admin_answers_503_while_the_service_closes(tmp_path: Path) -> None:
    from gateway.node import Node

    config = load_config({"data_dir": tmp_path / "data"}, env={"TIERSTORE_ADMIN_TOKEN": "tok"})
    node = Node(config)
    admin = build_admin_app(config, node)

    async def go() -> tuple[int, str]:
        await node.start()
        service = node.tiering
        assert service is not None
        release = asyncio.Event()
        close = service.close

        async def slow_close() -> None:
            await release.wait()
            await close()

        service.close = slow_close  # type: ignore[method-assign]
        stopping = asyncio.create_task(node.stop())
        await asyncio.sleep(0)
        transport = httpx.ASGITransport(app=admin)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            answer = await client.get("/stats", headers={"Authorization": "Bearer tok"})
        release.set()
        await stopping
        return answer.status_code, answer.json()["error"]["code"]

    assert asyncio.run(go()) == (503, "Unavailable")


def test_check_reads_the_data_dir_from_the_environment(tmp_path: Path) -> None:
    where = tmp_path / "elsewhere"
    result = runner.invoke(cli.app, ["check"], env={"TIERSTORE_DATA_DIR": str(where)})
    assert result.exit_code == 2
    assert result.stderr == f"tierstore: {where} holds no tierstore index\n"
