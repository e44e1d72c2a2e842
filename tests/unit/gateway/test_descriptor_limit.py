"""gateway.serving.process.raise_descriptor_limit: a gateway process starts with a
soft descriptor limit raised towards its hard limit, so the descriptors hot
reads keep open (tiering/hot/open_files.py) are as many as they may be."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from gateway.serving.process import DESCRIPTORS

SCRIPT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
from gateway.serving.process import raise_descriptor_limit
from tiering.hot.open_files import capacity
print(raise_descriptor_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], capacity())
"""


def run(soft: int, hard: int) -> list[int]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(soft), str(hard)],
                          capture_output=True, text=True, check=True)
    return [int(word) for word in done.stdout.split()]


def _hard() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return DESCRIPTORS * 2 if hard == resource.RLIM_INFINITY else hard


@pytest.mark.skipif(_hard() < 4096, reason="needs a hard limit of 4,096 descriptors or more")
def test_the_soft_limit_is_raised_to_the_hard_one_at_most_descriptors() -> None:
    hard = min(_hard(), DESCRIPTORS * 2)
    got, soft_now, kept = run(256, hard)
    assert got == soft_now == min(hard, DESCRIPTORS)
    assert kept == min(4096, soft_now // 4)


def test_a_low_hard_limit_is_the_ceiling() -> None:
    got, soft_now, kept = run(64, 200)
    assert got == soft_now == 200
    assert kept == 50  # a quarter of the limit for kept descriptors
