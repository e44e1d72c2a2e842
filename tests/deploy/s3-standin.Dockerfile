# A stand-in for MinIO where its image cannot be pulled: moto's S3 server
# (PyPI) on the same base as the gateway's image. Used only by
# scripts/image-check, through tests/deploy/compose.check.yml.
ARG BASE=python:3.11-slim
FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install "moto[server]>=5" boto3
USER 65534:65534
ENTRYPOINT ["moto_server"]
