"""The CLI, and process start-up (serve() and the admin API) with a fake data plane.

The real ``S3App`` is not needed here: ``FakeS3App`` has its interface
(raw ASGI app + startup/shutdown/started), so these tests pin down what
``serve()`` promises: both ports answer, /health follows the data plane,
/config needs the token, and ``stop`` shuts everything down in order.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gateway import cli, server
from gateway.admin import build_admin_app
from gateway.config import VERSION, Config, credentials_path, load_config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own TIERSTORE_* variables must not leak into tests."""
    for name in list(os.environ):
        if name.startswith("TIERSTORE_"):
            monkeypatch.delenv(name)


class FakeS3App:
    """Stands in for gateway.app.S3App: answers every request with 200."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.calls: list[str] = []
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    async def startup(self) -> None:
        self.calls.append("startup")
        self._started = True

    async def shutdown(self) -> None:
        self.calls.append("shutdown")
        self._started = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        headers = [(b"content-type", b"text/plain"), (b"server", b"fake-s3")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"fake s3"})


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
            s3_factory=lambda _: fake,
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
            await fake.startup()
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
            await server.serve(config, s3_factory=lambda _: fake)

        with pytest.raises(server.StartupError, match=f"cannot listen for S3 on 127.0.0.1:{port}"):
            asyncio.run(attempt())
    assert fake.calls == []


def test_failed_s3_startup_stops_admin_server(tmp_path: Path) -> None:
    config = _config(tmp_path)

    class Broken(FakeS3App):
        async def startup(self) -> None:
            raise RuntimeError("data dir is corrupt")

    with pytest.raises(RuntimeError, match="corrupt"):
        asyncio.run(server.serve(config, s3_factory=Broken))


def test_cancelling_serve_still_shuts_down(tmp_path: Path) -> None:
    config = _config(tmp_path)
    fake = FakeS3App(config)

    async def scenario() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(
            server.serve(config, on_ready=lambda *_: ready.set(), s3_factory=lambda _: fake)
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


def test_startup_error_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def busy(_: Config) -> None:
        raise server.StartupError("cannot listen for S3 on 127.0.0.1:9100: Address already in use")

    monkeypatch.setattr(server, "run", busy)
    result = runner.invoke(cli.app, ["serve", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.strip().endswith("Address already in use")
