"""What can be checked of the container files without a Docker engine: the
Dockerfile, .dockerignore, docker-compose.yml and deploy/prometheus.yml, read
the way Docker, Compose and Prometheus read them, against the README and the
gateway's own settings and routes.

The readers here (compose interpolation, Dockerfile instructions, the image's
environment) are used by tests/integration/test_compose_env.py too.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from gateway.admin import build_admin_app
from gateway.client.sources import ENV_PREFIX, env_name
from gateway.config.values import Config, load_config
from tests.unit.gateway.test_admin_docs import _NotStarted

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "compose-admin-token"
# Variables the gateway reads that are not a field of Config.
EXTRA_VARIABLES = {env_name("access_key"), env_name("secret_key"), env_name("config")}


# --------------------------------------------------------------------------
# Readers


def readme_serve_command() -> list[str]:
    first_block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert first_block, "README must open with a sh block of commands"
    line = next(l for l in first_block.group(1).splitlines() if "serve" in l and not l.startswith("#"))
    return shlex.split(line.split("&&")[-1])


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, continuations joined."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [l for l in text.splitlines() if not l.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.strip().partition(" ") for line in joined.splitlines())
        if word
    ]


def instructions(name: str) -> list[str]:
    return [args for word, args in dockerfile() if word == name]


def exec_form(name: str) -> list[str]:
    """The JSON array of the last ENTRYPOINT, CMD or HEALTHCHECK ... CMD."""
    args = instructions(name)[-1]
    return json.loads(args.partition("CMD ")[2] if name == "HEALTHCHECK" else args)


def image_env() -> dict[str, str]:
    """The environment the image's ENV instructions set."""
    env: dict[str, str] = {}
    for args in instructions("ENV"):
        env.update(pair.split("=", 1) for pair in shlex.split(args))  # type: ignore[misc]
    return env


_VARIABLE = re.compile(r"\$(?:(\$)|\{(\w+)(?:(:?[-?])([^}]*))?\}|(\w+))")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's substitution: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?error}`` and ``${VAR?error}``; the ``:``
    forms treat an empty value as unset. A missing required one raises."""

    def one(match: re.Match[str]) -> str:
        escaped, name, op, arg, bare = match.groups()
        if escaped:
            return "$"
        value = env.get(name or bare)
        if op is None:
            return value or ""
        unset = value is None or (op.startswith(":") and not value)
        if not unset:
            return value  # type: ignore[return-value]
        if op.endswith("-"):
            return arg
        raise ValueError(f"required variable {name} is missing a value: {arg}")

    return _VARIABLE.sub(one, text)


def _resolve(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_resolve(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _resolve(value, env) for key, value in node.items()}
    return node


def compose(env: Mapping[str, str] | None = None, cluster: bool = False) -> dict[str, Any]:
    """docker-compose.yml as parsed; with ``cluster``, docker-compose.cluster.yml
    layered on it as ``docker compose -f ... -f ...`` does (a service's
    mappings merged key by key, new services and volumes added); with
    ``env``, interpolated as Compose would."""
    parsed = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    if cluster:
        parsed = _merged(parsed, yaml.safe_load((ROOT / "docker-compose.cluster.yml").read_text()))
    return parsed if env is None else _resolve(parsed, env)


def _merged(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        elif not key.startswith("x-"):
            out[key] = value
    return out


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment``, in either of Compose's two forms."""
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def prometheus_job() -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "tierstore"]
    return job


def secret_of(credentials_file: str, service: Mapping[str, Any]) -> dict[str, Any]:
    """The long-syntax secret of ``service`` that Compose mounts at ``credentials_file``."""
    for grant in service.get("secrets", []):
        grant = {"source": grant} if isinstance(grant, str) else grant
        target = grant.get("target", grant["source"])
        if credentials_file in (target, f"/run/secrets/{target}"):
            return grant
    raise AssertionError(f"no secret of the service is mounted at {credentials_file}")


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (a path
    is out when it or one of its parent directories matches; last match wins)."""
    patterns = [
        l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()
        if l.strip() and not l.startswith("#")
    ]
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        glob = pattern.removeprefix("!").strip("/")
        regex = re.escape(glob).replace(r"\*\*/", "(?:.*/)?")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            ignored = not pattern.startswith("!")
    return ignored


def admin_get(path: str, token: str | None = None) -> httpx.Response:
    """GET ``path`` from the gateway's admin app (no S3 served), in process."""
    app = build_admin_app(Config(admin_token=TOKEN), _NotStarted())
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            return await client.get(path, headers=headers)

    return asyncio.run(ask())


def shell_env(**extra: str) -> dict[str, str]:
    """What `docker compose up` needs from the caller: the admin token."""
    return {"TIERSTORE_ADMIN_TOKEN": TOKEN, **extra}


# --------------------------------------------------------------------------
# The image


def test_image_runs_the_readme_command() -> None:
    image = exec_form("ENTRYPOINT") + exec_form("CMD")
    readme = readme_serve_command()
    assert Path(readme[0]).name == image[0] == "tierstore"
    assert readme[1:] == image[1:] == ["serve"]


