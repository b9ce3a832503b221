"""MemoryFileIO: durable vs unflushed bytes, torn writes, directory entries (new directories
and directory renames too), determinism."""

from __future__ import annotations

import random

import pytest

from tidelog.sim.disk import MemoryFileIO


@pytest.fixture
def fio() -> MemoryFileIO:
    fio = MemoryFileIO()
    fio.makedirs("/d", durable=True)  # a log dir the disk had before
    return fio


def test_reads_see_every_write_before_a_crash(fio: MemoryFileIO) -> None:
    h = fio.open("/d/a")
    assert h.append(b"hello ") == 0
    assert h.append(memoryview(b"world")) == 6
    assert h.read(3, 5) == b"lo wo" and h.size() == 11
    assert h.read(9, 100) == b"ld"
    h.truncate(5)
    assert h.read(0, 100) == b"hello"
    assert fio.listdir("/d") == ["a"]


def test_a_crash_keeps_only_fsynced_bytes_of_files_whose_names_are_durable(fio: MemoryFileIO) -> None:
    h = fio.open("/d/a")
    h.append(b"durable")
    h.flush()
    fio.fsync_dir("/d")
    h.append(b" and lost")
    g = fio.open("/d/b")
    g.append(b"never named durably")
    g.flush()
    fio.crash()
    assert fio.listdir("/d") == ["a"]
    assert fio.read_file("/d/a") == b"durable"
    with pytest.raises(OSError, match="before a crash"):
        h.read(0, 1)


def test_an_unflushed_truncation_is_undone_by_a_crash(fio: MemoryFileIO) -> None:
    h = fio.open("/d/a")
    h.append(b"0123456789")
    h.flush()
    fio.fsync_dir("/d")
    h.truncate(4)
    h.append(b"xy")
    fio.crash()
    assert fio.read_file("/d/a") == b"0123456789"


def test_a_torn_write_keeps_a_prefix_of_the_unflushed_tail(fio: MemoryFileIO) -> None:
    seen = set()
    for seed in range(30):
        f = MemoryFileIO()
        f.makedirs("/d", durable=True)
        h = f.open("/d/a")
        h.append(b"base")
        h.flush()
        f.fsync_dir("/d")
        h.append(b"ABCDEFGH")
        f.crash(random.Random(seed), tear=True)
        content = f.read_file("/d/a")
        assert (b"baseABCDEFGH").startswith(content) and content.startswith(b"base")
        seen.add(len(content))
    assert len(seen) > 3  # different seeds tear at different points


def test_crashes_are_deterministic_for_a_seed() -> None:
    def run(seed: int) -> dict[str, bytes]:
        f = MemoryFileIO()
        f.makedirs("/d", durable=True)
        for name in ("x", "y", "z"):
            h = f.open(f"/d/{name}")
            h.append(b"1" * 10)
            h.flush()
            h.append(b"2" * 50)
        f.fsync_dir("/d")
        f.crash(random.Random(seed), tear=True)
        return {n: f.read_file(f"/d/{n}") for n in f.listdir("/d")}

    assert run(5) == run(5)
    assert any(run(5) != run(s) for s in range(6, 12))


def test_rename_is_durable_only_after_fsync_dir(fio: MemoryFileIO) -> None:
    fio.write_file("/d/cp", b"old")
    h = fio.open("/d/cp.tmp")
    h.append(b"new")
    h.flush()
    h.close()
    fio.rename("/d/cp.tmp", "/d/cp")
    assert fio.read_file("/d/cp") == b"new"
    fio.crash()
    assert fio.read_file("/d/cp") == b"old"
    assert fio.listdir("/d") == ["cp"]  # the temp file's name was never durable either
    h = fio.open("/d/cp.tmp")
    h.append(b"new")
    h.flush()
    fio.fsync_dir("/d")
    fio.rename("/d/cp.tmp", "/d/cp")
    fio.crash()
    assert fio.read_file("/d/cp") == b"old" and fio.read_file("/d/cp.tmp") == b"new"
    fio.rename("/d/cp.tmp", "/d/cp")
    fio.fsync_dir("/d")
    fio.crash()
    assert fio.read_file("/d/cp") == b"new" and fio.listdir("/d") == ["cp"]


