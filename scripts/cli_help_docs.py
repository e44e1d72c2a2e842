"""Rewrite every ``$ tierstore ... --help`` block of docs/cli.md with the
CLI's current help (100 columns, no colour), so the page stays true.

    .venv/bin/python scripts/cli_help_docs.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cli.md"
BLOCK = re.compile(r"```text\n\$ tierstore((?: [a-z-]+)*) --help\n.*?```", re.S)


def help_text(command: str) -> str:
    env = dict(os.environ, COLUMNS="100", TERM="dumb", NO_COLOR="1")
    tierstore = Path(sys.executable).with_name("tierstore")
    out = subprocess.run([str(tierstore), *command.split(), "--help"], capture_output=True, text=True,
                         env=env, check=True).stdout
    return "\n".join(line.rstrip() for line in out.splitlines()).rstrip("\n")


def main() -> None:
    text = DOC.read_text(encoding="utf-8")
    text = BLOCK.sub(lambda m: f"```text\n$ tierstore{m[1]} --help\n{help_text(m[1])}\n```", text)
    DOC.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