def test_readme_test_command_is_what_ci_runs() -> None:
    block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL).group(1)
    test_line = [l for l in block.splitlines() if l and not l.startswith("#")][-1]
    ci = (ROOT / ".ci/run").read_text()
    assert f"exec {test_line}" in ci


def test_image_is_slim_and_runs_as_a_user() -> None:
    # The base is a build argument (scripts/base-image makes one where no
    # registry can be reached); users get the public slim image.
    assert instructions("FROM") == ["${BASE}"]
    assert instructions("ARG") == ["BASE=python:3.11-slim"]
    users = instructions("USER")
    user = users[-1].split(":")[0] if users else "root"
    assert user not in ("root", "0"), "the gateway must not run as root"
    steps = [word for word, _ in dockerfile()]
    assert steps.index("USER") < steps.index("ENTRYPOINT")


def test_dependencies_are_installed_before_the_source_is_copied() -> None:
    """Layer order for the build cache: a change of the source must not
    reinstall the dependencies; the package itself is installed, not linked."""
    steps = [f"{word} {args}" for word, args in dockerfile()]
    source = re.compile(r"COPY (gateway|tiering|packer)\b")
    first_source = next(i for i, s in enumerate(steps) if source.match(s))
    deps = next(i for i, s in enumerate(steps) if "pip install -r" in s)
    assert steps.index("COPY pyproject.toml ./") < deps < first_source
    assert "pyproject.toml" in steps[deps], "dependencies are read from pyproject.toml"
    final = [s for s in steps[first_source:] if "pip install" in s]
    assert final and all(" -e " not in s and "--editable" not in s for s in final)
    assert all("--no-deps ." in s for s in final), "the last install must not resolve again"


def test_image_listens_on_all_interfaces_with_its_data_dir_on_a_volume() -> None:
    env = image_env()
    assert env[env_name("host")] == env[env_name("admin_host")] == "0.0.0.0"
    volumes = [v for args in instructions("VOLUME") for v in json.loads(args)]
    data_dir = env[env_name("data_dir")]
    assert any(data_dir == v or data_dir.startswith(v + "/") for v in volumes), (data_dir, volumes)
    exposed = {int(p) for args in instructions("EXPOSE") for p in args.split()}
    assert exposed == {Config().port, Config().admin_port}


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    for args in instructions("COPY"):
        source = args.split()[0]
        assert (ROOT / source).exists(), source
        assert not dockerignored(source), f"{source} is excluded by .dockerignore"


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    for path in (".venv/bin/python", ".git/HEAD", "tierstore-data/credentials.toml",
                 "benchmarks/results/capacity.md", "gateway/__pycache__/cli.cpython-311.pyc",
                 "__pycache__/x.pyc", ".env"):
        assert dockerignored(path), path
    for path in ("pyproject.toml", "README.md", "gateway/cli/app.py", "tiering/hot/tier.py",
                 "packer/format.py"):
        assert not dockerignored(path), path


def test_healthcheck_probes_a_public_route_on_the_admin_port() -> None:
    command = exec_form("HEALTHCHECK")
    assert command[:2] == ["python", "-c"], "python:3.11-slim has no curl"
    code = command[2]
    path = re.search(r"\{scheme\}://127\.0\.0\.1:\{port\}(/[\w/]*)'", code).group(1)
    assert "TIERSTORE_TLS_CERT" in code  # https when the gateway has a certificate
    default_port = re.search(r"os\.environ\.get\('(\w+)'\) or '(\d+)'", code)
    assert default_port.group(1) == env_name("admin_port")
    assert int(default_port.group(2)) == Config().admin_port
    response = admin_get(path)
    # Public: no token needed. 503 here because the test app serves no S3.
    assert response.status_code in (200, 503), response.status_code


# --------------------------------------------------------------------------
# The compose file


def test_compose_references_existing_files_and_declared_volumes() -> None:
    parsed = compose()
    declared = set(parsed.get("volumes") or {})
    for name, service in parsed["services"].items():
        if "build" in service:
            build = service["build"]
            context = build if isinstance(build, str) else build["context"]
            assert (ROOT / context / "Dockerfile").is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
            else:
                assert source in declared, f"{name} uses volume {source!r}, not declared"
        for grant in service.get("secrets", []):
            source = grant if isinstance(grant, str) else grant["source"]
            assert source in parsed.get("secrets", {}), f"{name} uses undeclared secret {source!r}"
    for kind in ("secrets", "configs"):
        for name, spec in (parsed.get(kind) or {}).items():
            if "file" in spec:
                assert (ROOT / spec["file"]).exists(), f"{kind} {name}: {spec['file']}"


def test_compose_publishes_ports_on_loopback_only() -> None:
    services = compose(shell_env())["services"]
    for name, service in services.items():
        for port in service.get("ports", []):
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), f"{name}: {port}"
    container_ports = {int(p.rsplit(":", 1)[1]) for p in services["tierstore"]["ports"]}
    assert container_ports == {Config().port, Config().admin_port}


