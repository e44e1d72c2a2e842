"""The ``tierstore`` command line (docs/cli.md): :func:`main` is the console script
and ``python -m gateway``.

``app.py`` holds the app and the commands on the gateway's own machine and
data dir; ``admin.py``, ``mounts.py`` and ``prefetch.py`` the commands that
drive a running gateway through ``client.py``, found by ``target.py`` and
shown by ``render.py``; ``browser.py`` opens the status page; ``common.py``
holds what they share. ``gateway.hints`` uses ``client.py`` and ``target.py``
too, so this module imports nothing until :func:`main` runs: the hints helper
does not load the commands or typer.
"""

from __future__ import annotations


def main() -> None:
    """Console-script entry point."""
    from gateway.cli.app import main as run

    run()
