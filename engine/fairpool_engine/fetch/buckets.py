"""Fetching `s3://` and `gs://` sources: the objects under a prefix, copied into the model
directory with the prefix taken off. One copy routine serves both stores; each store
only lists and downloads one object (`Store`).

Already-fetched files are kept when the store reports the same size and ETag for them
(recorded in `.fairpool-objects.json` next to the files); files the store no longer
holds are removed. Concurrent fetches of one source wait on a lock file in the cache.
Fetching makes no link, so every link met in the model directory (or in its place, or in
the lock's) is someone else's: it is refused and named, never followed (`confined`).
"""

from __future__ import annotations

import json
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Protocol

from fairpool.api.model_source import ModelUri
from fairpool_engine.fetch import FetchError, model_directory
from fairpool_engine.fetch.confined import CacheDirectory

#: What the model directory records of the objects it holds.
RECORD = ".fairpool-objects.json"


@dataclass(frozen=True)
class StoredObject:
    key: str  # relative to the prefix
    size: int
    etag: str


class Store(Protocol):
    """One object store, for one source."""

    def objects(self) -> list[StoredObject]: ...
    def download(self, key: str, file: BinaryIO) -> None:
        """Writes the object `key` into `file` (opened by the caller, inside the cache)."""
        ...

    def failure(self, error: Exception) -> Exception:
        """`error` of the store's library as a FetchError naming its cause."""
        ...


def fetch_from_bucket(uri: ModelUri, cache: Path, credentials: Mapping[str, str] | None) -> Path:
    directory = model_directory(cache, uri)
    with CacheDirectory.root(cache) as root, root.locked(directory.name + ".lock"):
        store: Store | None = None
        try:
            store = S3Store(uri, credentials) if uri.scheme == "s3" else GcsStore(uri, credentials)
            objects = store.objects()
            if not objects:
                raise FetchError("ModelNotFound", f"no objects under {uri}")
            with root.subdirectory(PurePosixPath(directory.name)) as held:
                copy_objects(objects, store, held)
        except (FetchError, OSError):
            raise
        except Exception as error:
            if store is None:
                raise FetchError("CredentialsMissing", f"{uri}: {error}") from error
            raise store.failure(error) from error
    return directory


def copy_objects(objects: list[StoredObject], store: Store, directory: CacheDirectory) -> None:
    """Makes `directory` hold exactly `objects`, downloading those it does not hold yet."""
    held = _read_record(directory)
    record: dict[str, list[object]] = {}
    for item in objects:
        relative = _safe_relative(item.key)
        with directory.subdirectory(relative.parent) as parent:
            if not _kept(parent, relative.name, item, held.get(item.key)):
                parent.write(relative.name, partial(store.download, item.key))
        record[item.key] = [item.size, item.etag]
        directory.write(RECORD, partial(_write_json, record))  # progress survives a stop
    _sweep(directory, {_safe_relative(item.key) for item in objects} | {PurePosixPath(RECORD)})


def _write_json(value: object, file: BinaryIO) -> None:
    file.write(json.dumps(value).encode())


def _read_record(directory: CacheDirectory) -> dict[str, Any]:
    """What the last fetch recorded of the objects it copied (nothing when unreadable)."""
    try:
        held = json.loads(directory.read(RECORD) or b"{}")
    except ValueError:
        return {}
    return held if isinstance(held, dict) else {}


def _kept(parent: CacheDirectory, name: str, item: StoredObject, recorded: object) -> bool:
    """Whether `name` is `item` already: recorded with its size and ETag, and a regular
    file of that size."""
    status = parent.entry(name)
    return (
        recorded == [item.size, item.etag]
        and status is not None
        and stat.S_ISREG(status.st_mode)
        and status.st_size == item.size
    )


def _sweep(directory: CacheDirectory, wanted: set[PurePosixPath], here: str = "") -> None:
    """Removes what `directory` holds (at any depth) that is not `wanted`. Directories are
    entered through their descriptors and every unlink is relative to one, so nothing
    outside the model directory can be removed, whatever is swapped in meanwhile."""
    for name, is_directory in directory.names():
        if is_directory:
            with directory.subdirectory(PurePosixPath(name), create=False) as below:
                _sweep(below, wanted, f"{here}{name}/")
        elif PurePosixPath(here + name) not in wanted:
            directory.remove(name)


