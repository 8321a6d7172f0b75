"""How a tenant reaches vLLM's scheduler on a pooling request (`/v1/embeddings`).

vLLM 0.32 copies `vllm_xargs` into `SamplingParams.extra_args` on completions, chat and
responses, where the fair scheduler reads the tenant. Its embeddings request has no
`vllm_xargs` (an unknown field it ignores) and a pooling request carries no sampling
parameters: its `PoolingParams.extra_kwargs` exist, but no HTTP field fills them. Of what
the embeddings request does carry to the engine's `Request`, only `cache_salt` is a free
string that the scheduler can read and the client does not get back. So the engine's
middleware moves `vllm_xargs.fairpool_tenant` into the salt, and the scheduler reads it
from there:

    cache_salt = "fairpool-tenant:" + quote(tenant)
                 [+ ";" + band] [+ ":" + sha256(client's salt)[:32]]

The band is there when the request's `vllm_xargs.fairpool_band` asks one, so that an
embedding runs in the same flow (`fairpool.sched.tree.flow`) as a generation request with
the same xargs. The salt keeps its meaning — a client's own salt still isolates its cache
entries, now within its tenant — and adds one: a tenant's embeddings share the prefix
cache only with its own (in the same band, when a band is asked), as with a salt per
tenant. vLLM allows at most 128 characters without `@ / \\` or NUL; quoting removes those
(and the `;` before the band), and fairpool's tenant names (DNS labels, at most 63) always
fit. engine-sim keeps the same salts, so the same per-tenant cache isolation.

This module imports nothing of vLLM: the middleware, the scheduler and engine-sim use it.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote, unquote

from fairpool.api.scheduler_config import BAND_XARG, TENANT_XARG, tenant_of
from fairpool.sched.errors import ConfigError
from fairpool.sched.tree import BAND_NAMES

PREFIX = "fairpool-tenant:"
#: Between the tenant and the band (quoting escapes it in a tenant's name).
BAND_MARK = ";"
#: vLLM's limit on `cache_salt` (`validate_cache_salt`).
MAX_SALT = 128
_CLIENT_DIGEST = 32
_LONGEST_BAND = max(BAND_NAMES, key=len)
EMBEDDINGS = "/v1/embeddings"


def salt_for(tenant: str, client_salt: str | None = None, band: str | None = None) -> str:
    """The `cache_salt` that carries `tenant` and the `band` its request asks (and keeps
    a client's salt, digested)."""
    salt = PREFIX + quote(tenant, safe="")
    if band:
        salt += BAND_MARK + band
    if client_salt:
        salt += ":" + hashlib.sha256(client_salt.encode()).hexdigest()[:_CLIENT_DIGEST]
    return salt


def fits(tenant: str) -> bool:
    """Whether `tenant` can travel in a salt, with room for a band and a client's salt
    digest."""
    return len(salt_for(tenant, "x", _LONGEST_BAND)) <= MAX_SALT


def xargs_in(salt: object) -> dict[str, str] | None:
    """The fairpool `vllm_xargs` (tenant, and band if asked) a `cache_salt` carries, or
    None if it carries none."""
    if not isinstance(salt, str) or not salt.startswith(PREFIX):
        return None
    quoted, _, band = salt[len(PREFIX) :].split(":", 1)[0].partition(BAND_MARK)
    tenant = unquote(quoted)
    if not tenant:
        return None
    return {TENANT_XARG: tenant, BAND_XARG: band} if band else {TENANT_XARG: tenant}


def tenant_in(salt: object) -> str | None:
    """The tenant a `cache_salt` carries, or None if it carries none."""
    xargs = xargs_in(salt)
    return None if xargs is None else xargs[TENANT_XARG]


def carrying(xargs: object, client_salt: str | None) -> str | None:
    """The `cache_salt` an embeddings request reaches vLLM's scheduler with: its
    `vllm_xargs`' tenant and band, and the client's salt digested; the client's own salt
    when the xargs name neither. ConfigError, naming the field, for a client's salt that
    looks like fairpool's or a tenant too long to travel."""
    if xargs_in(client_salt) is not None:
        raise ConfigError("cache_salt", f"values starting with {PREFIX!r} are fairpool's")
    if not isinstance(xargs, dict) or (TENANT_XARG not in xargs and BAND_XARG not in xargs):
        return client_salt
    tenant = tenant_of(xargs)
    if not fits(tenant):
        raise ConfigError(
            f"vllm_xargs.{TENANT_XARG}",
            f"is too long to reach vLLM's scheduler on {EMBEDDINGS} "
            f"(fairpool's tenant names are DNS labels of at most 63 characters)",
        )
    band = xargs.get(BAND_XARG)
    return salt_for(tenant, client_salt, band if isinstance(band, str) else None)
