"""The trainer-side client room loads alone: importing every helper a training
job uses brings in nothing of the server (tiering/, packer/, gateway's other
rooms, FastAPI, uvicorn, rocksdict, aiobotocore)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gateway.client import batch
from tiering.model import archive

ROOT = Path(__file__).resolve().parents[3]
# Ours and the server's frameworks. httpx and botocore load rich and awscrt of their own
# accord where these are installed (here, for the server): the fresh venv of
# tests/integration/test_client_install.py shows the client runs without them.
SERVER = ("tiering", "packer", "fastapi", "starlette", "uvicorn", "rocksdict", "aiobotocore")

PROBE = """
import json, sys
from gateway.client import BatchDataset, HintedSampler, Hints, get_batch, shard_epoch, virtual_shards
import gateway.client.admin, gateway.client.order, gateway.client.sources, gateway.client.target
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(probe: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def server_modules(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in SERVER
            or (m.startswith("gateway.") and not m.startswith("gateway.client"))]


def test_importing_the_client_loads_no_server_module() -> None:
    modules = loaded_by(PROBE)
    assert "gateway.client.hints" in modules and "gateway.client.batch" in modules
    assert server_modules(modules) == []


def test_the_probe_sees_a_server_module() -> None:
    """The check itself: a server import in the same probe is caught."""
    modules = loaded_by(PROBE.replace("import json, sys", "import json, sys, gateway.s3.xml"))
    assert "gateway.s3.xml" in server_modules(modules)


def test_hints_alone_do_not_load_the_batch_client() -> None:
    """``from gateway.client import HintedSampler`` loads what hints need, not botocore."""
    modules = loaded_by("import json, sys\nfrom gateway.client import HintedSampler\n"
                        "print(json.dumps(sorted(sys.modules)))")
    assert "gateway.client.hints" in modules
    assert "botocore" not in modules and "gateway.client.batch" not in modules


def test_error_members_are_named_alike_on_both_sides() -> None:
    """The batch answer's error prefix: written by the server, read by the client."""
    assert batch.ERRORS == archive.ERRORS
