"""`tidelog log write/read/describe` over a real log dir."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tidelog.cli.main import cli
from tidelog.storage.file_io import OsFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["log", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_write_then_read_back_the_records(tmp_path: Path, codec: str) -> None:
    code, out = run("write", str(tmp_path), "--topic", "orders", "--partition", "2",
                    "--count", "30", "--size", "12", "--batch", "7", "--compression", codec)
    assert code == 0, out
    assert "wrote 30 records to orders-2 at offsets 0..29" in out
    code, out = run("read", str(tmp_path), "--topic", "orders", "--partition", "2",
                    "--from", "26", "--max", "3")
    assert code == 0, out
    for offset in (26, 27, 28):
        assert f"key-{offset}" in out
    assert "key-29" not in out and "key-25" not in out
    assert "tidelog-tide" in out and "3 records" in out
    manager = LogManager([str(tmp_path)], LogConfig(), OsFileIO())
    log = manager.get_log("orders", 2)
    assert log is not None and log.log_end_offset == 30
    assert [b.compression_type for b in log.batches()][0] == ["none", "gzip", "snappy", "lz4",
                                                              "zstd"].index(codec)
    assert manager.had_clean_shutdown[str(tmp_path)]


def test_describe_shows_segments_offsets_hw_and_epochs(tmp_path: Path) -> None:
    run("write", str(tmp_path), "--topic", "t", "--partition", "0", "--count", "10", "--batch", "5")
    run("write", str(tmp_path), "--topic", "t", "--partition", "0", "--count", "4", "--epoch", "3")
    run("write", str(tmp_path), "--topic", "u", "--partition", "1", "--count", "1")
    code, out = run("describe", str(tmp_path))
    assert code == 0, out
    assert "t-0" in out and "u-1" in out
    assert "log start offset 0, log end offset 14, recovery point 14, HW 14" in out
    assert "leader epochs 0@0, 3@10" in out
    assert "│                   0 │" in out  # the segment row: base offset 0
    assert "│       3 │      14 │" in out  # 3 batches, 14 records


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["read", "{dir}/missing", "--topic", "t", "--partition", "0"], "no such log dir"),
        (["read", "{dir}", "--topic", "nope", "--partition", "0"], "no log for nope-0"),
        (["read", "{dir}", "--topic", "t", "--partition", "0", "--from", "99"],
         "offset 99 is out of range: t-0 holds [0, 3)"),
        (["describe", "{dir}/missing"], "no such log dir"),
        (["write", "{dir}", "--topic", "t", "--partition", "-1"], "Invalid value"),
        (["write", "{dir}", "--topic", "t", "--partition", "0", "--compression", "brotli"],
         "Invalid value"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path: Path, args: list[str], message: str) -> None:
    run("write", str(tmp_path), "--topic", "t", "--partition", "0", "--count", "3")
    code, out = run(*[a.format(dir=tmp_path) for a in args])
    assert code != 0
    assert message in out
    if "Invalid value" not in message:
        assert code == 1 and out.count("\n") == 1


def test_a_corrupt_tail_is_recovered_and_reported_by_describe(tmp_path: Path) -> None:
    run("write", str(tmp_path), "--topic", "t", "--partition", "0", "--count", "20", "--batch", "5")
    (tmp_path / ".kafka_cleanshutdown").unlink()
    segment = tmp_path / "t-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    data[-10] ^= 0xFF  # corrupt the last batch
    segment.write_bytes(bytes(data))
    (tmp_path / "recovery-point-offset-checkpoint").write_text("0\n0\n")
    code, out = run("describe", str(tmp_path))
    assert code == 0, out
    assert "log end offset 15" in out


def test_every_subcommand_explains_its_options(tmp_path: Path) -> None:
    for sub in ("write", "read", "describe"):
        code, out = run(sub, "--help")
        assert code == 0 and "Usage:" in out
    code, out = run("write", "--help")
    for option in ("--count", "--size", "--batch", "--compression", "default: 1000"):
        assert option in out
