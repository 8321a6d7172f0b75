# syntax=docker/dockerfile:1
# The fairpool engine: the official vLLM OpenAI image with fairpool's scheduler plugin. Its
# entrypoint, `fairpool engine`, runs vLLM's `serve` with the fair scheduler, the tenant checks
# and the per-tenant metrics wired in, reading the scheduler configuration the operator mounts
# (FAIRPOOL_SCHEDULER_CONFIG). Options it does not know go to vLLM:
#   docker run --gpus all IMAGE --model /models/llama-3-8b --max-model-len 8192
# Build from the repository root:
#   docker build -f images/engine.Dockerfile -t ghcr.io/fairpool/engine:0.1.0 .
# The plugin is written against vLLM 0.32.0 (engine/fairpool_engine/vllm/compat.py) and
# refuses other versions, so the base is pinned to that release (`make pin-bases` adds the
# digest; a release needs it, see images/README.md).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0

# --- wheel: fairpool as a pure-Python wheel (its dependencies come from the vLLM image) -----
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fairpool/ fairpool/
COPY gateway/ gateway/
COPY engine/ engine/
COPY operator/ operator/
COPY cli/ cli/
COPY reproduce/ reproduce/
RUN python -m pip wheel --no-cache-dir --disable-pip-version-check --no-deps \
        --wheel-dir /wheels .

# --- runtime: vLLM plus fairpool's `engine` extra, non-root, read-only-root friendly ---------
FROM ${VLLM_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="fairpool-engine" \
      org.opencontainers.image.description="vLLM with fairpool's fair multi-tenant scheduler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# The vLLM check fails the build at once when the base is not the release the plugin supports.
# The `engine` extra's dependencies (starlette, uvicorn, prometheus-client) and the `fetch`
# extra's huggingface_hub and filelock are vLLM's own already: pip keeps the image's versions,
# which satisfy fairpool's ranges. The `fetch` extra adds boto3 and google-cloud-storage (for
# s3:// and gs:// model sources, `fairpool fetch-model` in the pods' init step), unlocked:
# their newest releases within fairpool's ranges at build time. The wheel is bind-mounted from
# the stage above, so it leaves no layer behind. (DL3013 asks to pin what pip installs: it is
# that wheel, built from this very tree.)
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    python3 -c "import importlib.metadata as m; v = m.version('vllm'); assert v == '0.32.0', v" \
    && wheel="$(echo /tmp/wheels/fairpool-*.whl)" \
    && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir \
        --disable-pip-version-check "${wheel}[engine,fetch]" \
    && groupadd --system --gid 10001 fairpool \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin fairpool
# Every cache vLLM, PyTorch, Triton and Hugging Face write goes under /tmp (an emptyDir in the
# engine pods), so the root filesystem can be read-only. PROMETHEUS_MULTIPROC_DIR is not set
# here: `fairpool engine` makes a fresh one under $TMPDIR for each run (a stale one would
# mix the metrics of a previous run into the next).
ENV HOME=/tmp \
    TMPDIR=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    XDG_CONFIG_HOME=/tmp/.config \
    HF_HOME=/tmp/.cache/huggingface \
    VLLM_CACHE_ROOT=/tmp/.cache/vllm \
    TRITON_CACHE_DIR=/tmp/.cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/tmp/.cache/torchinductor \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# 8000: the OpenAI API, /health and /metrics (vLLM's port).
EXPOSE 8000
# Loading a model takes minutes, hence the long start period. Kubernetes ignores HEALTHCHECK:
# the operator gives engine pods a readiness probe on /health.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["fairpool", "engine"]
