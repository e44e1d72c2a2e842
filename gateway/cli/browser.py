"""The status page from the command line: its address, and opening it in a
browser already signed in (``tierstore status --url`` and ``--open``;
docs/status-page.md).

The token travels in the address's fragment (``/status#token=...``), which a
browser keeps to itself: the page reads it, keeps it in the tab and takes it
out of the address bar. It must not travel on a command line, where every
user of the machine can read it (``ps``, ``/proc/<pid>/cmdline``), and
:mod:`webbrowser` starts a browser with the address as an argument. So the
browser is given a file, readable by this user only, that redirects to the
address; the file is removed once the browser has had time to read it.
Jupyter opens its token-protected pages the same way.
"""

from __future__ import annotations

import html
import os
import shutil
import tempfile
import time
import webbrowser
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

PAGE_PATH = "/status"  # gateway/admin/page.py serves it
# Seconds the redirect file is kept for the browser: a browser that is not
# running yet may take several to start and read it.
OPEN_GRACE = 10.0

_REDIRECT = """<!doctype html>
<meta charset="utf-8">
<meta name="referrer" content="no-referrer">
<meta http-equiv="refresh" content="0;url={url}">
<title>tierstore status</title>
<p><a href="{url}">Open the tierstore status page</a></p>
"""


def page_url(admin_url: str, token: str | None = None) -> str:
    """The status page's address; with ``token``, signed in through the fragment."""
    url = admin_url.rstrip("/") + PAGE_PATH
    return f"{url}#token={quote(token, safe='')}" if token else url


def open_page(admin_url: str, token: str, opened: Callable[[], None]) -> bool:
    """Open the page, signed in, in the user's browser: ``opened`` is called
    once the browser has it, then the redirect file stays for OPEN_GRACE
    seconds. False when Python finds no browser to start (a server without
    a desktop)."""
    folder = Path(tempfile.mkdtemp(prefix="tierstore-status-"))  # mode 0700
    try:
        redirect = folder / "open.html"
        fd = os.open(redirect, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(_REDIRECT.format(url=html.escape(page_url(admin_url, token), quote=True)))
        if not webbrowser.open(redirect.as_uri()):
            return False
        opened()
        time.sleep(OPEN_GRACE)
        return True
    finally:
        shutil.rmtree(folder, ignore_errors=True)
