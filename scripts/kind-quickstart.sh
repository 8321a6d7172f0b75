#!/usr/bin/env bash
# fairpool on a local kind cluster, from source: builds the operator, gateway and engine-sim
# images, loads them into kind, installs the chart with them, applies examples/cluster.yaml
# (simulated engines, no GPU) with a random key per tenant, waits for the pool, and sends one
# OpenAI request through the gateway. docs/kind.md explains each step.
#
# Needs docker (with buildx), kind, kubectl, helm, curl and openssl. Run from anywhere:
#   scripts/kind-quickstart.sh             # cluster `fairpool`, tag `dev`
#   CLUSTER=mine TAG=test scripts/kind-quickstart.sh
set -euo pipefail

CLUSTER="${CLUSTER:-fairpool}"
TAG="${TAG:-dev}"
NAMESPACE="${NAMESPACE:-fairpool}"
REGISTRY="${REGISTRY:-fairpool.local}"
PORT="${PORT:-8080}"
IMAGES=(operator gateway engine-sim)

cd "$(dirname "$0")/.."

platform() {
  case "$(uname -m)" in
    x86_64 | amd64) echo linux/amd64 ;;
    aarch64 | arm64) echo linux/arm64 ;;
    *) echo "unsupported machine: $(uname -m)" >&2; return 1 ;;
  esac
}

create_cluster() {
  if kind get clusters | grep -qx "$CLUSTER"; then
    echo "kind cluster $CLUSTER exists: reusing it"
  else
    kind create cluster --name "$CLUSTER" --wait 120s
  fi
}

build_and_load() {
  make images IMAGES="${IMAGES[*]}" REGISTRY="$REGISTRY" TAG="$TAG" PLATFORMS="$(platform)"
  local name
  for name in "${IMAGES[@]}"; do
    kind load docker-image --name "$CLUSTER" "$REGISTRY/$name:$TAG"
  done
}

install_chart() {
  helm upgrade --install fairpool charts/fairpool --namespace "$NAMESPACE" --create-namespace \
    --set images.registry="$REGISTRY" \
    --set images.operator.tag="$TAG" --set images.gateway.tag="$TAG" \
    --set images.engineSim.tag="$TAG" --set images.engine.tag="$TAG" \
    --set images.pullPolicy=IfNotPresent \
    --wait --timeout 5m
}

create_keys() {
  local tenant
  for tenant in flood light; do
    if ! kubectl get secret "$tenant-api-keys" -n "$NAMESPACE" > /dev/null 2>&1; then
      kubectl create secret generic "$tenant-api-keys" -n "$NAMESPACE" \
        --from-literal=key="sk-$(openssl rand -hex 24)"
    fi
    kubectl label secret "$tenant-api-keys" -n "$NAMESPACE" fairpool.io/api-keys=true --overwrite
  done
}

wait_for_pool() {
  kubectl apply -n "$NAMESPACE" -f examples/cluster.yaml
  kubectl wait -n "$NAMESPACE" --for=condition=Ready inferencepool/chat --timeout=10m
  kubectl wait -n "$NAMESPACE" --for=condition=Ready tenantquota/flood tenantquota/light \
    --timeout=5m
  kubectl wait -n "$NAMESPACE" --for=condition=Ready pod --timeout=5m \
    -l app.kubernetes.io/instance=fairpool,app.kubernetes.io/component=gateway
}

ask() {
  local key forward
  key="$(kubectl get secret light-api-keys -n "$NAMESPACE" -o jsonpath='{.data.key}' | base64 -d)"
  kubectl port-forward -n "$NAMESPACE" svc/fairpool-gateway "$PORT:8080" > /dev/null &
  forward=$!
  trap 'kill "$forward" 2> /dev/null || true' EXIT
  local attempt
  for attempt in $(seq 1 30); do
    if curl -fsS "http://127.0.0.1:$PORT/healthz" > /dev/null 2>&1; then
      break
    fi
    echo "waiting for the port-forward ($attempt)"
    sleep 1
  done
  curl -fsS "http://127.0.0.1:$PORT/v1/chat/completions" \
    -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d '{"model": "demo-chat", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}'
  echo
}

create_cluster
build_and_load
install_chart
create_keys
wait_for_pool
ask
echo "done: kind delete cluster --name $CLUSTER removes it all"
