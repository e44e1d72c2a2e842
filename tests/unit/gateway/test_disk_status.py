"""What operators and clients see of a full disk, at the gateway's edge: the
S3 answers of the refusals, the /metrics families and `tierstore status`
(docs/operations.md#a-full-disk)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.cli import render
from gateway.observability.metrics import Metrics
from gateway.s3.errors import to_s3_error
from tests.unit.gateway.test_metrics import TIER_STATUS
from tiering import errors as t

MiB = 1024 * 1024
DISK = {
    "size": 96 * MiB, "free": 10 * MiB, "floor": 16 * MiB, "reserve": 4 * MiB, "reserve_held": False,
    "index_writable": True, "refusals": {"budget": 0, "floor": 5, "disk": 1, "index": 2}, "fills_skipped": 7,
    "warning": "the hot tier's budget (1024 MiB) is more than its filesystem can hold",
}


def test_refusals_are_retryable_503s_or_507() -> None:
    slow = to_s3_error(t.SlowDown("making room", cause="floor"))
    assert (slow.code, slow.status) == ("SlowDown", 503)
    full = to_s3_error(t.InsufficientStorage("nothing to free", cause="index"))
    assert (full.code, full.status) == ("InsufficientStorage", 507)
    # The cause is for the operators' counts, never an element of the answer.
    assert "cause" not in slow.fields and "cause" not in full.fields


def test_metrics_show_free_space_against_the_floor_and_refusals_by_cause() -> None:
    text = Metrics().render({**TIER_STATUS, "disk": DISK}, {}).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("tierstore_disk_free_bytes", ())] == 10 * MiB
    assert samples[("tierstore_disk_floor_bytes", ())] == 16 * MiB
    assert samples[("tierstore_disk_size_bytes", ())] == 96 * MiB
    assert samples[("tierstore_index_reserve_bytes", ())] == 0  # given to the index
    assert samples[("tierstore_index_writable", ())] == 1
    assert samples[("tierstore_hot_budget_exceeds_disk", ())] == 1
    assert samples[("tierstore_write_refusals_total", (("cause", "floor"),))] == 5
    assert samples[("tierstore_write_refusals_total", (("cause", "index"),))] == 2
    assert samples[("tierstore_hot_fills_skipped_total", ())] == 7
    assert "tierstore_disk_free_bytes" not in Metrics().render(TIER_STATUS, {}).decode()  # an older /tiers


def test_status_shows_the_disk(capsys) -> None:
    render.status({"tiers": {**TIER_STATUS, "disk": DISK}, "stats": {}, "jobs": {"jobs": []}})
    out = capsys.readouterr().out
    assert "BELOW THE FLOOR" in out and "GIVEN TO THE INDEX" in out
    assert "floor 5" in out and "index 2" in out
    assert "more than its filesystem can hold" in out
    render.status({"tiers": {**TIER_STATUS, "disk": {**DISK, "free": 50 * MiB, "reserve_held": True,
                                                      "index_writable": False, "warning": None}},
                   "stats": {}, "jobs": {"jobs": []}})
    out = capsys.readouterr().out
    assert "BELOW" not in out and "READ-ONLY" in out and "warning" not in out


def test_the_floor_by_default_and_as_set(tmp_path) -> None:
    from gateway.config.values import default_free_floor, index_reserve, load_config, tier_settings

    GiB = 1024 * MiB
    assert default_free_floor(96 * MiB) == 24 * MiB  # a quarter of a small volume at most
    assert default_free_floor(4 * GiB) == 256 * MiB  # at least 256 MiB
    assert default_free_floor(512 * GiB) == int(512 * GiB * 0.02) // MiB * MiB  # 2 %
    assert default_free_floor(8 * 1024 * GiB) == 16 * GiB  # at most 16 GiB
    assert (index_reserve(16 * MiB), index_reserve(256 * MiB), index_reserve(16 * GiB)) == (4 * MiB, 64 * MiB, 64 * MiB)
    config = load_config({"data_dir": tmp_path}, {})
    assert config.free_floor_from > 0 and config.free_floor == default_free_floor(config.free_floor_from)
    config = load_config({"data_dir": tmp_path}, {"TIERSTORE_FREE_FLOOR": "16M"})
    assert (config.free_floor, config.free_floor_from) == (16 * MiB, 0)
    settings = tier_settings(config)
    assert (settings.free_floor, settings.index_reserve) == (16 * MiB, 4 * MiB)
