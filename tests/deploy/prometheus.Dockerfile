# A stand-in for prom/prometheus where its image cannot be pulled: Debian's
# own prometheus package on the same base as the gateway's image, laid out
# as the official image is (config in /etc/prometheus, data in /prometheus,
# user nobody). Used only by scripts/image-check.
ARG BASE=python:3.11-slim
FROM ${BASE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus \
    && chown 65534:65534 /prometheus
USER 65534:65534
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
