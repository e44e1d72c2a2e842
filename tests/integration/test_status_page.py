"""The status page (docs/status-page.md) in headless Chromium against a real
gateway: signed in through the URL fragment, a form or ``tierstore status
--open``; refused tokens show an error and no data; a warm job's progress
bar moves to its end and the hit ratio follows the reads.

Chromium is Debian's (``scripts/test`` installs it when it runs as root),
driven by playwright, which never downloads a browser of its own here. The
network flags keep it from calling home: this machine's network is closed.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.cli import browser as cli_browser
from gateway.cli.app import app as cli_app
from tests.conftest import make_client, running_gateway
from tests.servers import ADMIN_TOKEN, Gateway

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra: pip install -e '.[test]'")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
KiB = 1024
WARM_OBJECTS = 600  # three warm batches (tiering.prefetch.warm.BATCH is 256): the bar has steps to show
WARM_SIZE = 2 * KiB
WARM_BANDWIDTH = 128 * KiB  # bytes/s: about 4 s per batch, two page refreshes each
REFRESH_WAIT = 15.0  # seconds a change may take to show (the page refreshes every 2)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install chromium` (scripts/test does, as root)")
    with sync_api.sync_playwright() as playwright:
        # user data in a new temporary profile, as playwright always does
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A tab of its own: a new context, so no sessionStorage carries over."""
    context = browser.new_context(viewport={"width": 1280, "height": 1200})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    context.close()
    assert not errors, f"the page's script failed: {errors}"


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway of the test's own: the hit ratio starts with no read."""
    with running_gateway(tmp_path / "data", "--flush-delay", "3600") as gw:
        yield gw


def wait_for(what: str, probe: Callable[[], Any], timeout: float = REFRESH_WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.1)
    raise AssertionError(f"the page did not show {what} within {timeout:g} s")


def signed_in(page: Any) -> None:
    page.wait_for_selector("#dashboard", state="visible", timeout=REFRESH_WAIT * 1000)
    assert page.locator("#login").is_hidden()


def text(page: Any, selector: str) -> str:
    return page.locator(selector).inner_text().strip()


# --------------------------------------------------------------------------


def test_without_a_token_the_page_asks_and_a_wrong_one_shows_no_data(gw: Gateway, page: Any) -> None:
    answer = page.goto(f"{gw.admin_url}/status")
    assert answer.status == 200 and "script-src 'self'" in answer.headers["content-security-policy"]
    page.wait_for_selector("#login", state="visible")
    assert page.locator("#dashboard").is_hidden()
    assert page.locator("#login-error").is_hidden()

    page.fill("#token", "not-the-token")
    page.click("#login button")
    error = page.wait_for_selector("#login-error", state="visible")
    assert "refused" in error.inner_text() and "Unauthorized" in error.inner_text()
    assert page.locator("#dashboard").is_hidden()
    assert page.locator("#jobs tr, #buckets tr").count() == 0
    assert page.evaluate("sessionStorage.length") == 0, "a refused token is not kept"

    page.fill("#token", ADMIN_TOKEN)
    page.click("#login button")
    signed_in(page)
    assert page.locator("#login-error").is_hidden()


def test_a_wrong_token_in_the_address_is_refused_and_dropped(gw: Gateway, page: Any) -> None:
    page.goto(f"{gw.admin_url}/status#token=wrong")
    error = page.wait_for_selector("#login-error", state="visible")
    assert "refused" in error.inner_text()
    assert page.locator("#dashboard").is_hidden()
    assert page.url == f"{gw.admin_url}/status", "the token leaves the address bar"


