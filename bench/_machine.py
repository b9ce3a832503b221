"""The machine a benchmark ran on, for the results in docs/benchmarks.md.

    from _machine import machine_description   # bench scripts run from bench/ or by path
    machine_description()  # "nproc 2, CPU AMD EPYC, RAM 24 GiB, Python 3.11.7, Linux 6.1, ..."

Benchmarks on a shared machine are noisy: the load average at the time is part of the record.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _ram() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return "?"


def _filesystem(path: str) -> str:
    try:
        out = subprocess.run(["df", "-T", path], capture_output=True, text=True, timeout=10)
        return out.stdout.splitlines()[1].split()[1]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "?"


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, e.g. "3.1 2.0 1.7"."""
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def cpu_ticks(*pids: int) -> tuple[int, int]:
    """(user, system) clock ticks the processes (all their threads) used so far
    (/proc/<pid>/stat); a process that is gone raises OSError."""
    user = system = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user += int(fields[11])  # utime
        system += int(fields[12])  # stime
    return user, system


def cpu_seconds(*pids: int) -> float:
    """User + system CPU seconds the processes (all their threads) used so far
    (/proc/<pid>/stat); a process that is gone counts 0."""
    total = 0
    for pid in pids:
        try:
            total += sum(cpu_ticks(pid))
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def thread_files(pids: Iterable[int], name: str) -> Iterator[str]:
    """The text of /proc/<pid>/task/<tid>/`name` of each thread of the processes (a JVM or
    Python broker works in threads other than its first); a thread that ended meanwhile is
    passed over."""
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                yield (task / name).read_text()
            except OSError:
                continue


def machine_info(data_path: str | None = None) -> dict[str, str]:
    """nproc, CPU model, RAM, Python version, kernel, load average (and the filesystem of
    `data_path` when given)."""
    info = {
        "nproc": str(os.cpu_count()),
        "CPU": _cpu_model(),
        "RAM": _ram(),
        "Python": platform.python_version(),
        "kernel": f"{platform.system()} {platform.release()}",
    }
    try:
        info["load average"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        pass
    if data_path is not None:
        info["filesystem"] = _filesystem(data_path)
    return info


def machine_description(data_path: str | None = None) -> str:
    """One line: `nproc 2, CPU ..., RAM 24 GiB, Python 3.11.7, kernel Linux ..., ...`."""
    return ", ".join(f"{k} {v}" for k, v in machine_info(data_path).items())


if __name__ == "__main__":
    print(machine_description("."))
