# syntax=docker/dockerfile:1
# fairpool engine-sim: vLLM's OpenAI API and metrics over a simulated GPU, with the fair scheduler.
# What `engine.kind: sim` pools run (local mode, CI, load tests); no GPU, no model weights.
# Build from the repository root:
#   docker build -f images/engine-sim.Dockerfile -t ghcr.io/fairpool/engine-sim:0.1.0 .
# `make pin-bases` pins the base by digest; a release needs it (images/README.md).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- build: the package and its `engine` extra in a virtual environment without pip ----------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fairpool/ fairpool/
COPY gateway/ gateway/
COPY engine/ engine/
COPY operator/ operator/
COPY cli/ cli/
COPY reproduce/ reproduce/
COPY images/locks/engine-sim.txt images/locks/
# The dependencies come from the lock (`make image-lock`: the `engine` extra, with hashes), the
# package itself without them; `pip check` fails the build when the lock is stale.
RUN python -m venv --without-pip /opt/fairpool \
    && python -m pip --python /opt/fairpool/bin/python install \
        --no-cache-dir --disable-pip-version-check --require-hashes --no-deps \
        -r images/locks/engine-sim.txt \
    && python -m pip --python /opt/fairpool/bin/python install \
        --no-cache-dir --disable-pip-version-check --no-deps . \
    && python -m pip --python /opt/fairpool/bin/python check

# --- runtime: non-root, read-only root filesystem (writes go to /tmp, an emptyDir) ----------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="fairpool-engine-sim" \
      org.opencontainers.image.description="fairpool's simulated vLLM engine (no GPU)" \
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
# 8000: the OpenAI API, /health and /metrics, as vLLM's.
EXPOSE 8000
# Kubernetes ignores HEALTHCHECK: the operator gives engine pods a readiness probe on /health.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
ENTRYPOINT ["fairpool", "engine-sim"]
CMD ["--host", "0.0.0.0", "--port", "8000"]
