# syntax=docker/dockerfile:1
# The fairpool gateway: the tenant-facing OpenAI API (keys, limits, fair queue, D2LPM routing).
# Build from the repository root:
#   docker build -f images/gateway.Dockerfile -t ghcr.io/fairpool/gateway:0.1.0 .
# `make pin-bases` pins the base by digest; a release needs it (images/README.md).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- build: the package and its `gateway` extra in a virtual environment without pip ---------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fairpool/ fairpool/
COPY gateway/ gateway/
COPY engine/ engine/
COPY operator/ operator/
COPY cli/ cli/
COPY reproduce/ reproduce/
COPY images/locks/gateway.txt images/locks/
# The dependencies come from the lock (`make image-lock`: the `gateway` extra, with hashes), the
# package itself without them; `pip check` fails the build when the lock is stale.
RUN python -m venv --without-pip /opt/fairpool \
    && python -m pip --python /opt/fairpool/bin/python install \
        --no-cache-dir --disable-pip-version-check --require-hashes --no-deps \
        -r images/locks/gateway.txt \
    && python -m pip --python /opt/fairpool/bin/python install \
        --no-cache-dir --disable-pip-version-check --no-deps . \
    && python -m pip --python /opt/fairpool/bin/python check

# --- runtime: non-root, read-only root filesystem (writes go to /tmp, an emptyDir) ----------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="fairpool-gateway" \
      org.opencontainers.image.description="fairpool's OpenAI-compatible multi-tenant gateway" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 fairpool \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin fairpool
COPY --from=build /opt/fairpool /opt/fairpool
ENV PATH=/opt/fairpool/bin:$PATH \
    HOME=/tmp \
    TMPDIR=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# 8080: tenant API; 8081: admin API (metrics, tenant state; keep it private).
EXPOSE 8080 8081
# Kubernetes ignores HEALTHCHECK: the chart probes /healthz and /readyz itself.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["fairpool", "gateway"]
CMD ["--config", "/etc/fairpool/gateway/gateway.yaml"]
