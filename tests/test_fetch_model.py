"""`fairpool fetch-model` against stores on loopback: a Hugging Face Hub speaking the Hub's
protocol to the real `huggingface_hub` client (tests/fake_hub.py), moto's S3 server and
the Cloud Storage emulator, through their real client libraries."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import boto3
import pytest
from fake_hub import Hub, HubServer, Repository
from hypothesis import given
from hypothesis import strategies as st

from fairpool.api.inference_pool import InferencePool
from fairpool.api.model_source import FETCH_REASONS, ModelUri, parse_model_uri
from fairpool.api.stored import stored
from fairpool_engine.fetch import FetchError, fetch, model_directory, read_credentials
from fairpool_engine.fetch.buckets import RECORD, StoredObject, copy_objects
from fairpool_engine.fetch.confined import CacheDirectory
from fairpool_operator import contract
from fairpool_operator.config import OperatorConfig
from fairpool_operator.model_status import parse_termination_message
from fairpool_operator.render import engine_deployment

pytestmark = pytest.mark.subprocess  # and stores on loopback

GATED_POOL = stored(
    {
        "apiVersion": "fairpool.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "llama"},
        "spec": {
            "model": {
                "name": "llama-8b",
                "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
                "secretRef": {"name": "hf-token"},
            }
        },
    }
)
CONFIG = OperatorConfig(namespace="serving", engine_sim_image="sim:1", engine_image="vllm:1")
WEIGHTS = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"w" * 4096}


@pytest.fixture
def hub(monkeypatch) -> Iterator[Hub]:
    served = Hub(
        {
            "org/open": Repository(dict(WEIGHTS)),
            "org/gated": Repository(dict(WEIGHTS), gated=True),
            "org/private": Repository(dict(WEIGHTS), private=True),
        },
        tokens={"hf_member": {"org/gated", "org/private"}, "hf_stranger": set()},
    )
    with HubServer(served) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        yield served


def test_a_model_is_downloaded_once_and_loaded_from_the_cache(hub, tmp_path):
    uri = parse_model_uri("hf://org/open")
    directory = fetch(uri, tmp_path)
    assert directory == model_directory(tmp_path, uri)
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == WEIGHTS
    assert sum(hub.downloads.values()) == len(WEIGHTS)
    again = fetch(uri, tmp_path)  # a restart, or another replica on the shared cache
    assert again == directory and sum(hub.downloads.values()) == len(WEIGHTS)


def test_a_branch_that_moves_is_followed_and_a_pinned_commit_is_not(hub, tmp_path):
    repository = hub.repositories["org/open"]
    first = repository.branches["main"]
    fetch(parse_model_uri("hf://org/open@main"), tmp_path)
    repository.files["config.json"] = b'{"model_type": "llama", "v": 2}'
    repository.branches = {"main": "f" * 40, "v1": first}
    moved = fetch(parse_model_uri("hf://org/open@main"), tmp_path)
    assert (moved / "config.json").read_bytes().endswith(b"2}")
    # the new commit's changed file only: an unchanged blob is kept
    assert hub.downloads == {("org/open", "config.json"): 2, ("org/open", "model.safetensors"): 1}
    pinned = fetch(parse_model_uri(f"hf://org/open@{first}"), tmp_path)
    assert (pinned / "config.json").read_bytes() == WEIGHTS["config.json"]
    assert sum(hub.downloads.values()) == 3  # a cached commit is not asked for again


@pytest.mark.parametrize(
    ("source", "token", "reason", "says"),
    [
        ("hf://org/gated", None, "GatedModel", "give a token"),
        ("hf://org/gated", "hf_stranger", "GatedModel", "accept its conditions"),
        ("hf://org/gated", "hf_forged", "Unauthorized", "refused the token"),
        ("hf://org/open@v9", None, "RevisionNotFound", "no revision 'v9'"),
        ("hf://org/missing", None, "ModelNotFound", "no model org/missing"),
        ("hf://org/private", None, "ModelNotFound", "if it is private, give a token"),
    ],
)
def test_a_failed_fetch_names_its_cause(hub, tmp_path, source, token, reason, says):
    credentials = {"HF_TOKEN": token} if token else None
    with pytest.raises(FetchError) as raised:
        fetch(parse_model_uri(source), tmp_path, credentials)
    assert raised.value.reason == reason and says in raised.value.message
    assert not model_directory(tmp_path, parse_model_uri(source)).exists()


def test_a_gated_or_private_model_comes_with_a_token_that_may_read_it(hub, tmp_path):
    for source in ("hf://org/gated", "hf://org/private"):
        directory = fetch(parse_model_uri(source), tmp_path, {"HF_TOKEN": "hf_member"})
        assert (directory / "model.safetensors").read_bytes() == WEIGHTS["model.safetensors"]


def test_the_cache_serves_when_the_hub_is_gone_and_says_so_when_it_cannot(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with HubServer(Hub({"org/open": Repository(dict(WEIGHTS))})) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        directory = fetch(parse_model_uri("hf://org/open"), tmp_path)
    assert fetch(parse_model_uri("hf://org/open"), tmp_path) == directory  # server closed
    with pytest.raises(FetchError) as raised:
        fetch(parse_model_uri("hf://org/other"), tmp_path)
    assert raised.value.reason == "SourceUnreachable"


def test_the_command_reads_a_mounted_secret_and_leaves_its_cause_for_the_operator(hub, tmp_path):
    secret = tmp_path / "secret"
    (secret / "..2026_11_28").mkdir(parents=True)  # the kubelet's own entries are skipped
    (secret / "HF_TOKEN").write_text("hf_stranger\n")
    assert read_credentials(secret) == {"HF_TOKEN": "hf_stranger"}
    log = tmp_path / "termination-log"
    command = [sys.executable, "-m", "fairpool_cli", "fetch-model", "hf://org/gated"]
    command += ["--cache", str(tmp_path / "cache"), "--credentials", str(secret)]
    command += ["--termination-log", str(log)]
    failed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "GatedModel" in failed.stderr
    reason, message = parse_termination_message(log.read_text())
    assert reason == "GatedModel" and "accept its conditions" in message

    (secret / "HF_TOKEN").write_text("hf_member")
    log.unlink()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    uri = parse_model_uri("hf://org/gated")
    assert done.stdout.strip() == str(model_directory(tmp_path / "cache", uri))
    assert not log.exists()


def test_replicas_fetching_at_once_into_one_cache_download_each_file_once(hub, tmp_path):
    hub.repositories["org/open"].files["model.safetensors"] = os.urandom(8 << 20)
    command = [sys.executable, "-m", "fairpool_cli", "fetch-model", "hf://org/open"]
    command += ["--cache", str(tmp_path)]
    replicas = [subprocess.Popen(command, stdout=subprocess.PIPE) for _ in range(3)]
    outputs = [replica.communicate(timeout=180)[0] for replica in replicas]
    assert [replica.returncode for replica in replicas] == [0, 0, 0]
    assert len(set(outputs)) == 1
    assert hub.downloads["org/open", "model.safetensors"] == 1


def test_the_rendered_fetch_step_fills_the_directory_the_engine_is_told_to_load(
    tmp_path, monkeypatch
):
    """The init container's own command line, run here against a Hub on loopback, leaves
    the weights exactly where the engine container's --model points."""
    deployment = engine_deployment(InferencePool.model_validate(GATED_POOL), CONFIG)
    spec = deployment["spec"]["template"]["spec"]
    fetcher, engine = spec["initContainers"][0], spec["containers"][0]
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "HF_TOKEN").write_text("hf_member")
    here = {contract.MODEL_CACHE_DIR: str(tmp_path / "cache"), "/dev/termination-log": "-"}
    here[contract.MODEL_CREDENTIALS_DIR] = str(secret)
    arguments = [here.get(argument, argument) for argument in fetcher["args"]]
    arguments = arguments[: arguments.index("--termination-log")]
    files = {"config.json": b"{}", "model.safetensors": b"w" * 64}
    repository = Repository(files, gated=True)
    repo_id = "meta-llama/Llama-3.1-8B-Instruct"
    hub = Hub({repo_id: repository}, {"hf_member": {repo_id}})
    with HubServer(hub) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        command = [sys.executable, "-m", "fairpool_cli", *arguments]
        subprocess.run(command, check=True, capture_output=True, timeout=120)
    loaded = engine["args"][engine["args"].index("--model") + 1]
    on_disk = Path(loaded.replace(contract.MODEL_CACHE_DIR, str(tmp_path / "cache")))
    assert {path.name for path in on_disk.iterdir()} == set(files)