def test_every_tierstore_variable_is_a_setting_and_valid(tmp_path: Path) -> None:
    env = environment(compose(shell_env())["services"]["tierstore"])
    settings = {env_name(f.name) for f in fields(Config) if f.name != "credentials"}
    names = {name for name in env if name.startswith(ENV_PREFIX)}
    assert names - settings - EXTRA_VARIABLES == set(), "not settings of the gateway"
    assert env_name("capacity") in names
    config = load_config({"data_dir": tmp_path}, {**image_env(), **env})
    capacity = urlsplit(config.capacity)
    assert (capacity.scheme, capacity.path) == ("s3", "/tier")
    assert urlsplit(config.capacity_endpoint).hostname == "minio"
    assert config.admin_token == TOKEN
    assert (config.host, config.admin_host) == ("0.0.0.0", "0.0.0.0")


GATEWAYS = ("tierstore", "tierstore-b", "tierstore-c")


def test_the_cluster_layer_runs_three_gateways_over_one_bucket(tmp_path: Path) -> None:
    shell = shell_env(TIERSTORE_ACCESS_KEY="cluster-key", TIERSTORE_SECRET_KEY="cluster-secret")
    services = compose(shell, cluster=True)["services"]
    configs = {name: load_config({"data_dir": tmp_path / name}, {**image_env(), **environment(services[name])})
               for name in GATEWAYS}
    assert {c.node_id for c in configs.values()} == {"node-a", "node-b", "node-c"}
    assert len({c.capacity for c in configs.values()}) == 1  # one store
    assert len({tuple(c.credentials.items()) for c in configs.values()}) == 1  # one key pair
    for name, config in configs.items():
        # No fixed node list: each node joins the registry, advertising its
        # service's name and the S3 port inside the network.
        assert config.peers == {} and config.registry
        url = urlsplit(config.advertised_url or "")
        assert (url.hostname, url.port) == (name, Config().port)
    volumes = [v.split(":")[0] for name in GATEWAYS for v in services[name]["volumes"]]
    assert len(set(volumes)) == 3
    published = [p.rsplit(":", 1)[0] for name in GATEWAYS for p in services[name]["ports"]]
    assert len(set(published)) == 6 and all(p.startswith("127.0.0.1:") for p in published)
    for missing in ("TIERSTORE_ACCESS_KEY", "TIERSTORE_SECRET_KEY"):
        with pytest.raises(ValueError, match=missing):
            compose({k: v for k, v in shell.items() if k != missing}, cluster=True)


def test_the_admin_token_is_required_and_is_the_secret_prometheus_reads() -> None:
    with pytest.raises(ValueError, match="TIERSTORE_ADMIN_TOKEN"):
        compose({})
    parsed = compose(shell_env())
    credentials_file = prometheus_job()["authorization"]["credentials_file"]
    secret = secret_of(credentials_file, parsed["services"]["prometheus"])
    assert parsed["secrets"][secret["source"]] == {"environment": env_name("admin_token")}
    # Prometheus runs as nobody: the secret must be world-readable.
    assert secret.get("mode", 0o444) & 0o004


@pytest.mark.parametrize("chosen", [None, "datasets"])
def test_minio_init_creates_the_bucket_the_gateway_uses(chosen: str | None) -> None:
    services = compose(shell_env(**({"CAPACITY_BUCKET": chosen} if chosen else {})))["services"]
    gateway = environment(services["tierstore"])
    init = services["minio-init"]
    script = " ".join(init["command"])
    bucket = re.search(r"mc mb --ignore-existing \w+/([\w.-]+)", script).group(1)
    assert bucket == (chosen or bucket)
    assert gateway[env_name("capacity")] == f"s3://{bucket}/tier"
    alias = re.search(r"mc alias set \w+ (\S+)", script).group(1)
    assert alias == gateway[env_name("capacity_endpoint")] == "http://minio:9000"
    minio = environment(services["minio"])
    assert environment(init) == minio
    assert (gateway[env_name("capacity_access_key")], gateway[env_name("capacity_secret_key")]) == (
        minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    assert len(minio["MINIO_ROOT_PASSWORD"]) >= 8, "MinIO refuses shorter root passwords"
    assert init["restart"] == "no"
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    assert services["minio"]["healthcheck"]["test"]
    gateway_deps = services["tierstore"]["depends_on"]
    assert gateway_deps["minio-init"]["condition"] == "service_completed_successfully"


# --------------------------------------------------------------------------
# Prometheus


def test_prometheus_is_optional_and_loads_this_config() -> None:
    prometheus = compose(shell_env())["services"]["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]


def test_prometheus_scrapes_the_admin_port_and_the_metrics_route() -> None:
    job = prometheus_job()
    (target,) = [t for group in job["static_configs"] for t in group["targets"]]
    host, port = target.rsplit(":", 1)
    gateway = environment(compose(shell_env())["services"]["tierstore"])
    assert host == "tierstore" and host in compose()["services"]
    assert int(port) == int(gateway.get(env_name("admin_port")) or Config().admin_port)
    assert job.get("scheme", "http") == "http"
    assert job["authorization"].get("type", "Bearer") == "Bearer"
    served = admin_get(job["metrics_path"], TOKEN)
    refused = admin_get(job["metrics_path"])
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/plain")
    assert refused.status_code == 401
