"""The tenant table: API keys to tenants, and what each tenant may do.

Keys are kept as SHA-256 digests only. A presented key is hashed and compared with every
known digest in constant time (`hmac.compare_digest`, and no early exit), so neither the
answer's timing nor the table's layout tells an attacker how close a guess was. Keys are
never logged; a refused request logs only that the key was missing or unknown.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

from fairpool.api.gateway_config import GatewayConfig, GatewayTenant, key_digest
from fairpool_gateway.protocol import GatewayError

log = logging.getLogger("fairpool.gateway")


@dataclass(frozen=True)
class KeyEntry:
    digest: bytes
    tenant: GatewayTenant


class TenantTable:
    def __init__(self, config: GatewayConfig) -> None:
        self.tenants = {tenant.tenant: tenant for tenant in config.tenants}
        self._keys = [
            KeyEntry(bytes.fromhex(digest), tenant)
            for tenant in config.tenants
            for digest in [*tenant.api_key_sha256, *_file_key_digests(tenant)]
        ]

    def weights(self) -> dict[str, float]:
        return {name: tenant.weight for name, tenant in self.tenants.items()}

    def authenticate(self, authorization: str | None) -> GatewayTenant:
        """The tenant whose key is in an `Authorization: Bearer KEY` header; 401 if none."""
        if not authorization:
            raise unauthorized("Missing API key: send the header `Authorization: Bearer KEY`.")
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise unauthorized("Malformed Authorization header: expected `Bearer KEY`.")
        presented = bytes.fromhex(key_digest(key))
        found: GatewayTenant | None = None
        for entry in self._keys:  # no early exit: every key costs the same
            if hmac.compare_digest(entry.digest, presented):
                found = entry.tenant
        if found is None:
            raise unauthorized("Incorrect API key provided.")
        return found


def unauthorized(message: str) -> GatewayError:
    return GatewayError(
        HTTPStatus.UNAUTHORIZED,
        message,
        "invalid_request_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def _file_key_digests(tenant: GatewayTenant) -> list[str]:
    """Digests of the keys in the tenant's key files (one per line, as a mounted Secret
    holds them); an unreadable file is logged by name and skipped."""
    digests = []
    for name in tenant.api_key_files:
        try:
            lines = Path(name).read_text().splitlines()
        except OSError as error:
            log.error("tenant %s: cannot read API key file %s: %s", tenant.tenant, name, error)
            continue
        digests += [key_digest(line.strip()) for line in lines if line.strip()]
    return digests