def test_a_cache_that_cannot_be_written_is_a_named_failure_not_a_traceback(tmp_path):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    with pytest.raises(FetchError) as raised:
        fetch(parse_model_uri("s3://models/m"), blocked / "cache")
    assert raised.value.reason == "FetchFailed" and "s3://models/m" in raised.value.message


@given(st.text(max_size=200))
def test_any_termination_message_gives_a_known_reason(text):
    reason, message = parse_termination_message(text)
    assert reason in FETCH_REASONS and message


# --- S3 and Cloud Storage -----------------------------------------------------------------------


@pytest.fixture
def s3() -> Iterator[tuple[dict[str, str], object]]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    credentials = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    client = boto3.client(
        "s3",
        endpoint_url=credentials["AWS_ENDPOINT_URL"],
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket="models")
    try:
        yield credentials, client
    finally:
        server.stop()


def test_objects_under_an_s3_prefix_become_the_model_directory(s3, tmp_path):
    credentials, client = s3
    client.put_object(Bucket="models", Key="llama/config.json", Body=WEIGHTS["config.json"])
    client.put_object(Bucket="models", Key="llama/shards/1.safetensors", Body=b"a" * 100)
    client.put_object(Bucket="models", Key="llama-other/config.json", Body=b"{}")
    uri = parse_model_uri("s3://models/llama")
    directory = fetch(uri, tmp_path, credentials)
    files = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}
    assert files == {"config.json", "shards/1.safetensors", ".fairpool-objects.json"}
    kept = (directory / "shards" / "1.safetensors").stat()

    client.put_object(Bucket="models", Key="llama/config.json", Body=b'{"v": 2}')
    client.delete_object(Bucket="models", Key="llama/shards/1.safetensors")
    client.put_object(Bucket="models", Key="llama/shards/2.safetensors", Body=b"b" * 100)
    fetch(uri, tmp_path, credentials)
    assert (directory / "config.json").read_bytes() == b'{"v": 2}'
    assert not (directory / "shards" / "1.safetensors").exists()
    assert (directory / "shards" / "2.safetensors").read_bytes() == b"b" * 100
    del kept

    client.put_object(Bucket="models", Key="llama/shards/3.safetensors", Body=b"c")
    before = (directory / "shards" / "2.safetensors").stat().st_mtime_ns
    fetch(uri, tmp_path, credentials)
    assert (directory / "shards" / "2.safetensors").stat().st_mtime_ns == before  # not again


