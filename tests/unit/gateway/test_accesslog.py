"""The access log: text escaping of hostile keys, JSON lines, off mode."""

from __future__ import annotations

import ast
import io
import json
import logging
import re
import time
import weakref
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.observability.accesslog import (
    FLUSH_BYTES,
    FORMATS,
    AccessLog,
    BatchedStderr,
    install_handler,
    text_value,
)

FIELDS = ["time", "request_id", "remote", "user", "op", "bucket", "key", "status", "error",
          "bytes_in", "bytes_out", "tier", "duration_ms"]
_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]+)(?: |$)')
# Every character Python (str.splitlines) or a terminal takes as a line break.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, _Lines]]:
    logger = logging.getLogger("tierstore.access.test")
    handler = _Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)


def _write(log: AccessLog, key: str = "dir/file.txt", **over: object) -> None:
    fields: dict[str, object] = dict(
        request_id="0123456789ABCDEF", remote="127.0.0.1", op="GetObject", bucket="data", key=key,
        status=200, error=None, bytes_in=0, bytes_out=5, tier="hot", seconds=0.0012345,
    )
    fields.update(over)
    log.write(**fields)  # type: ignore[arg-type]


def parse_text(line: str) -> dict[str, str | None]:
    """Inverse of the text format: quoted values are Python string literals
    (the escapes used are \\" \\\\ \\n \\r \\t \\xNN \\uNNNN), - is absent."""
    out: dict[str, str | None] = {}
    pos = 0
    for match in _PAIR.finditer(line):
        assert match.start() == pos, f"unparsed text at {pos}: {line[pos:]!r}"
        name, raw = match.groups()
        assert name not in out, f"field {name} twice in {line!r}"
        out[name] = None if raw == "-" else ast.literal_eval(raw) if raw.startswith('"') else raw
        pos = match.end()
    assert pos == len(line), f"unparsed text at {pos}: {line[pos:]!r}"
    return out


# --------------------------------------------------------------------------
# Text values


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("dir/file-1.txt", "dir/file-1.txt"),
        ("a b", '"a b"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("k=v", '"k=v"'),
        ("", '""'),
        ("-", '"-"'),
        (None, "-"),
        (404, "404"),
        ("line\nbreak\r\t", '"line\\nbreak\\r\\t"'),
        ("nul\x00del\x7fnel\x85", '"nul\\x00del\\x7fnel\\x85"'),
        ("ls\u2028ps\u2029", '"ls\\u2028ps\\u2029"'),
        ("rtl\u202eevil", '"rtl\\u202eevil"'),
        ("lone\ud800", '"lone\\ud800"'),  # not encodable: would fail the log stream
        ("caf\u00e9 \u65e5\u672c", '"caf\u00e9 \u65e5\u672c"'),  # printable non-ASCII stays readable
    ],
)
def test_text_value(value: object, written: str) -> None:
    assert text_value(value) == written


# --------------------------------------------------------------------------
# Text lines


def test_text_line_fields_in_order(captured: tuple[logging.Logger, _Lines]) -> None:
    logger, handler = captured
    _write(AccessLog("text", logger=logger))
    (line,) = handler.lines
    fields = parse_text(line)
    assert list(fields) == FIELDS
    assert fields["op"] == "GetObject" and fields["status"] == "200" and fields["error"] is None
    assert fields["duration_ms"] == "1.234" and fields["tier"] == "hot"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields["time"] or "")


def test_hostile_key_cannot_forge_a_line_or_a_field(captured: tuple[logging.Logger, _Lines]) -> None:
    logger, handler = captured
    hostile = 'x" status=500 error=- \n time=2000-01-01T00:00:00.000Z request_id=FORGED op=DeleteObject\r\u2028%s%d'
    _write(AccessLog("text", logger=logger), key=hostile)
    (line,) = handler.lines
    assert not any(c in line for c in _LINE_BREAKS)
    fields = parse_text(line)
    assert fields["key"] == hostile
    assert (fields["status"], fields["request_id"], fields["op"]) == ("200", "0123456789ABCDEF", "GetObject")


