"""Where a run's tenants come from: `--tenant` flags, a `--tenants-file`, the TenantQuota
and Secret manifests of `--keys-from` (keys and weights), and a trace's tenant names.

    --tenant flood:key=sk-flood,weight=1,rate=20
    --tenant light:key=sk-light,weight=2,concurrency=4,output-tokens=16

Every part is named; errors name the flag (or the file and entry) and the part. A name is
a tenant id, as a TenantQuota's `spec.tenant`: the run's tenants are the gateway's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from fairpool.api.tenant_quota import tenant_id
from fairpool.sched.errors import ConfigError
from fairpool_cli.load.spec import TenantSpec

Fields = dict[str, Any]  # TenantSpec keyword arguments, as given so far

PARTS: dict[str, type] = {
    "key": str,
    "weight": float,
    "rate": float,
    "concurrency": int,
    "prompt-tokens": int,
    "output-tokens": int,
}


def parse_tenant_flag(text: str) -> tuple[str, Fields]:
    """`NAME:PART=VALUE,...` → (name, fields)."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise ConfigError("--tenant", f"expected NAME:PART=VALUE,..., got {text!r}")
    tenant_id(name, "--tenant")
    where = f"--tenant {name}"
    fields: Fields = {}
    for part in (piece.strip() for piece in rest.split(",") if piece.strip()):
        label, separator, value = part.partition("=")
        if not separator:
            raise ConfigError(where, f"{part!r}: expected PART=VALUE; parts: {', '.join(PARTS)}")
        _add_field(fields, where, label.strip(), value.strip())
    return name, fields


def read_tenants_file(path: str | Path) -> list[tuple[str, Fields]]:
    """A YAML list of tenants (or `tenants:` holding one), each a mapping with `name` and
    the parts of `--tenant`."""
    source = Path(path)
    if not source.is_file():
        raise ConfigError("--tenants-file", f"no such file: {source}")
    try:
        document = yaml.safe_load(source.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(source.name, f"not valid YAML: {error}") from None
    if isinstance(document, dict) and "tenants" in document:
        document = document["tenants"]
    if not isinstance(document, list) or not document:
        raise ConfigError(source.name, "must be a non-empty list of tenants")
    return [
        _file_entry(entry, f"{source.name}: tenants[{index}]")
        for index, entry in enumerate(document)
    ]


def _file_entry(entry: object, where: str) -> tuple[str, Fields]:
    if not isinstance(entry, dict):
        raise ConfigError(where, f"must be a mapping, got {entry!r}")
    name = tenant_id(entry.get("name"), f"{where}.name")
    fields: Fields = {}
    for label, value in entry.items():
        if label != "name":
            _add_field(fields, f"{where} ({name})", str(label), value)
    return name, fields


def _add_field(fields: Fields, where: str, part: str, value: object) -> None:
    kind = PARTS.get(part)
    if kind is None:
        raise ConfigError(where, f"unknown part {part!r}; known: {', '.join(PARTS)}")
    attribute = part.replace("-", "_")
    if attribute in fields:
        raise ConfigError(where, f"{part} given twice")
    fields[attribute] = _convert(f"{where}: {part}", value, kind)


def _convert(where: str, value: object, kind: type) -> object:
    """A part's value as its type: text for the key, numbers > 0 (integers >= 1) else."""
    if kind is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(where, f"must be non-empty text, got {value!r}")
        return value
    number: float | None = None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    if kind is int:
        if number is None or not number.is_integer() or number < 1:
            raise ConfigError(where, f"must be an integer >= 1, got {value!r}")
        return int(number)
    if number is None or not math.isfinite(number) or number <= 0:
        raise ConfigError(where, f"must be a number > 0, got {value!r}")
    return number


def tenants_from_manifests(paths: Sequence[str]) -> dict[str, Fields]:
    """Tenant → {weight, key} from TenantQuotas and the Secrets they reference (the first
    key of each; no key for a quota without a secret reference)."""
    from fairpool.api.gateway_config import api_keys
    from fairpool.api.manifests import load_manifests

    manifests = load_manifests(*paths, option="--keys-from")
    known: dict[str, Fields] = {}
    for quota in manifests.quotas:
        where = f"--keys-from: TenantQuota {quota.metadata.name}: spec.apiKeySecretRef"
        keys = api_keys(manifests, quota.spec.api_key_secret_ref, where)
        known[quota.tenant] = {"weight": quota.spec.weight, **({"key": keys[0]} if keys else {})}
    if not known:
        raise ConfigError("--keys-from", "no TenantQuota in " + ", ".join(paths))
    return known


def resolve_tenants(
    explicit: Iterable[tuple[str, Fields]],
    known: dict[str, Fields],
    trace_tenants: Sequence[str] = (),
    default_rate: float | None = None,
    default_concurrency: int = 4,
) -> tuple[TenantSpec, ...]:
    """The run's tenants. Explicit ones (flags, file) win over what the manifests say of
    them; without explicit ones every manifest tenant takes part. With a trace its
    tenants take part, and arrivals come from the trace. A tenant that names neither rate
    nor concurrency gets `default_rate` if set, else `default_concurrency`."""
    given: dict[str, Fields] = {}
    for name, fields in explicit:
        if name in given:
            raise ConfigError(f"--tenant {name}", "given twice")
        given[name] = fields
    if trace_tenants:
        stray = next((name for name in given if name not in trace_tenants), None)
        if stray is not None:
            raise ConfigError(f"--tenant {stray}", "not a tenant of the trace")
        return tuple(_trace_tenant(name, given, known) for name in trace_tenants)
    names = list(given) or list(known)
    if not names:
        raise ConfigError("--tenant", "no tenants: give --tenant, --tenants-file or --keys-from")
    tenants = []
    for name in names:
        fields = {**known.get(name, {}), **given.get(name, {})}
        if "rate" not in fields and "concurrency" not in fields:
            arrival = (
                {"rate": default_rate} if default_rate else {"concurrency": default_concurrency}
            )
            fields.update(arrival)
        tenants.append(TenantSpec(name, **fields))
    return tuple(tenants)


def _trace_tenant(name: str, given: dict[str, Fields], known: dict[str, Fields]) -> TenantSpec:
    fields = {**known.get(name, {}), **given.get(name, {})}
    for arrival in ("rate", "concurrency"):
        if arrival in fields:
            raise ConfigError(f"--tenant {name}", f"{arrival}: the trace gives the arrivals")
    return TenantSpec(name, **fields)
