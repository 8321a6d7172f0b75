# syntax=docker/dockerfile:1
# The fairpool operator (kopf): reconciles InferencePools and TenantQuotas.
# Build from the repository root:
#   docker build -f images/operator.Dockerfile -t ghcr.io/fairpool/operator:0.1.0 .
# `make pin-bases` pins the base by digest; a release needs it (images/README.md).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- build: the package and its `operator` extra in a virtual environment without pip --------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fairpool/ fairpool/
COPY gateway/ gateway/
COPY engine/ engine/
COPY operator/ operator/
COPY cli/ cli/
COPY reproduce/ reproduce/
COPY images/locks/operator.txt images/locks/
# The dependencies come from the lock (`make image-lock`: the `operator` extra, with hashes), the
# package itself without them; `pip check` fails the build when the lock is stale.
RUN python -m venv --without-pip /opt/fairpool \
    && python -m pip --python /opt/fairpool/bin/python install \
        --no-cache-dir --disable-pip-version-check --require-hashes --no-deps \
        -r images/locks/operator.txt \
    && python -m pip --python /opt/fairpool/bin/python install \
        --no-cache-dir --disable-pip-version-check --no-deps . \
    && python -m pip --python /opt/fairpool/bin/python check

# --- runtime: non-root, read-only root filesystem (writes go to /tmp, an emptyDir) ----------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="fairpool-operator" \
      org.opencontainers.image.description="fairpool's Kubernetes operator for InferencePool and TenantQuota" \
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
# 8080: kopf's liveness endpoint, when run with `--liveness http://0.0.0.0:8080/healthz`.
EXPOSE 8080
# The chart runs the operator with that flag and gives it a liveness probe on /healthz (and
# Kubernetes ignores HEALTHCHECK anyway). Without the flag nothing listens, so the image
# declares no HEALTHCHECK of its own.
HEALTHCHECK NONE
ENTRYPOINT ["fairpool", "operator"]