@pytest.mark.parametrize(
    ("source", "reason"),
    [("s3://absent/m", "ModelNotFound"), ("s3://models/none", "ModelNotFound")],
)
def test_an_s3_source_that_is_not_there_says_so(s3, tmp_path, source, reason):
    credentials, _ = s3
    with pytest.raises(FetchError) as raised:
        fetch(parse_model_uri(source), tmp_path, credentials)
    assert raised.value.reason == reason


def test_an_unreachable_s3_endpoint_is_reported_as_such(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    credentials = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    credentials |= {"AWS_ENDPOINT_URL": closed, "AWS_REGION": "us-east-1"}
    with pytest.raises(FetchError) as raised:
        fetch(parse_model_uri("s3://models/m"), tmp_path, credentials)
    assert raised.value.reason == "SourceUnreachable"


def test_objects_under_a_cloud_storage_prefix_become_the_model_directory(tmp_path, monkeypatch):
    from gcp_storage_emulator.server import create_server
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        client = storage.Client(project="test", credentials=AnonymousCredentials())
        bucket = client.create_bucket("weights")
        bucket.blob("llama/config.json").upload_from_string(WEIGHTS["config.json"])
        bucket.blob("llama/model.safetensors").upload_from_string(b"g" * 300)
        directory = fetch(parse_model_uri("gs://weights/llama"), tmp_path)
        assert (directory / "model.safetensors").read_bytes() == b"g" * 300
        with pytest.raises(FetchError) as raised:
            fetch(parse_model_uri("gs://absent/llama"), tmp_path)
        assert raised.value.reason == "ModelNotFound"
    finally:
        server.stop()


# --- A cache that others write: links planted in it ---------------------------------------------
#
# A ReadWriteMany claim (and anything else mounted there) lets every pod write the cache, so
# fetch-model meets entries it did not make. A link among them must never carry a read, a
# write, a rename or a delete outside the cache: the fetch fails naming the link instead.


def contents(root: Path) -> dict[str, bytes | None]:
    """Every directory (None) and file (its bytes) at or below `root`."""
    found: dict[str, bytes | None] = {}
    for directory, _, files in os.walk(root):
        found[os.path.relpath(directory, root)] = None
        for name in files:
            path = Path(directory, name)
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


@pytest.fixture
def outside(tmp_path) -> Path:
    """A directory beside the cache, with what a planted link may lead to: a file as long
    as the model's config.json (so a link to it would pass for the file already fetched)."""
    place = tmp_path / "outside"
    (place / "keep").mkdir(parents=True)
    (place / "precious").write_bytes(b"x" * len(WEIGHTS["config.json"]))
    (place / "keep" / "notes").write_bytes(b"not the cache's")
    return place


def replace_with_link(path: Path, target: Path) -> Path:
    """`path` (a file, a directory or nothing) replaced by a link to `target`."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)
    return path


def refused(
    uri: ModelUri, cache: Path, outside: Path, credentials: dict[str, str] | None = None
) -> str:
    """The message of the fetch's failure, once it is checked that nothing outside the cache
    changed (what a fetch that follows the link writes or deletes there shows first)."""
    before = contents(outside)
    failure: FetchError | None = None
    try:
        fetch(uri, cache, credentials)
    except FetchError as error:
        failure = error
    assert contents(outside) == before
    assert failure is not None, "the planted link was not refused"
    assert failure.reason == "FetchFailed"
    return failure.message


def names_the_link(message: str, planted: Path) -> bool:
    return str(planted) in message and "symbolic link" in message


BUCKET_PLANTS = {
    "model directory to a directory": lambda model, outside: replace_with_link(model, outside),
    "subdirectory to a directory": lambda model, out: replace_with_link(model / "shards", out),
    "record to a file": lambda model, out: replace_with_link(model / RECORD, out / "precious"),
    "record dangling": lambda model, out: replace_with_link(model / RECORD, out / "new"),
    "weights to a file": lambda model, out: replace_with_link(
        model / "config.json", out / "precious"
    ),
    "partial download dangling": lambda model, out: replace_with_link(
        model / "shards" / "2.safetensors.partial", out / "new"
    ),
    "lock to a file": lambda model, out: replace_with_link(
        model.with_name(model.name + ".lock"), out / "precious"
    ),
}


@pytest.mark.parametrize("plant", BUCKET_PLANTS.values(), ids=BUCKET_PLANTS)
def test_a_link_planted_in_a_bucket_models_directory_is_refused_and_never_followed(
    s3, tmp_path, outside, plant
):
    credentials, client = s3
    client.put_object(Bucket="models", Key="llama/config.json", Body=WEIGHTS["config.json"])
    client.put_object(Bucket="models", Key="llama/shards/1.safetensors", Body=b"a" * 100)
    uri = parse_model_uri("s3://models/llama")
    cache = tmp_path / "cache"
    planted = plant(fetch(uri, cache, credentials), outside)
    # the next fetch writes a new file and sweeps a removed one
    client.put_object(Bucket="models", Key="llama/shards/2.safetensors", Body=b"b" * 100)
    client.delete_object(Bucket="models", Key="llama/shards/1.safetensors")
    assert names_the_link(refused(uri, cache, outside, credentials), planted)


def new_commit(hub: Hub) -> None:
    """The repository's main branch moves to a commit with a changed config.json, so that
    the next fetch downloads (and locks, and records the branch) again."""
    repository = hub.repositories["org/open"]
    repository.files["config.json"] = b'{"model_type": "llama", "v": 2}'
    repository.branches = {"main": "e" * 40}


def the_blob(model: Path) -> Path:
    return (model / "config.json").resolve()


HUB_PLANTS = {
    "hub directory to a directory": lambda cache, model, out: replace_with_link(
        cache / "hub", out / "keep"
    ),
    "snapshot file to a file": lambda cache, model, out: replace_with_link(
        model.resolve() / "config.json", out / "precious"
    ),
    "blob to a file": lambda cache, model, out: replace_with_link(
        the_blob(model), out / "precious"
    ),
    "ref to a file": lambda cache, model, out: replace_with_link(
        the_blob(model).parent.parent / "refs" / "main", out / "precious"
    ),
    "ref dangling": lambda cache, model, out: replace_with_link(
        the_blob(model).parent.parent / "refs" / "main", out / "new"
    ),
    "locks to a directory": lambda cache, model, out: replace_with_link(
        cache / "hub" / ".locks", out / "keep"
    ),
    "snapshot file to a directory inside": lambda cache, model, out: replace_with_link(
        model.resolve() / "config.json", cache / "hub"
    ),
}


@pytest.mark.parametrize("plant", HUB_PLANTS.values(), ids=HUB_PLANTS)
def test_a_link_planted_in_the_hub_layout_is_refused_and_never_followed(
    hub, tmp_path, outside, plant
):
    uri = parse_model_uri("hf://org/open")
    cache = tmp_path / "cache"
    planted = plant(cache, fetch(uri, cache), outside)
    new_commit(hub)
    assert names_the_link(refused(uri, cache, outside), planted)


def test_the_hub_layouts_own_links_are_followed_shared_blob_store_included(hub, tmp_path):
    """huggingface_hub links a snapshot's files to its repository's blobs, and (with Xet's
    cache-wide store) those blobs to `hub/blobs/`: relative links inside the cache, kept."""
    uri = parse_model_uri("hf://org/open")
    model = fetch(uri, tmp_path)
    blob = the_blob(model)
    shared = tmp_path / "hub" / "blobs" / "ab" / ("ab" + "0" * 62)
    shared.parent.mkdir(parents=True)
    blob.rename(shared)
    blob.symlink_to(os.path.relpath(shared, blob.parent))
    assert (model / "config.json").is_symlink()
    assert fetch(uri, tmp_path) == model
    assert (model / "config.json").read_bytes() == WEIGHTS["config.json"]


def test_a_planted_link_is_a_named_failure_of_the_command_not_a_traceback(hub, tmp_path, outside):
    cache = tmp_path / "cache"
    fetch(parse_model_uri("hf://org/open"), cache)
    replace_with_link(cache / "hub", outside / "keep")
    log = tmp_path / "termination-log"
    command = [sys.executable, "-m", "fairpool_cli", "fetch-model", "hf://org/open"]
    command += ["--cache", str(cache), "--termination-log", str(log)]
    failed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    reason, message = parse_termination_message(log.read_text())
    assert reason == "FetchFailed" and str(cache / "hub") in message
    assert contents(outside / "keep") == {".": None, "notes": b"not the cache's"}


class SwappingStore:
    """A store whose download, once started, moves the file's directory aside and puts a
    link to `outside` in its place: the race a check-then-use by path would lose."""

    def __init__(self, directory: Path, outside: Path) -> None:
        self.directory, self.outside = directory, outside

    def objects(self) -> list[StoredObject]:
        return [StoredObject("shards/1.safetensors", 5, "etag")]

    def download(self, key: str, file: BinaryIO) -> None:
        shards = self.directory / "shards"
        shards.rename(self.directory.parent / "aside")
        shards.symlink_to(self.outside / "keep")
        file.write(b"w" * 5)

    def failure(self, error: Exception) -> Exception:
        return error


def test_a_directory_swapped_for_a_link_mid_download_is_not_followed(tmp_path, outside):
    cache = tmp_path / "cache"
    cache.mkdir()
    before = contents(outside)
    store = SwappingStore(cache / "model", outside)
    with (
        CacheDirectory.root(cache) as root,
        root.subdirectory(PurePosixPath("model")) as held,
        pytest.raises(FetchError) as raised,
    ):
        copy_objects(store.objects(), store, held)
    assert names_the_link(raised.value.message, cache / "model" / "shards")  # by the sweep
    assert contents(outside) == before
    # the download landed in the directory that was checked, wherever it was moved
    assert (cache / "aside" / "1.safetensors").read_bytes() == b"w" * 5