def test_remove_is_undone_by_a_crash_without_fsync_dir(fio: MemoryFileIO) -> None:
    fio.write_file("/d/seg", b"data")
    fio.remove("/d/seg")
    assert not fio.exists("/d/seg")
    fio.crash()
    assert fio.read_file("/d/seg") == b"data"
    fio.remove("/d/seg")
    fio.fsync_dir("/d")
    fio.crash()
    assert not fio.exists("/d/seg")


def test_errors_for_missing_paths_and_injected_failures(fio: MemoryFileIO) -> None:
    with pytest.raises(FileNotFoundError):
        fio.open("/nowhere/a")
    with pytest.raises(FileNotFoundError):
        fio.rename("/d/missing", "/d/b")
    with pytest.raises(FileNotFoundError):
        fio.listdir("/nowhere")
    fio.write_file("/d/sub/f", b"x")
    with pytest.raises(OSError, match="not empty"):
        fio.remove("/d/sub")
    h = fio.open("/d/a")
    fio.fail_io("/d")
    with pytest.raises(OSError, match="simulated I/O error"):
        h.append(b"x")
    with pytest.raises(OSError):
        fio.open("/d/b")
    fio.heal()
    h.append(b"x")
    h.close()
    with pytest.raises(OSError, match="closed"):
        h.read(0, 1)


def test_a_full_disk_fails_writes_but_still_reads(fio: MemoryFileIO) -> None:
    import errno

    h = fio.open("/d/a")
    h.append(b"kept")
    fio.fail_io("/d", error=errno.ENOSPC, writes_only=True)
    with pytest.raises(OSError) as info:
        h.append(b"more")
    assert info.value.errno == errno.ENOSPC
    with pytest.raises(OSError):
        fio.open("/d/new")
    assert h.read(0, 10) == b"kept" and h.size() == 4
    assert fio.listdir("/d") == ["a"]
    assert fio.open("/d/a").read(0, 4) == b"kept"  # opening an existing file is a read


def test_a_new_directory_is_lost_by_a_crash_until_its_parent_is_fsynced(fio: MemoryFileIO) -> None:
    fio.makedirs("/d/t-0")
    h = fio.open("/d/t-0/0.log")
    h.append(b"data")
    h.flush()
    fio.fsync_dir("/d/t-0")  # the file's name is durable in a dir whose own name is not
    fio.crash()
    assert not fio.exists("/d/t-0") and fio.listdir("/d") == []
    fio.makedirs("/d/t-0")
    h = fio.open("/d/t-0/0.log")
    h.append(b"data")
    h.flush()
    fio.fsync_dir("/d/t-0")
    fio.fsync_dir("/d")
    fio.crash()
    assert fio.read_file("/d/t-0/0.log") == b"data"


def test_a_directory_rename_moves_its_tree_and_is_durable_after_both_parents_fsync(
        fio: MemoryFileIO) -> None:
    fio.write_file("/d/t-0.abc-future/0.log", b"copied")
    fio.write_file("/e/keep", b"")
    h = fio.open("/d/t-0.abc-future/0.log")
    fio.rename("/d/t-0.abc-future", "/e/t-0")
    assert fio.listdir("/d") == [] and fio.listdir("/e/t-0") == ["0.log"]
    assert h.read(0, 6) == b"copied"  # an open handle follows the inode
    fio.fsync_dir("/e")
    fio.crash()
    # Only the new name was made durable: the tree is under both names (a hard link).
    assert fio.read_file("/e/t-0/0.log") == fio.read_file("/d/t-0.abc-future/0.log")
    fio.rename("/d/t-0.abc-future", "/d/t-0.abc-delete")
    fio.fsync_dir("/d")
    fio.crash()
    assert fio.listdir("/d") == ["t-0.abc-delete"]
    fio.rename("/d/t-0.abc-delete", "/d/t-0")
    fio.crash()  # not fsynced: the old name comes back
    assert fio.listdir("/d") == ["t-0.abc-delete"]


