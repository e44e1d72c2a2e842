"""What can be checked of the container files without a Docker engine."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def readme_serve_command() -> list[str]:
    first_block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert first_block, "README must open with a sh block of commands"
    line = next(l for l in first_block.group(1).splitlines() if "serve" in l and not l.startswith("#"))
    return shlex.split(line.split("&&")[-1])


def test_image_runs_the_readme_command() -> None:
    text = (ROOT / "Dockerfile").read_text()
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
    cmd = re.search(r"^CMD (\[.*\])$", text, re.MULTILINE)
    assert entry and cmd
    image = yaml.safe_load(entry.group(1)) + yaml.safe_load(cmd.group(1))
    readme = readme_serve_command()
    assert Path(readme[0]).name == image[0] == "tierstore"
    assert readme[1:] == image[1:] == ["serve"]


def test_readme_test_command_is_what_ci_runs() -> None:
    block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL).group(1)
    test_line = [l for l in block.splitlines() if l and not l.startswith("#")][-1]
    ci = (ROOT / ".ci/run").read_text()
    assert f"exec {test_line}" in ci


def test_compose_parses_and_references_existing_files() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["tierstore"]
    assert (ROOT / service["build"] / "Dockerfile").exists()
    assert service["command"] == ["serve"]
    for volume in service["volumes"]:
        name = volume.split(":")[0]
        assert name in compose["volumes"]
    copied = re.findall(r"^COPY (\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    for src in copied:
        if not src.startswith("--"):
            assert (ROOT / src).exists(), src
