"""fairpool's Kubernetes operator (kopf).

It reconciles each InferencePool into the engine Deployment, a headless Service and the
scheduler ConfigMap, and every TenantQuota into the gateway's tenant table (one Secret), and
reports status on both. The parts, from pure to effectful:

- `contract`: the names, labels, paths and environment the Helm chart relies on;
- `render`: pure functions from a pool or the tenant table to Kubernetes objects;
- `plan`: pure: every object the namespace should hold and every problem found, from the
  pools, tenants and key Secrets (what `fairpool render` prints);
- `status`: pure: pool and tenant status from what the API holds;
- `reconcile`: compares the plan with the API and writes only what differs, through the
  small `api.Api` interface (faked in unit tests, `kube.KubernetesApi` in a cluster);
- `handlers`: the kopf handlers, each one line into `reconcile`; `main`: `fairpool operator`.
"""