def _safe_relative(key: str) -> PurePosixPath:
    parts = [part for part in key.split("/") if part]
    if not parts or any(part in (".", "..") for part in parts):
        raise FetchError("FetchFailed", f"object key {key!r} is not a relative file path")
    return PurePosixPath(*parts)


class S3Store:
    """AWS S3 or an S3-compatible store (AWS_ENDPOINT_URL), through boto3."""

    def __init__(self, uri: ModelUri, credentials: Mapping[str, str] | None) -> None:
        import boto3

        keys = credentials or {}
        self.uri = uri
        self.prefix = f"{uri.path}/" if uri.path else ""
        self.client = boto3.client(
            "s3",
            aws_access_key_id=keys.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=keys.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=keys.get("AWS_SESSION_TOKEN"),
            region_name=keys.get("AWS_REGION") or keys.get("AWS_DEFAULT_REGION"),
            endpoint_url=keys.get("AWS_ENDPOINT_URL"),
        )

    def objects(self) -> list[StoredObject]:
        found = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.uri.location, Prefix=self.prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                if not item["Key"].endswith("/"):
                    key = item["Key"][len(self.prefix) :]
                    found.append(StoredObject(key, int(item["Size"]), str(item["ETag"])))
        return found

    def download(self, key: str, file: BinaryIO) -> None:
        self.client.download_fileobj(self.uri.location, self.prefix + key, file)

    def failure(self, error: Exception) -> Exception:
        from botocore.exceptions import ClientError, NoCredentialsError

        if isinstance(error, NoCredentialsError):
            return FetchError("CredentialsMissing", f"{self.uri}: no AWS credentials")
        if isinstance(error, ClientError):
            code = str(error.response.get("Error", {}).get("Code", ""))
            return store_error(self.uri, code, str(error))
        return FetchError("SourceUnreachable", f"{self.uri}: {error}")


class GcsStore:
    """Google Cloud Storage, through google-cloud-storage."""

    def __init__(self, uri: ModelUri, credentials: Mapping[str, str] | None) -> None:
        from google.cloud import storage

        self.uri = uri
        self.prefix = f"{uri.path}/" if uri.path else ""
        if credentials and "service-account.json" in credentials:
            info = json.loads(credentials["service-account.json"])
            self.client = storage.Client.from_service_account_info(info)
        else:
            self.client = storage.Client()
        self.blobs: dict[str, Any] = {}

    def objects(self) -> list[StoredObject]:
        for blob in self.client.list_blobs(self.uri.location, prefix=self.prefix):
            if not blob.name.endswith("/"):
                self.blobs[blob.name[len(self.prefix) :]] = blob
        return [
            StoredObject(key, int(blob.size or 0), str(blob.etag))
            for key, blob in self.blobs.items()
        ]

    def download(self, key: str, file: BinaryIO) -> None:
        self.blobs[key].download_to_file(file)

    def failure(self, error: Exception) -> Exception:
        from google.api_core import exceptions

        if isinstance(error, exceptions.NotFound):
            return store_error(self.uri, "NoSuchBucket", str(error))
        if isinstance(error, (exceptions.Forbidden, exceptions.Unauthorized)):
            return store_error(self.uri, "AccessDenied", str(error))
        return FetchError("SourceUnreachable", f"{self.uri}: {error}")


def store_error(uri: ModelUri, code: str, detail: str) -> FetchError:
    """A store's error code (S3's names) as a FetchError."""
    if code in ("NoSuchBucket", "NoSuchKey", "404"):
        return FetchError("ModelNotFound", f"no bucket {uri.location} ({uri})")
    if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "401"):
        return FetchError("Unauthorized", f"{uri}: the store refused the credentials ({code})")
    return FetchError("FetchFailed", f"{uri}: {detail}")
