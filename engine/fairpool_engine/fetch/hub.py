"""Fetching `hf://` sources with `huggingface_hub` into its own cache layout under
`<cache>/hub`, and linking the snapshot of the requested revision as the model directory.

That layout is made of links: a snapshot's files link to their repository's blobs, and
(with Xet's cache-wide store) a blob may link to `hub/blobs/`. All are relative and end at
a file inside `hub/`. huggingface_hub opens its files by path, following links, so before it
runs (and again before the engine is pointed at the snapshot) every link under `hub/` is
checked to be one of that kind (`check_hub`); any other — out of the cache, to a
directory — is someone else's, and the fetch fails naming it.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from fairpool.api.model_source import ModelUri
from fairpool_engine.fetch import FetchError, model_directory
from fairpool_engine.fetch.confined import planted


def fetch_from_hub(uri: ModelUri, cache: Path, credentials: Mapping[str, str] | None) -> Path:
    """The snapshot of `uri` at its revision, downloaded once: files the cache holds for
    the revision's commit are not downloaded again, and a cached snapshot is used as it is
    when the Hub cannot be reached."""
    from huggingface_hub import snapshot_download

    token = (credentials or {}).get("HF_TOKEN") or None
    hub = Path(os.path.abspath(cache)) / "hub"
    check_hub(hub)
    try:
        snapshot = snapshot_download(
            uri.location,
            revision=uri.revision,
            cache_dir=hub,
            token=token,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )
    except Exception as error:
        raise hub_error(uri, error, token is not None) from error
    check_hub(hub)
    return link(model_directory(cache, uri), Path(snapshot))


def check_hub(hub: Path) -> None:
    """Refuses (naming it) a link under `hub` that huggingface_hub would not have made:
    `hub` itself a link, a link out of `hub`, or a link to a directory. Each link is judged
    by its own target, one step: as every link on a chain is judged, a chain that starts
    inside stays inside; and as no directory inside is a link, `..` in a target means what
    it says."""
    if os.path.islink(hub):
        raise planted(hub)
    for found in links_below(hub):
        try:
            target = Path(os.path.normpath(found.parent / os.readlink(found)))
        except FileNotFoundError:
            continue  # gone meanwhile (another pod's fetch tidying up)
        if not target.is_relative_to(hub):
            raise planted(found, f" to {target} (outside the cache's hub/)")
        if _is_directory(target):
            raise planted(found, f" to {target} (a directory)")


def _is_directory(path: Path) -> bool:
    """Whether `path` is a real directory (not a link to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def links_below(directory: Path) -> Iterator[Path]:
    """Every symbolic link below `directory`, found without following one (an entry that
    goes while it is looked at is passed over: huggingface_hub renames and removes its
    temporary files)."""
    try:
        with os.scandir(directory) as listing:
            entries = list(listing)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        path = Path(entry.path)
        if entry.is_symlink():
            yield path
        elif entry.is_dir(follow_symlinks=False):
            yield from links_below(path)


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
