"""The access log: one line per S3 request on the ``tierstore.access`` logger.

Fields, in order: time (UTC, ms), request_id, remote (client address),
op (S3 operation), bucket, key, status, error (S3 error code), bytes_in
(request body), bytes_out (response body as sent), tier (hot, capacity or
none), duration_ms (request head to last byte sent).

Formats (setting ``access_log``):

- ``text``: ``name=value`` pairs separated by spaces. A value that is not
  plain printable ASCII (or holds a space, ``"``, ``=`` or ``\\``) is quoted,
  with ``"`` and ``\\`` escaped and every control, line-separator and
  format character written as ``\\n``, ``\\xNN`` or ``\\uNNNN``: an object
  key is client data, and one holding a newline must not forge a second
  line, nor a bidi override hide what follows. An absent value is ``-``
  (a value that is literally ``-`` is quoted).
- ``json``: one JSON object per line, ASCII only (non-ASCII is ``\\u``
  escaped, so U+2028 and friends cannot split a line either); absent values
  are null.
- ``off``: nothing is formatted or logged.

Lines go through Python logging, so deployments can route them anywhere;
by default (the logger has no handler of its own) they go to stderr as bare
lines, independent of the log level of the other loggers. That default
handler (:class:`BatchedStderr`) is written to directly, without a log
record per line, and writes its lines in batches: at most every
``FLUSH_SECONDS`` or every ``FLUSH_BYTES``, so a line reaches stderr at
most that late, and a process killed outright loses at most that much of
its access log (a clean stop writes everything).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time

from gateway.config.settings import ACCESS_LOG_FORMATS as FORMATS

LOGGER_NAME = "tierstore.access"

# Written as is in text mode; anything else is quoted and escaped.
_PLAIN = re.compile(r"[!#-<>-\[\]-~]+")
# Escaped inside quotes: C0 and C1 controls, DEL, the quote and backslash,
# line and paragraph separators, bidi and other invisible format characters,
# and lone surrogates (not encodable to the log stream).
_ESCAPE = re.compile(
    "[\x00-\x1f\x7f-\x9f\"\\\\\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb]"
)
_SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_JSON_STRING = json.JSONEncoder(ensure_ascii=True).encode  # str -> "..." with \uXXXX escapes


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _json(value: str | None) -> str:
    """A JSON string (ASCII, so no raw line separator either) or null."""
    return "null" if value is None else _JSON_STRING(value)


def text_value(value: object) -> str:
    """One value as written in a text-format line."""
    if value is None:
        return "-"
    if not isinstance(value, str):
        return str(value)
    if value != "-" and _PLAIN.fullmatch(value):
        return value
    return '"' + _ESCAPE.sub(_escape_char, value) + '"'


FLUSH_SECONDS = 0.1
FLUSH_BYTES = 64 * 1024


class BatchedStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Bare lines to stderr, written in batches (see the module's doc): one
    write for many requests instead of one per request. :meth:`add` takes
    a line as is; records logged the usual way are formatted and added."""

    def __init__(self) -> None:
        super().__init__()  # sys.stderr
        self._pending: list[str] = []
        self._size = 0
        self._pending_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._waiting = threading.Event()  # set when a line waits for the flusher
        threading.Thread(target=self._flush_often, name="access-log", daemon=True).start()

    def add(self, line: str) -> None:
        with self._pending_lock:
            self._pending.append(line)
            self._size += len(line) + 1
            first, full = len(self._pending) == 1, self._size >= FLUSH_BYTES
        if full:
            self.flush()
        elif first:
            self._waiting.set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.add(self.format(record))
        except Exception:  # noqa: BLE001 - logging's contract: report, never raise
            self.handleError(record)

    def flush(self) -> None:
        with self._write_lock:  # batches leave in the order they were taken
            with self._pending_lock:
                lines, self._pending, self._size = self._pending, [], 0
            if not lines:
                return
            try:
                self.stream.write("\n".join(lines) + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # the stream is closed: nowhere to write
                pass

    def _flush_often(self) -> None:
        """Write what waits at most FLUSH_SECONDS after it came; asleep while nothing does."""
        while True:
            self._waiting.wait()
            self._waiting.clear()
            time.sleep(FLUSH_SECONDS)
            self.flush()


def install_handler(logger: logging.Logger | None = None) -> None:
    """Send the access log to stderr, one bare line per request, unless a
    handler is already configured for it (idempotent)."""
    logger = logger or logging.getLogger(LOGGER_NAME)
    if logger.handlers:
        return
    handler = BatchedStderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # Not through the root logger: its format would prefix every line
    # (and break JSON lines), and its level is the application log's.
    logger.propagate = False


class AccessLog:
    """Writes access-log lines in one of FORMATS.

    Without ``logger``, logs to ``tierstore.access`` and installs the default
    stderr handler on it (see :func:`install_handler`)."""

    def __init__(self, fmt: str = "text", logger: logging.Logger | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"access log format {fmt!r} is not one of {', '.join(FORMATS)}")
        self.format = fmt
        self.enabled = fmt != "off"
        if logger is None:
            logger = logging.getLogger(LOGGER_NAME)
            if self.enabled:
                install_handler(logger)
        self._logger = logger
        self._second = -1
        self._second_text = ""

    def write(
        self,
        *,
        request_id: str,
        remote: str | None,
        op: str,
        bucket: str,
        key: str,
        status: int,
        error: str | None,
        bytes_in: int,
        bytes_out: int,
        tier: str,
        seconds: float,
        objects: int | None = None,
        user: str | None = None,
    ) -> None:
        """Log one request (nothing when the format is off); ``objects``:
        the objects a batch sent (GetBatch only); ``user``: who asked (a
        user's name, ``root`` or ``anonymous``; None or "" when the request
        was refused before anyone was recognised)."""
        logger = self._logger
        if not self.enabled or not logger.isEnabledFor(logging.INFO):
            return
        ms = round(seconds * 1000, 3)
        # request_id, op, status, the byte counts and tier are the gateway's
        # own (hex, operation names, ints): only client data is escaped.
        if self.format == "json":
            line = (
                f'{{"time":"{self._now()}","request_id":"{request_id}","remote":{_json(remote)},'
                f'"user":{_json(user or None)},'
                f'"op":{_json(op)},"bucket":{_json(bucket or None)},"key":{_json(key or None)},'
                f'"status":{status},"error":{_json(error)},"bytes_in":{bytes_in},"bytes_out":{bytes_out},'
                f'"tier":"{tier}","duration_ms":{ms}'
                + (f',"objects":{objects}}}' if objects is not None else "}")
            )
        else:
            line = (
                f"time={self._now()} request_id={request_id} remote={text_value(remote)} "
                f"user={text_value(user or None)} op={text_value(op)} "
                f"bucket={text_value(bucket or None)} key={text_value(key or None)} status={status} "
                f"error={text_value(error)} bytes_in={bytes_in} bytes_out={bytes_out} tier={tier} "
                f"duration_ms={ms}" + (f" objects={objects}" if objects is not None else "")
            )
        handlers = logger.handlers
        if len(handlers) == 1 and type(handlers[0]) is BatchedStderr and not logger.filters:
            handlers[0].add(line)  # the default handler: no record needed
            return
        # A record of our own instead of logger.info(): the same handlers and
        # filters, without the stack walk that looks for the caller (about a quarter
        # of the cost). The line is the message as is, never %-formatted.
        logger.handle(logger.makeRecord(logger.name, logging.INFO, __file__, 0, line, (), None))

    def _now(self) -> str:
        """ISO 8601 UTC with milliseconds; the seconds part is formatted
        once per second."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._second_text}.{int((now - second) * 1000):03d}Z"
