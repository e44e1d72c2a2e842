from __future__ import annotations

import random
import threading

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from packer import codec
from packer.errors import CorruptData, FormatError

COMPRESSIBLE = b"the quick brown fox jumps over the lazy dog " * 2000


def noise(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def test_compressible_data_round_trips_as_zstd() -> None:
    name, stored = codec.encode(COMPRESSIBLE)
    assert name == codec.ZSTD
    assert len(stored) < len(COMPRESSIBLE) // 10
    assert codec.decode(name, stored, len(COMPRESSIBLE)) == COMPRESSIBLE


def test_frame_declares_its_content_size() -> None:
    _, stored = codec.encode(COMPRESSIBLE)
    assert codec.content_size(stored) == len(COMPRESSIBLE)


@pytest.mark.parametrize("size", [64, 1000, 64 * 1024, 200_000])
def test_random_data_is_stored_as_is(size: int) -> None:
    data = noise(size)
    assert codec.encode(data) == (codec.NONE, data)
    assert codec.decode(codec.NONE, data, size) == data


@pytest.mark.parametrize("data", [b"", b"x", b"a" * 63])
def test_tiny_data_is_not_compressed(data: bytes) -> None:
    assert codec.encode(data) == (codec.NONE, data)
    assert codec.decode(codec.NONE, data, len(data)) == data


def test_memoryview_input() -> None:
    view = memoryview(bytearray(COMPRESSIBLE))[100:]
    name, stored = codec.encode(view)
    assert codec.decode(name, memoryview(stored), len(view)) == COMPRESSIBLE[100:]


def test_min_saving_is_honoured() -> None:
    assert codec.encode(COMPRESSIBLE, min_saving=1.0) == (codec.NONE, COMPRESSIBLE)


class _SpyCompressor:
    def __init__(self, real: zstandard.ZstdCompressor) -> None:
        self.real, self.sizes = real, []

    def compress(self, data: bytes) -> bytes:
        self.sizes.append(len(data))
        return self.real.compress(data)


def test_incompressible_data_costs_only_a_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _SpyCompressor(zstandard.ZstdCompressor(level=3))
    monkeypatch.setattr(codec, "_compressor", lambda level: spy)
    data = noise(4 * 1024 * 1024)
    assert codec.encode(data) == (codec.NONE, data)
    assert spy.sizes == [codec.PROBE_SIZE]


def test_compressible_head_then_noise_is_kept_raw_after_a_full_try() -> None:
    data = COMPRESSIBLE[: codec.PROBE_SIZE] + noise(4 * 1024 * 1024)
    assert codec.encode(data) == (codec.NONE, data)


@given(st.binary(max_size=4096), st.integers(1, 50))
def test_round_trip(data: bytes, repeat: int) -> None:
    data = data * repeat
    name, stored = codec.encode(data)
    assert name in codec.CODECS
    assert codec.decode(name, stored, len(data)) == data
    if name == codec.NONE:
        assert stored == data


@pytest.mark.parametrize("delta", [-1, 1, 1000])
def test_wrong_raw_length_is_corrupt(delta: int) -> None:
    name, stored = codec.encode(COMPRESSIBLE)
    with pytest.raises(CorruptData):
        codec.decode(name, stored, len(COMPRESSIBLE) + delta)
    with pytest.raises(CorruptData):
        codec.decode(codec.NONE, b"abc", 3 + delta)


def test_frame_without_content_size_is_bounded_by_raw_length() -> None:
    stored = zstandard.ZstdCompressor(write_content_size=False).compress(COMPRESSIBLE)
    assert codec.content_size(stored) is None
    assert codec.decode(codec.ZSTD, stored, len(COMPRESSIBLE)) == COMPRESSIBLE
    for raw_length in (0, 10, len(COMPRESSIBLE) - 1, len(COMPRESSIBLE) + 1):
        with pytest.raises(CorruptData):
            codec.decode(codec.ZSTD, stored, raw_length)


def test_hostile_content_size_is_refused_before_allocating() -> None:
    # Frame header: single segment, 8-byte content size of 1 TiB, then one empty last raw block.
    frame = b"\x28\xb5\x2f\xfd\xe0" + (1 << 40).to_bytes(8, "little") + b"\x01\x00\x00"
    assert codec.content_size(frame) == 1 << 40
    with pytest.raises(CorruptData):
        codec.decode(codec.ZSTD, frame, 10)


@pytest.mark.parametrize(
    "stored",
    [
        b"",
        b"garbage, not a frame",
        codec.compress(COMPRESSIBLE)[:-3],
        codec.compress(COMPRESSIBLE) + b"trailing",
    ],
)
def test_garbage_is_corrupt(stored: bytes) -> None:
    with pytest.raises(CorruptData):
        codec.decode(codec.ZSTD, stored, len(COMPRESSIBLE))


def test_unknown_codec_is_corrupt() -> None:
    with pytest.raises(FormatError):
        codec.decode("lz4", b"abc", 3)


def test_concurrent_use_from_threads() -> None:
    inputs = [COMPRESSIBLE[i:] + noise(i % 3 * 1000, i) for i in range(16)]
    failures: list[BaseException] = []

    def work(data: bytes) -> None:
        try:
            for _ in range(20):
                name, stored = codec.encode(data)
                assert codec.decode(name, stored, len(data)) == data
        except BaseException as exc:  # surfaced below: threads swallow exceptions
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(data,)) for data in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
