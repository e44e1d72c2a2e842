# tierstore gateway image: the same `tierstore serve` the README starts.
FROM python:3.11-slim

RUN useradd --create-home --uid 10001 tierstore
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY tiering ./tiering
COPY packer ./packer
RUN pip install --no-cache-dir .

USER tierstore
WORKDIR /data
# Listen on all interfaces inside the container; publish ports explicitly.
ENV TIERSTORE_HOST=0.0.0.0 \
    TIERSTORE_ADMIN_HOST=0.0.0.0 \
    TIERSTORE_DATA_DIR=/data/tierstore-data
EXPOSE 9100 9101
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9101/health').status == 200 else 1)"
ENTRYPOINT ["tierstore"]
CMD ["serve"]
