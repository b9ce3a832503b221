"""Build of tidelog's two C accelerators (the rest is in pyproject.toml).

Both are optional at run time: every C path has a pure-Python twin that the tests compare it
with. Without a compiler the install still succeeds and tidelog runs on the Python paths, unless
TIDELOG_REQUIRE_NATIVE=1 (set by `make install`) turns a failed compile into a failed install.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CFLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]

EXTENSIONS = [
    # Kafka records -> Arrow column buffers (the Spark connector's read path).
    Extension(
        "tidelog.protocol.records._columnar",
        ["src/tidelog/protocol/records/_columnar.c"],
        extra_compile_args=CFLAGS,
    ),
    # The generated protocol decoders' programs, interpreted in C.
    Extension(
        "tidelog.protocol._native_decoder",
        ["src/tidelog/protocol/_native_decoder.c"],
        extra_compile_args=CFLAGS,
    ),
]


class OptionalBuildExt(build_ext):
    def _required(self) -> bool:
        return os.environ.get("TIDELOG_REQUIRE_NATIVE") == "1"

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all
            if self._required():
                raise
            print(f"tidelog: C accelerators not built ({exc}); using pure Python", file=sys.stderr)

    def copy_file(self, infile, outfile, *args, **kwargs):  # type: ignore[no-untyped-def]
        # In-place builds replace the .so by a rename, never by rewriting it: a process that has
        # the old one loaded (a test run, a broker) keeps a valid mapping instead of crashing.
        if os.path.isdir(outfile):
            outfile = os.path.join(outfile, os.path.basename(infile))
        tmp = f"{outfile}.{os.getpid()}.tmp"
        _, copied = super().copy_file(infile, tmp, *args, **kwargs)
        os.replace(tmp, outfile)
        return outfile, copied

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            if self._required():
                raise
            print(f"tidelog: {ext.name} not built ({exc}); using pure Python", file=sys.stderr)


setup(
    ext_modules=EXTENSIONS,
    cmdclass={"build_ext": OptionalBuildExt},
)
