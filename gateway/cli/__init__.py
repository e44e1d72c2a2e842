"""The ``tierstore`` command line (docs/cli.md): :func:`main` is the console script
and ``python -m gateway``.

``app.py`` holds the app and the commands on the gateway's own machine and
data dir; ``admin.py``, ``mounts.py`` and ``prefetch.py`` the commands that
drive a running gateway through ``gateway.client.admin``, found by
``gateway.client.target`` and shown by ``render.py``; ``browser.py`` opens
the status page; ``common.py`` holds what they share. This module imports
nothing until :func:`main` runs; on an install without the ``server`` extra
it says which command installs what the command line needs.

May import: ``client``, ``config``, ``server`` (``serve``, imported when it
runs), ``storage`` (``recover``) and ``version``.
"""

from __future__ import annotations


def main() -> None:
    """Console-script entry point."""
    try:
        from gateway.cli.app import main as run
    except ModuleNotFoundError as exc:  # `pip install tierstore`: the trainer-side client alone
        raise SystemExit(
            f"tierstore: the command line needs the server's dependencies ({exc.name} is missing); "
            "install them with: pip install 'tierstore[server]'"
        ) from None

    run()
