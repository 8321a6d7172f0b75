"""Fetching `s3://` and `gs://` sources: the objects under a prefix, copied into the model
directory with the prefix taken off. One copy routine serves both stores; each store
only lists and downloads one object (`Store`).

Already-fetched files are kept when the store reports the same size and ETag for them
(recorded in `.fairpool-objects.json` next to the files); files the store no longer
holds are removed. Concurrent fetches of one source wait on a lock file in the cache.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from filelock import FileLock

from fairpool.api.model_source import ModelUri
from fairpool_engine.fetch import FetchError, model_directory

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
    def download(self, key: str, target: Path) -> None: ...
    def failure(self, error: Exception) -> Exception:
        """`error` of the store's library as a FetchError naming its cause."""
        ...


def fetch_from_bucket(uri: ModelUri, cache: Path, credentials: Mapping[str, str] | None) -> Path:
    directory = model_directory(cache, uri)
    with FileLock(str(directory) + ".lock"):
        store: Store | None = None
        try:
            store = S3Store(uri, credentials) if uri.scheme == "s3" else GcsStore(uri, credentials)
            objects = store.objects()
            if not objects:
                raise FetchError("ModelNotFound", f"no objects under {uri}")
            copy_objects(objects, store.download, directory)
        except (FetchError, OSError):
            raise
        except Exception as error:
            if store is None:
                raise FetchError("CredentialsMissing", f"{uri}: {error}") from error
            raise store.failure(error) from error
    return directory


def copy_objects(
    objects: list[StoredObject], download: Callable[[str, Path], None], directory: Path
) -> None:
    """Makes `directory` hold exactly `objects`, downloading those it does not hold yet."""
    directory.mkdir(parents=True, exist_ok=True)
    record_path = directory / RECORD
    try:
        held = json.loads(record_path.read_text())
    except (OSError, ValueError):
        held = {}
    record: dict[str, list[object]] = {}
    for item in objects:
        target = directory / _safe_relative(item.key)
        same = held.get(item.key) == [item.size, item.etag]
        if not (same and target.is_file() and target.stat().st_size == item.size):
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            download(item.key, partial)
            os.replace(partial, target)
        record[item.key] = [item.size, item.etag]
        record_path.write_text(json.dumps(record))  # progress survives an interruption
    wanted = {directory / _safe_relative(item.key) for item in objects}
    for path in sorted(directory.rglob("*"), reverse=True):
        if path.is_file() and path != record_path and path not in wanted:
            path.unlink()


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

    def download(self, key: str, target: Path) -> None:
        self.client.download_file(self.uri.location, self.prefix + key, str(target))

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

    def download(self, key: str, target: Path) -> None:
        self.blobs[key].download_to_filename(str(target))

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
