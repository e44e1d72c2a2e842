# tierstore gateway image: the same `tierstore serve` the README starts,
# listening on every interface of the container, its data dir on /data.
# docs/deployment.md: building, running, volumes, credentials.
# BASE: any image with Python 3.11+ and pip; where no registry can be
# reached, scripts/base-image makes one from Debian's packages.
ARG BASE=python:3.11-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# /data is created owned by the gateway's user: a new named volume mounted
# there starts with this ownership.
RUN groupadd --gid 10001 tierstore \
    && useradd --create-home --uid 10001 --gid 10001 tierstore \
    && mkdir /data \
    && chown 10001:10001 /data

# jemalloc, the allocator the gateway runs on here (TIERSTORE_MALLOC below;
# docs/configuration.md#memory), from the base's Debian packages. A base
# without apt-get gets none: the gateway then says so and runs on glibc's.
RUN if command -v apt-get >/dev/null; then \
        apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libjemalloc2 \
        && rm -rf /var/lib/apt/lists/* /var/cache/apt/*; \
    fi

WORKDIR /src
# Dependencies first, read from pyproject.toml itself (no second list to keep
# in step), so a change of the source rebuilds only the layers below.
COPY pyproject.toml ./
# The gateway is the base install (the client) plus its `server` extra.
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['server']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY README.md ./
COPY gateway ./gateway
COPY tiering ./tiering
COPY packer ./packer
RUN pip install --no-deps . \
    && pip check \
    && rm -rf /src/build /src/*.egg-info

# Numeric, so an orchestrator can tell it is not root (runAsNonRoot).
USER 10001:10001
WORKDIR /data
# Listen on all interfaces inside the container; the compose file publishes
# the ports on the host's loopback only.
ENV TIERSTORE_HOST=0.0.0.0 \
    TIERSTORE_ADMIN_HOST=0.0.0.0 \
    TIERSTORE_DATA_DIR=/data \
    TIERSTORE_MALLOC=jemalloc
VOLUME ["/data"]
EXPOSE 9100 9101
# GET /health on the admin port is public: 503 while starting or stopping,
# 200 while S3 is served. The start period covers the start-up sweep. With
# TLS (TIERSTORE_TLS_CERT) the probe speaks https to its own process over
# loopback without checking the certificate's names, which need not include
# 127.0.0.1.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, ssl, urllib.request; port = os.environ.get('TIERSTORE_ADMIN_PORT') or '9101'; tls = bool(os.environ.get('TIERSTORE_TLS_CERT')); scheme = 'https' if tls else 'http'; urllib.request.urlopen(f'{scheme}://127.0.0.1:{port}/health', timeout=3, context=ssl._create_unverified_context() if tls else None)"]
ENTRYPOINT ["tierstore"]
CMD ["serve"]
