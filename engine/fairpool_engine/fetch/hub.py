"""Fetching `hf://` sources with `huggingface_hub` into its own cache layout under
`<cache>/hub`, and linking the snapshot of the requested revision as the model directory."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from fairpool.api.model_source import ModelUri
from fairpool_engine.fetch import FetchError, model_directory


def fetch_from_hub(uri: ModelUri, cache: Path, credentials: Mapping[str, str] | None) -> Path:
    """The snapshot of `uri` at its revision, downloaded once: files the cache holds for
    the revision's commit are not downloaded again, and a cached snapshot is used as it is
    when the Hub cannot be reached."""
    from huggingface_hub import snapshot_download

    token = (credentials or {}).get("HF_TOKEN") or None
    try:
        snapshot = snapshot_download(
            uri.location,
            revision=uri.revision,
            cache_dir=cache / "hub",
            token=token,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )
    except Exception as error:
        raise hub_error(uri, error, token is not None) from error
    return link(model_directory(cache, uri), Path(snapshot))


def hub_error(uri: ModelUri, error: Exception, had_token: bool) -> Exception:
    """`error` of huggingface_hub as a FetchError naming its cause (others unchanged)."""
    from huggingface_hub import errors

    revision = uri.revision or "main"
    if isinstance(error, errors.GatedRepoError):
        if had_token:
            advice = "accept its conditions on the Hub with the account the token belongs to"
        else:
            advice = "give a token (HF_TOKEN in the Secret of model.secretRef)"
        return FetchError("GatedModel", f"{uri.location} is gated: {advice}")
    if isinstance(error, errors.RevisionNotFoundError):
        return FetchError("RevisionNotFound", f"{uri.location} has no revision {revision!r}")
    if isinstance(error, errors.RepositoryNotFoundError):
        private = "" if had_token else " (if it is private, give a token in model.secretRef)"
        return FetchError("ModelNotFound", f"no model {uri.location} on the Hub{private}")
    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, errors.HfHubHTTPError) and status in (401, 403):
        return FetchError("Unauthorized", f"the Hub refused the token for {uri.location}")
    if isinstance(error, errors.LocalEntryNotFoundError):
        return FetchError(
            "SourceUnreachable", f"the Hub cannot be reached and {uri} is not in the cache"
        )
    if isinstance(error, OSError):
        return error
    return FetchError("FetchFailed", f"{uri}: {type(error).__name__}: {error}")


def link(directory: Path, target: Path) -> Path:
    """Points `directory` at `target` (relative, so the cache can be mounted anywhere),
    replacing an older link at once: an engine never sees a half-made one."""
    relative = os.path.relpath(target, directory.parent)
    # unique across pods sharing the cache (their processes may have the same PID)
    staging = directory.with_name(f".{directory.name}.{uuid.uuid4().hex}")
    staging.symlink_to(relative, target_is_directory=True)
    os.replace(staging, directory)
    return directory
