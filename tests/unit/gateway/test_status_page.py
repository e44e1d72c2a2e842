"""The status page's shell (``gateway/admin/page.py``): served without the
token and holding no data, locked down by its headers, polling routes that
exist, shipped in the wheel; and the CLI's way of opening it signed in
(``gateway/cli/browser.py``). What the page shows is tested in a browser,
in tests/integration/test_status_page.py."""

from __future__ import annotations

import fnmatch
import re
import stat
import tomllib
from pathlib import Path

import pytest

from gateway.admin import build_admin_app, page
from gateway.cli import browser as cli_browser
from gateway.config.values import Config
from tests.unit.gateway.test_admin_docs import _NotStarted
from tests.unit.test_packaging import ROOT, TOKEN, admin_get


def _text(name: str) -> str:
    return (page.STATIC / name).read_text(encoding="utf-8")


def test_the_page_and_its_files_are_served_without_the_token() -> None:
    for path, (name, media_type) in page.FILES.items():
        answer = admin_get(path)
        assert answer.status_code == 200, path
        assert answer.headers["content-type"] == media_type
        assert answer.content == (page.STATIC / name).read_bytes()
        policy = answer.headers["content-security-policy"]
        for rule in ("default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"):
            assert rule in policy
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
    # What the page reads still needs the token.
    assert admin_get("/stats").status_code == 401


def test_the_html_loads_exactly_the_files_served_and_nothing_inline() -> None:
    html = _text("status.html")
    loaded = {"/" + ref for ref in re.findall(r'(?:src|href)="(status/[^"]+)"', html)}
    assert loaded == set(page.FILES) - {page.PATH}
    # The Content-Security-Policy would block inline code and style.
    assert not re.search(r"<script(?![^>]*\ssrc=)", html)
    assert "<style" not in html and not re.search(r"\s(style|on[a-z]+)=", html)


def test_the_shell_holds_no_data_and_stays_out_of_the_schema() -> None:
    for path in page.FILES:
        assert TOKEN not in admin_get(path).text
    schema = build_admin_app(Config(admin_token="t"), _NotStarted()).openapi()
    assert not [p for p in schema["paths"] if p.startswith(page.PATH)]


def test_the_page_polls_routes_that_exist_with_the_token() -> None:
    script = _text("status.js")
    polled = set(re.findall(r'(?<![.\w])get\("([a-z]+)"\)', script))
    assert polled == {"tiers", "stats", "jobs", "epochs", "buckets", "mounts"}
    schema = build_admin_app(Config(admin_token="t"), _NotStarted()).openapi()
    for name in polled:
        operation = schema["paths"][f"/{name}"]["get"]
        assert operation.get("security"), f"/{name} must need the token"
    assert "Authorization: `Bearer ${token}`" in script
    assert "innerHTML" not in script  # what the API says goes in as text


def test_the_files_are_package_data() -> None:
    """The image installs a wheel (``pip install .``): files outside the
    patterns would be missing there while an editable install has them."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = settings["package-data"]["gateway.admin"]
    files = sorted(p.name for p in page.STATIC.iterdir())
    assert {name for _, (name, _) in page.FILES.items()} <= set(files)
    for name in files:
        assert any(fnmatch.fnmatch(f"static/{name}", p) for p in patterns), name


def test_the_cli_opens_the_page_the_gateway_serves() -> None:
    assert cli_browser.PAGE_PATH == page.PATH
    assert cli_browser.page_url("http://127.0.0.1:9101/") == "http://127.0.0.1:9101/status"
    assert cli_browser.page_url("http://h:1", "a b/c") == "http://h:1/status#token=a%20b%2Fc"


def test_open_page_passes_the_token_through_a_private_file(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fake_open(url: str) -> bool:
        assert url.startswith("file://") and "s3cr" not in url  # the browser's argument
        path = Path(url.removeprefix("file://"))
        seen.update(path=path, text=path.read_text(), mode=stat.S_IMODE(path.stat().st_mode),
                    folder=stat.S_IMODE(path.parent.stat().st_mode))
        return True

    monkeypatch.setattr(cli_browser.webbrowser, "open", fake_open)
    monkeypatch.setattr(cli_browser, "OPEN_GRACE", 0.0)
    calls: list[bool] = []
    assert cli_browser.open_page("http://127.0.0.1:9101", "s3cr<e>t", lambda: calls.append(True))
    assert calls == [True]
    assert seen["mode"] == 0o600 and seen["folder"] == 0o700
    assert 'content="0;url=http://127.0.0.1:9101/status#token=s3cr%3Ce%3Et"' in str(seen["text"])
    assert not Path(str(seen["path"])).exists(), "the sign-in file must not outlive the command"

    monkeypatch.setattr(cli_browser.webbrowser, "open", lambda url: seen.update(path=url) or False)
    assert not cli_browser.open_page("http://127.0.0.1:9101", "secret", lambda: calls.append(False))
    assert calls == [True]
    assert not Path(str(seen["path"]).removeprefix("file://")).exists()
