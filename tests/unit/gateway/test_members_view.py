"""The node registry as operators see it: ``tierstore status``'s members
section and the live-members gauge, from a ``GET /tiers`` body."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli import render
from gateway.observability.metrics import Metrics
from tests.unit.gateway.test_metrics import TIER_STATUS

MEMBERS = [
    {"node": "a", "endpoint": "http://a:9100", "heartbeat_age": 0.2, "live": True, "me": True},
    {"node": "b", "endpoint": "http://b:9100", "heartbeat_age": 1.5, "live": True, "me": False},
    {"node": "c", "endpoint": "http://c:9100", "heartbeat_age": 40.0, "live": False, "me": False},
]
CLUSTER = {"node": "a", "role": "replica", "writing": [], "writers": {}, "terms": 0, "lag_seconds": 0.5,
           "lag_segments": 0, "follow_rounds": 3, "errors": 0, "last_error": None, "members": MEMBERS}


def test_status_shows_the_members(capsys: pytest.CaptureFixture[str]) -> None:
    render.status({"tiers": {**TIER_STATUS, "cluster": CLUSTER}, "stats": {}, "jobs": {"jobs": []}})
    out = capsys.readouterr().out
    assert "members" in out
    assert "http://a:9100, this node, heartbeat 0.2 s ago" in out
    assert "http://b:9100, live, heartbeat 1.5 s ago" in out
    assert "http://c:9100, not live, heartbeat 40.0 s ago" in out
    # Fixed --peers: no registry, no section.
    render.status({"tiers": {**TIER_STATUS, "cluster": {**CLUSTER, "members": None}}, "stats": {}})
    assert "members" not in capsys.readouterr().out


def test_the_live_members_gauge() -> None:
    text = Metrics().render({**TIER_STATUS, "cluster": CLUSTER}, {}).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["tierstore_cluster_members_live"].samples[0].value == 2
    text = Metrics().render({**TIER_STATUS, "cluster": {**CLUSTER, "members": None}}, {}).decode()
    assert "tierstore_cluster_members_live" not in text
