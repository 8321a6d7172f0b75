"""`fairpool fetch-model`: a pool's weights from the Hugging Face Hub, S3 or Google Cloud
Storage into a cache directory, before the engine starts (the engine pod's init container,
and `fairpool up`).

The weights of a source land in `<cache>/<ModelUri.cache_name>`, the directory the engine
is told to load. Fetching is idempotent and safe to run from several pods on one shared
cache at once: files already there are not downloaded again, and concurrent fetches of
the same source wait for each other (file locks in the cache). As others may write the
cache too, a symbolic link met in it is never followed out of it (`confined`, and
`hub.check_hub` for the Hub's own layout of links): the fetch fails naming it. A failure
is a `FetchError` whose `reason` names the cause (`GatedModel`, `RevisionNotFound`, ...):
the init container writes it as its termination message, where the operator reads it into
the pool's status.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path

from fairpool.api.model_source import FETCH_REASONS, ModelUri


class FetchError(Exception):
    """A fetch that failed, with its cause (one of `FETCH_REASONS`) and what to do."""

    def __init__(self, reason: str, message: str) -> None:
        assert reason in FETCH_REASONS, reason
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def model_directory(cache: Path, uri: ModelUri) -> Path:
    """Where the weights of `uri` are (or will be) in `cache`."""
    return cache / uri.cache_name


def local_model_cache() -> Path:
    """Where `fairpool up` fetches models to: $FAIRPOOL_MODEL_CACHE, else
    ~/.cache/fairpool/models."""
    given = os.environ.get("FAIRPOOL_MODEL_CACHE")
    return Path(given) if given else Path.home() / ".cache" / "fairpool" / "models"


def fetch(uri: ModelUri, cache: Path, credentials: Mapping[str, str] | None = None) -> Path:
    """Brings the weights of `uri` into `cache` and returns their directory. `credentials`
    are the keys of the source's Secret (`fairpool.api.model_source.CREDENTIAL_KEYS`);
    without them each store's own defaults apply (HF_TOKEN, the AWS variables, the
    Google application default credentials)."""
    if not uri.fetched:
        raise ValueError(f"{uri} is not fetched: it is loaded where it is")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        if uri.scheme == "hf":
            from fairpool_engine.fetch.hub import fetch_from_hub

            return fetch_from_hub(uri, cache, credentials)
        from fairpool_engine.fetch.buckets import fetch_from_bucket

        return fetch_from_bucket(uri, cache, credentials)
    except OSError as error:  # the cache's disk, or a connection the library let through
        if error.errno == errno.ENOSPC:
            raise FetchError(
                "CacheFull", f"the cache is full fetching {uri}: raise model.cache.size"
            ) from error
        raise FetchError("FetchFailed", f"{uri}: {error}") from error


def read_credentials(directory: Path) -> dict[str, str]:
    """A mounted Secret's keys and values (its files; the kubelet's dot-entries left out)."""
    if not directory.is_dir():
        raise FetchError("CredentialsMissing", f"no credentials at {directory}")
    return {
        entry.name: entry.read_text().strip()
        for entry in sorted(directory.iterdir())
        if not entry.name.startswith(".") and entry.is_file()
    }