def test_warm_progress_and_hit_ratio_live(gw: Gateway, page: Any, tmp_path: Path) -> None:
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="page-warm")
    s3.create_bucket(Bucket="page-cold")
    for i in range(WARM_OBJECTS):
        s3.put_object(Bucket="page-warm", Key=f"warm/{i:04}", Body=os.urandom(WARM_SIZE))
    for i in range(4):
        s3.put_object(Bucket="page-cold", Key=f"cold/{i}", Body=os.urandom(WARM_SIZE))
    gw.flush()
    gw.evict()  # everything only in the capacity store now

    page.goto(f"{gw.admin_url}/status#token={ADMIN_TOKEN}")
    signed_in(page)
    assert ADMIN_TOKEN not in page.url
    assert text(page, "#hit-ratio") == "–", "no GET yet"
    wait_for("the buckets", lambda: page.locator('#buckets tr[data-bucket="page-warm"]').count())

    job = gw.admin("POST", "/jobs/warm", json={
        "bucket": "page-warm", "prefix": "warm/", "bandwidth": WARM_BANDWIDTH}).json()
    bar = page.locator(f'#jobs tr[data-job="{job["id"]}"] [role=progressbar]')
    row = page.locator(f'#jobs tr[data-job="{job["id"]}"]')
    seen: list[float] = []
    etas: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if bar.count() and bar.get_attribute("aria-valuenow") is not None:
            value = float(bar.get_attribute("aria-valuenow"))
            if not seen or value != seen[-1]:
                seen.append(value)
                cells = row.locator("td").all_inner_texts()
                if "running" in cells:
                    etas.append(cells[-1])
            if value == 100.0:
                break
        time.sleep(0.1)
    assert seen and seen[-1] == 100.0, f"the bar never reached 100 %: {seen}"
    assert any(0 < v < 100 for v in seen), f"the bar jumped to the end: {seen}"
    assert seen == sorted(seen), f"the bar went backwards: {seen}"
    assert any(re.fullmatch(r"\d+:\d\d", eta) for eta in etas), f"no ETA shown while running: {etas}"
    assert "succeeded" in row.locator("td").all_inner_texts()

    for i in range(4):  # not warmed: from the capacity store
        s3.get_object(Bucket="page-cold", Key=f"cold/{i}")["Body"].read()
    wait_for("a 0 % hit ratio", lambda: text(page, "#hit-ratio") == "0.0 %")
    for i in range(4):  # warmed: hits
        s3.get_object(Bucket="page-warm", Key=f"warm/{i:04}")["Body"].read()
    wait_for("a 50 % hit ratio", lambda: text(page, "#hit-ratio") == "50.0 %")
    assert page.locator("#hit-chart path.line").count() == 1, "the chart draws the ratios"
    assert text(page, "#served-hot").endswith("/s")

    shot = tmp_path / "status-page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000


def test_cli_open_signs_the_page_in(gw: Gateway, page: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tierstore status --open`` with the browser swapped for this tab:
    the address given to it is a private file, which leads to the page,
    signed in, with the token out of the address bar."""
    given: list[str] = []

    def open_in_tab(url: str) -> bool:
        given.append(url)
        page.goto(url)
        page.wait_for_url(f"{gw.admin_url}/status", timeout=REFRESH_WAIT * 1000)
        return True

    monkeypatch.setattr(cli_browser.webbrowser, "open", open_in_tab)
    monkeypatch.setattr(cli_browser, "OPEN_GRACE", 0.0)
    env = {"TIERSTORE_ADMIN_URL": gw.admin_url, "TIERSTORE_ADMIN_TOKEN": ADMIN_TOKEN}
    result = CliRunner().invoke(cli_app, ["status", "--open"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"opened {gw.admin_url}/status in a browser")
    assert ADMIN_TOKEN not in result.stdout
    (url,) = given
    assert url.startswith("file://") and ADMIN_TOKEN not in url
    assert not Path(url.removeprefix("file://")).exists()
    signed_in(page)
    assert page.url == f"{gw.admin_url}/status"


def test_a_gateway_among_several_shows_its_role(tmp_path: Path, page: Any) -> None:
    """With --node-id the capacity card names this node and the buckets it writes."""
    with running_gateway(tmp_path / "data", "--node-id", "node-a", "--lease-ttl", "6") as node:
        make_client(node.endpoint).create_bucket(Bucket="shards")  # takes the bucket's write lease
        page.goto(f"{node.admin_url}/status#token={ADMIN_TOKEN}")
        signed_in(page)
        facts = wait_for("the node's role", lambda: "node-a" in text(page, "#capacity-facts") and
                         text(page, "#capacity-facts"))
        assert "node-a: writes shards" in facts


def test_a_full_disk_shows_with_its_floor(tmp_path: Path, page: Any) -> None:
    """The hot tier card shows free space against the floor, the index's
    reserve and refused writes, and warns when free space is below the
    floor and when the budget is more than the filesystem can hold."""
    floor = "1000T"  # more than any disk here: free space is always below it
    with running_gateway(tmp_path / "data", "--hot-size", "1024T", "--free-floor", floor) as gw:
        s3 = make_client(gw.endpoint)
        s3.create_bucket(Bucket="full")
        with pytest.raises(Exception, match="InsufficientStorage"):  # nothing of the gateway's to free
            s3.put_object(Bucket="full", Key="k", Body=b"x")
        page.goto(f"{gw.admin_url}/status#token={ADMIN_TOKEN}")
        signed_in(page)
        disk = wait_for("the disk", lambda: "floor 1000" in text(page, "#hot-disk") and text(page, "#hot-disk"))
        assert "writes refused: floor 1" in disk
        warning = text(page, "#hot-disk-warning")
        assert "below the floor" in warning and "more than its filesystem can hold" in warning
