"""API models of InferencePool and TenantQuota (filled in with the operator)."""
