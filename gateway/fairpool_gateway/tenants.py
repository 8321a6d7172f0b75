"""The tenant table: API keys to tenants, and what each tenant may do.

Keys are kept as SHA-256 digests only. A presented key is hashed and compared with every
known digest in constant time (`hmac.compare_digest`, and no early exit), so neither the
answer's timing nor the table's layout tells an attacker how close a guess was. Keys are
never logged; a refused request logs only that the key was missing or unknown.

Key files (`apiKeyFiles`: one key a line; blank lines and lines starting with `#` are not
keys) are followed with `fairpool.files`: `refresh` re-reads them when any changed, so a key
removed from a mounted Secret stops working within the gateway's reload interval. A key
that two tenants list (in their files, or a file and a digest) authenticates neither and is
logged naming both: it is never silently given to one of them.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

from fairpool.api.gateway_config import GatewayConfig, GatewayTenant, key_digest
from fairpool.files import FileWatch
from fairpool_gateway.protocol import GatewayError

log = logging.getLogger("fairpool.gateway")


@dataclass(frozen=True)
class KeyEntry:
    digest: bytes
    tenant: GatewayTenant


class TenantTable:
    def __init__(self, config: GatewayConfig) -> None:
        self.tenants = {tenant.tenant: tenant for tenant in config.tenants}
        self._config = config
        files = [name for tenant in config.tenants for name in tenant.api_key_files]
        self._files = FileWatch(*files)  # before reading them: a change meanwhile is seen
        self._keys = _key_entries(config)

    def refresh(self) -> bool:
        """Re-read the key files if any changed (appeared, vanished, was replaced); True
        if they did. Keys added work from now on, keys removed no longer do."""
        if not self._files.changed():
            return False
        self._keys = _key_entries(self._config)
        log.info("API key files changed: %d keys in the tenant table", len(self._keys))
        return True

    def weights(self) -> dict[str, float]:
        return {name: tenant.weight for name, tenant in self.tenants.items()}

    def tenants_of_pools(self, pools: Iterable[str]) -> dict[str, list[str]]:
        """Each pool's tenants: those that list it, and those that list none (every pool)."""
        return {
            pool: sorted(
                name
                for name, tenant in self.tenants.items()
                if not tenant.pools or pool in tenant.pools
            )
            for pool in pools
        }

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


def _key_entries(config: GatewayConfig) -> list[KeyEntry]:
    """Every tenant's keys (digests and files), each once; a key two tenants list is
    nobody's."""
    owners: dict[str, list[GatewayTenant]] = {}
    for tenant in config.tenants:
        for digest in dict.fromkeys([*tenant.api_key_sha256, *_file_key_digests(tenant)]):
            owners.setdefault(digest, []).append(tenant)
    entries = []
    for digest, tenants in owners.items():
        if len(tenants) > 1:
            names = " and ".join(repr(tenant.tenant) for tenant in tenants)
            log.error(
                "an API key (digest %s…) is listed under tenants %s: it authenticates neither",
                digest[:12],
                names,
            )
            continue
        entries.append(KeyEntry(bytes.fromhex(digest), tenants[0]))
    return entries


def _file_key_digests(tenant: GatewayTenant) -> list[str]:
    """Digests of the keys in the tenant's key files (one per line, as a mounted Secret
    holds them; blank lines and `#` comments are not keys); an unreadable file is logged by
    name and skipped."""
    digests = []
    for name in tenant.api_key_files:
        try:
            lines = Path(name).read_text().splitlines()
        except OSError as error:
            log.error("tenant %s: cannot read API key file %s: %s", tenant.tenant, name, error)
            continue
        keys = [line.strip() for line in lines]
        digests += [key_digest(key) for key in keys if key and not key.startswith("#")]
    return digests