def test_directory_rename_errors(fio: MemoryFileIO) -> None:
    import errno

    fio.write_file("/d/a/f", b"x")
    fio.write_file("/d/b/g", b"y")
    fio.write_file("/d/file", b"z")
    fio.makedirs("/d/empty")
    with pytest.raises(OSError) as info:
        fio.rename("/d/a", "/d/a/inside")
    assert info.value.errno == errno.EINVAL
    with pytest.raises(OSError, match="not empty"):
        fio.rename("/d/a", "/d/b")
    with pytest.raises(NotADirectoryError):
        fio.rename("/d/a", "/d/file")
    with pytest.raises(IsADirectoryError):
        fio.rename("/d/file", "/d/empty")
    fio.rename("/d/a", "/d/empty")  # over an empty directory, as POSIX rename
    assert fio.listdir("/d") == ["b", "empty", "file"] and fio.listdir("/d/empty") == ["f"]


def test_rmdir_is_durable_only_after_the_parent_is_fsynced(fio: MemoryFileIO) -> None:
    fio.write_file("/d/t-0.x-delete/0.log", b"data")
    fio.remove("/d/t-0.x-delete/0.log")
    fio.remove("/d/t-0.x-delete")
    assert not fio.exists("/d/t-0.x-delete")
    fio.crash()
    # Neither the rmdir nor the file's removal was synced: both come back.
    assert fio.read_file("/d/t-0.x-delete/0.log") == b"data"
    fio.remove("/d/t-0.x-delete/0.log")
    fio.fsync_dir("/d/t-0.x-delete")
    fio.remove("/d/t-0.x-delete")
    fio.crash()
    assert fio.listdir("/d/t-0.x-delete") == []  # back, with only its synced entries
    fio.remove("/d/t-0.x-delete")
    fio.fsync_dir("/d")
    fio.crash()
    assert fio.listdir("/d") == []


def test_a_retired_log_dir_removed_unsynced_comes_back_and_the_next_start_retires_it() -> None:
    """LogManager.delete_logs removes a retired `-delete` dir without fsyncing its parent, as
    Kafka's deleteLogs (LocalLog.deleteEmptyDir is a plain Utils.delete): a power loss may bring
    it back, and the next start queues it for removal again (Kafka's loadLog) instead of loading
    it as a log."""
    from tidelog.protocol.records.builder import build_values
    from tidelog.storage.log_config import LogConfig
    from tidelog.storage.log_manager import LogManager

    fio = MemoryFileIO()
    fio.makedirs("/d", durable=True)
    m = LogManager(["/d"], LogConfig(file_delete_delay_ms=0), fio)
    m.get_or_create_log("t", 0).append_as_leader(build_values([b"x"]), 0, 0)
    m.get_or_create_log("t", 1).append_as_leader(build_values([b"y"]), 0, 0)
    m.get_log("t", 1).flush()  # type: ignore[union-attr]
    m.checkpoint_logs()
    assert m.delete_log("t", 0, now_ms=0)
    (retired,) = [n for n in fio.listdir("/d") if n.startswith("t-0")]
    assert m.delete_logs(0) == 1 and retired not in fio.listdir("/d")
    fio.crash()
    assert retired in fio.listdir("/d")  # the rmdir was not durable
    again = LogManager(["/d"], LogConfig(file_delete_delay_ms=0), fio)
    assert list(again.logs) == [("t", 1)] and again.delete_logs(0) == 1
    assert retired not in fio.listdir("/d")
