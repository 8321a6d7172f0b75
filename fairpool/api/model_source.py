"""Where a pool's weights come from: `spec.model.source` as a URI, the convention KubeAI and
KServe users know.

- `hf://org/model[@revision]`: a Hugging Face repository at a branch, tag or commit
  (default `main`); a gated or private one needs `HF_TOKEN` in the Secret `model.secretRef`.
- `pvc://claim[/path]`: a directory in a PersistentVolumeClaim, mounted read-only.
- `s3://bucket[/prefix]`: the objects under a prefix, in AWS S3 or an S3-compatible store;
  the Secret holds `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, and may hold
  `AWS_SESSION_TOKEN`, `AWS_REGION` and `AWS_ENDPOINT_URL`.
- `gs://bucket[/prefix]`: the objects under a prefix in Google Cloud Storage; the Secret
  holds `service-account.json` (without one: the pod's workload identity).
- `/path` or `file:///path`: a directory on this machine (`fairpool up` only).

hf, s3 and gs sources are fetched into a cache before the engine starts
(`fairpool fetch-model`); pvc and local sources are loaded where they are.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

#: Schemes whose weights are downloaded into a cache before the engine starts.
FETCHED = ("hf", "s3", "gs")
#: Keys a credentials Secret must hold, per scheme.
CREDENTIAL_KEYS: dict[str, tuple[str, ...]] = {
    "hf": ("HF_TOKEN",),
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    "gs": ("service-account.json",),
}
#: Keys a credentials Secret may hold besides the required ones.
OPTIONAL_CREDENTIAL_KEYS: dict[str, tuple[str, ...]] = {
    "s3": ("AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"),
}
#: Why a fetch failed: the first word of `fairpool fetch-model`'s termination message,
#: which the operator reports as the reason of the pool's ModelReady condition.
FETCH_REASONS = (
    "GatedModel",
    "ModelNotFound",
    "RevisionNotFound",
    "Unauthorized",
    "CredentialsMissing",
    "SourceUnreachable",
    "CacheFull",
    "FetchFailed",
)
EXAMPLES = "hf://org/model[@revision], pvc://claim/path, s3://bucket/prefix, gs://bucket/prefix"

_HF_REPO = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,95}/)?[A-Za-z0-9][-A-Za-z0-9_.]{0,95}$")
_HF_REVISION = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]{0,254}$")
_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_BUCKETS = {
    "s3": re.compile(r"^[a-z0-9][-a-z0-9.]{1,61}[a-z0-9]$"),
    "gs": re.compile(r"^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$"),
}
_PRINTABLE = re.compile(r"^[^\x00-\x20\x7f]+$")


@dataclass(frozen=True)
class ModelUri:
    """A parsed `model.source`. `location` is the repository (hf), the claim (pvc), the
    bucket (s3, gs) or the directory (file); `path` the directory inside a claim or the
    prefix inside a bucket, without slashes at either end."""

    scheme: str
    location: str
    path: str = ""
    revision: str | None = None

    def __str__(self) -> str:
        if self.scheme == "file":
            return self.location
        text = f"{self.scheme}://{self.location}"
        if self.path:
            text += f"/{self.path}"
        if self.revision is not None:
            text += f"@{self.revision}"
        return text

    @property
    def fetched(self) -> bool:
        """Whether the weights are downloaded into a cache before the engine starts."""
        return self.scheme in FETCHED

    @property
    def cache_name(self) -> str:
        """The directory of the cache that holds this source's weights: readable, and
        unique per source (a digest of the whole URI ends it)."""
        readable = re.sub(r"[^A-Za-z0-9_.-]+", "--", f"{self.scheme}--{self.location}")
        if self.path:
            readable += "--" + re.sub(r"[^A-Za-z0-9_.-]+", "--", self.path)
        digest = hashlib.sha256(str(self).encode()).hexdigest()[:12]
        return f"{readable[:80]}-{digest}"


def parse_model_uri(text: str) -> ModelUri:
    """`text` as a model source; ValueError saying what is wrong and what is expected."""
    if len(text) > 1024 or not _PRINTABLE.match(text):
        raise ValueError(f"{text[:80]!r} is not a model source (e.g. {EXAMPLES})")
    if text.startswith("/"):
        return _local(text)
    scheme, separator, rest = text.partition("://")
    if not separator:
        raise ValueError(f"{text!r} is not a model source: give a URI ({EXAMPLES})")
    if scheme == "file":
        return _local(rest)
    if scheme == "hf":
        return _hub(rest)
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if not _CLAIM.match(claim):
            raise ValueError(f"pvc://{claim}: {claim!r} is not a PersistentVolumeClaim name")
        return ModelUri("pvc", claim, _inner_path(path, text))
    if scheme in _BUCKETS:
        bucket, _, prefix = rest.partition("/")
        if not _BUCKETS[scheme].match(bucket):
            raise ValueError(f"{scheme}://{bucket}: {bucket!r} is not a bucket name")
        return ModelUri(scheme, bucket, _inner_path(prefix, text))
    raise ValueError(f"{text!r}: unknown scheme {scheme!r}; known: hf, pvc, s3, gs, file")


def _hub(rest: str) -> ModelUri:
    repository, at, revision = rest.partition("@")
    if not _HF_REPO.match(repository) or ".." in repository:
        raise ValueError(f"hf://{rest}: {repository!r} is not a repository id (org/model)")
    if at and (not _HF_REVISION.match(revision) or ".." in revision):
        raise ValueError(f"hf://{rest}: {revision!r} is not a branch, tag or commit")
    return ModelUri("hf", repository, revision=revision if at else None)


def _local(path: str) -> ModelUri:
    if not path.startswith("/"):
        raise ValueError(f"{path!r}: a local model source is an absolute path")
    return ModelUri("file", "/" + _inner_path(path, path))


def _inner_path(path: str, text: str) -> str:
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise ValueError(f"{text!r}: the path may not contain . or .. segments")
    return "/".join(parts)
