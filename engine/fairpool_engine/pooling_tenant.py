"""How a tenant reaches vLLM's scheduler on a pooling request (`/v1/embeddings`).

vLLM 0.32 copies `vllm_xargs` into `SamplingParams.extra_args` on completions, chat and
responses, where the fair scheduler reads the tenant. Its embeddings request has no
`vllm_xargs` (an unknown field it ignores) and a pooling request carries no sampling
parameters: its `PoolingParams.extra_kwargs` exist, but no HTTP field fills them. Of what
the embeddings request does carry to the engine's `Request`, only `cache_salt` is a free
string that the scheduler can read and the client does not get back. So the engine's
middleware moves `vllm_xargs.fairpool_tenant` into the salt, and the scheduler reads it
from there:

    cache_salt = "fairpool-tenant:" + quote(tenant) [+ ":" + sha256(client's salt)[:32]]

The salt keeps its meaning — a client's own salt still isolates its cache entries, now
within its tenant — and adds one: a tenant's embeddings share the prefix cache only with
its own, as with a salt per tenant. vLLM allows at most 128 characters without `@ / \\`
or NUL; quoting removes those, and fairpool's tenant names (DNS labels, at most 63) always
fit. engine-sim, which has no salt to carry, keeps the same per-tenant cache isolation.

This module imports nothing of vLLM: the middleware, the scheduler and engine-sim use it.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote, unquote

PREFIX = "fairpool-tenant:"
#: vLLM's limit on `cache_salt` (`validate_cache_salt`).
MAX_SALT = 128
_CLIENT_DIGEST = 32


def salt_for(tenant: str, client_salt: str | None = None) -> str:
    """The `cache_salt` that carries `tenant` (and keeps a client's salt, digested)."""
    salt = PREFIX + quote(tenant, safe="")
    if client_salt:
        salt += ":" + hashlib.sha256(client_salt.encode()).hexdigest()[:_CLIENT_DIGEST]
    return salt


def fits(tenant: str) -> bool:
    """Whether `tenant` can travel in a salt, with room for a client's salt digest."""
    return len(salt_for(tenant, "x")) <= MAX_SALT


def tenant_in(salt: object) -> str | None:
    """The tenant a `cache_salt` carries, or None if it carries none."""
    if not isinstance(salt, str) or not salt.startswith(PREFIX):
        return None
    return unquote(salt[len(PREFIX) :].split(":", 1)[0]) or None
