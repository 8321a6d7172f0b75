"""`fairpool.files`: a file's version from stat, and the one change check every watcher uses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fairpool.files import FileVersion, FileWatch, file_version

pytestmark = pytest.mark.unit

SAME_TIME_NS = 1_700_000_000_000_000_000


def write(path: Path, text: str, mtime_ns: int = SAME_TIME_NS) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_version_is_inode_size_and_mtime_ns(tmp_path):
    path = tmp_path / "config.yaml"
    write(path, "abc")
    status = os.stat(path)
    assert file_version(path) == FileVersion(status.st_ino, 3, SAME_TIME_NS)
    assert file_version(str(path)) == file_version(path)


def test_a_file_that_cannot_be_seen_has_no_version(tmp_path):
    assert file_version(tmp_path / "missing") is None


def test_changed_is_true_once_per_change(tmp_path):
    path = tmp_path / "config.yaml"
    write(path, "a")
    watch = FileWatch(path)
    assert not watch.changed()
    write(path, "ab")
    assert watch.changed()
    assert not watch.changed()


def test_same_size_and_time_but_a_new_file_is_a_change(tmp_path):
    path, new = tmp_path / "config.yaml", tmp_path / "config.yaml.new"
    write(path, "a")
    watch = FileWatch(path)
    write(new, "b")  # what an editor that saves by renaming does
    new.replace(path)
    assert watch.changed()


def test_a_configmap_swap_of_its_data_link_is_a_change(tmp_path):
    # Kubernetes mounts a ConfigMap as key -> ..data/key, ..data -> ..<timestamp>/, and
    # swaps ..data to a new folder on an update. Size and time may match: the inode does not.
    mount = tmp_path / "mount"
    mount.mkdir()
    for version in ("..v1", "..v2"):
        (mount / version).mkdir()
        write(mount / version / "config.yaml", "x")
    (mount / "..data").symlink_to("..v1")
    (mount / "config.yaml").symlink_to("..data/config.yaml")
    watch = FileWatch(mount / "config.yaml")
    assert watch.versions[0] == file_version(mount / "..v1" / "config.yaml")  # links followed
    (mount / "..data_tmp").symlink_to("..v2")
    (mount / "..data_tmp").replace(mount / "..data")
    assert watch.changed()
    assert watch.versions[0] == file_version(mount / "..v2" / "config.yaml")


def test_a_file_going_and_coming_back_are_two_changes(tmp_path):
    path = tmp_path / "workers.txt"
    write(path, "http://a:8000\n")
    watch = FileWatch(path)
    path.unlink()
    assert watch.changed() and watch.versions == (None,)
    write(path, "http://a:8000\n")
    assert watch.changed()


def test_several_files_change_together(tmp_path):
    first, second = tmp_path / "pools.yaml", tmp_path / "tenants.yaml"
    write(first, "a")
    write(second, "b")
    watch = FileWatch(first, second)
    write(second, "bb")
    assert watch.changed()
    assert not watch.changed()