@given(st.text())
def test_any_key_stays_on_one_line_and_reads_back(key: str) -> None:
    handler = _Lines()
    logger = logging.getLogger("tierstore.access.test-hypothesis")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        _write(AccessLog("text", logger=logger), key=key)
    finally:
        logger.removeHandler(handler)
    (line,) = handler.lines
    assert line.splitlines() == [line] and not any(c in line for c in _LINE_BREAKS)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in line)
    assert parse_text(line)["key"] == (key or None)


# --------------------------------------------------------------------------
# JSON lines


def test_json_round_trips(captured: tuple[logging.Logger, _Lines]) -> None:
    logger, handler = captured
    hostile = 'k"\n\u2028\x00caf\u00e9\U0001f600'
    log = AccessLog("json", logger=logger)
    _write(log, key=hostile)
    _write(log, key="", bucket="", op="ListBuckets", status=403, error="AccessDenied", remote=None, tier="none")
    first, second = handler.lines
    for line in handler.lines:
        assert line.isascii() and line.splitlines() == [line]
    record = json.loads(first)
    assert list(record) == FIELDS
    assert record["key"] == hostile
    assert (record["status"], record["bytes_out"], record["duration_ms"], record["error"]) == (200, 5, 1.234, None)
    record = json.loads(second)
    assert (record["bucket"], record["key"], record["remote"], record["error"]) == (None, None, None, "AccessDenied")


# --------------------------------------------------------------------------
# Off, levels, set-up


def test_off_logs_nothing(captured: tuple[logging.Logger, _Lines]) -> None:
    logger, handler = captured
    log = AccessLog("off", logger=logger)
    assert not log.enabled
    _write(log)
    assert handler.lines == []


def test_off_installs_no_handler() -> None:
    logger = logging.getLogger("tierstore.access")
    before = list(logger.handlers)
    AccessLog("off")
    assert logger.handlers == before


def test_a_disabled_logger_formats_nothing(captured: tuple[logging.Logger, _Lines],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    logger, handler = captured
    logger.setLevel(logging.WARNING)
    log = AccessLog("text", logger=logger)
    monkeypatch.setattr(log, "_now", lambda: pytest.fail("formatted a line nobody logs"))
    _write(log)
    assert handler.lines == []


def test_unknown_format() -> None:
    assert FORMATS == ("off", "text", "json")
    with pytest.raises(ValueError, match="yaml"):
        AccessLog("yaml")


def test_install_handler_writes_bare_lines_once() -> None:
    logger = logging.getLogger("tierstore.access.test-install")
    install_handler(logger)
    install_handler(logger)  # idempotent
    try:
        assert len(logger.handlers) == 1 and not logger.propagate
        stream = io.StringIO()
        handler = logger.handlers[0]
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(stream)
        _write(AccessLog("json", logger=logger))
        handler.flush()
        (line,) = stream.getvalue().splitlines()
        assert json.loads(line)["op"] == "GetObject"  # no level or logger-name prefix
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)
        logger.propagate = True


def test_default_handler_writes_in_batches_and_loses_nothing() -> None:
    """Lines wait for the next flush (timer, size or stop), then all arrive, in order."""
    logger = logging.getLogger("tierstore.access.test-batches")
    install_handler(logger)
    handler = logger.handlers[0]
    assert isinstance(handler, BatchedStderr)
    stream = io.StringIO()
    handler.setStream(stream)
    log = AccessLog("text", logger=logger)
    try:
        _write(log, key="first")
        _write(log, key="second")
        deadline = time.monotonic() + 5
        while stream.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the flusher thread writes within FLUSH_SECONDS
        lines = stream.getvalue().splitlines()
        assert [parse_text(line)["key"] for line in lines] == ["first", "second"]
        big = "k" * 1000
        for _ in range(FLUSH_BYTES // 1000 + 1):  # past FLUSH_BYTES: written at once, no timer needed
            handler.add(big)
        assert stream.getvalue().count(big) == FLUSH_BYTES // 1000 + 1
        handler.add("last")
        logging.shutdown([weakref.ref(handler)])  # what a clean stop does: flushes
        assert stream.getvalue().endswith("last\n")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
