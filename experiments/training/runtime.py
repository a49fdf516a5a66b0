"""Process settings for fast XLA CPU training, applied by the entry points.

XLA's CPU runtime allocates each program's temporary buffer afresh on every
execution (about 340 MB for a training step of the paper model at batch 128 and
sequence length 72). glibc serves an allocation that large with a new mmap, so
every step touches fresh 4 KiB pages: tens of thousands of page faults and a
kernel time that is a sizeable part of a CPU step. glibc's `glibc.malloc.hugetlb=1`
tunable makes malloc back such mappings with transparent huge pages (2 MiB), which
cuts the faults many-fold and makes training faster (`python -m experiments.benchmark
--sections=train`; figures in docs/benchmark.md, "Figures behind code choices").

glibc reads tunables only when a process starts, so `maybe_reexec()` restarts
the process once, with the same interpreter and arguments, with the tunable
added to GLIBC_TUNABLES. It does so only on Linux with glibc >= 2.35 and
transparent huge pages not disabled, and never when GLIBC_TUNABLES already sets
`glibc.malloc.hugetlb` (so a user's own choice wins and there is no loop).
Set RANDOMIZED_PE_MALLOC_TUNING=0 to turn it off. Code that imports the library
instead of running an entry point can get the same effect by starting Python
with GLIBC_TUNABLES=glibc.malloc.hugetlb=1.

Results do not depend on this setting; only speed does.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping, Optional

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "RANDOMIZED_PE_MALLOC_TUNING"
_THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def _glibc_version() -> Optional[tuple]:
  name, version = platform.libc_ver()
  if name != "glibc":
    return None
  try:
    return tuple(int(part) for part in version.split(".")[:2])
  except ValueError:
    return None


def _thp_mode() -> Optional[str]:
  """The bracketed mode of /sys/kernel/mm/transparent_hugepage/enabled, or None."""
  try:
    with open(_THP_MODE_FILE) as f:
      text = f.read()
  except OSError:
    return None
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else None


def tuned_environment(environ: Mapping[str, str], system: str,
                      glibc_version: Optional[tuple], thp_mode: Optional[str]
                      ) -> Optional[dict]:
  """The environment to restart with, or None when the process should run as it is.

  Args:
    environ: the current environment.
    system: platform.system() ("Linux", "Darwin", ...).
    glibc_version: (major, minor) of the C library if it is glibc, else None.
    thp_mode: transparent huge page mode ("always", "madvise", "never"), or
      None if unknown.
  """
  if environ.get(OPT_OUT, "1").strip().lower() in ("0", "false", "no", "off"):
    return None
  if system != "Linux" or glibc_version is None or glibc_version < (2, 35):
    return None
  if thp_mode not in ("always", "madvise"):
    return None
  current = environ.get("GLIBC_TUNABLES", "")
  if any(item.split("=", 1)[0] == TUNABLE for item in current.split(":") if item):
    return None  # Already set, by us (after the restart) or by the user.
  env = dict(environ)
  env["GLIBC_TUNABLES"] = f"{current}:{TUNABLE}=1" if current else f"{TUNABLE}=1"
  return env


def tuned_environment_here(environ: Mapping[str, str]) -> Optional[dict]:
  """`tuned_environment` for this machine's system, C library and THP mode."""
  return tuned_environment(environ, platform.system(), _glibc_version(), _thp_mode())


def maybe_reexec() -> None:
  """Restarts this process with `glibc.malloc.hugetlb=1` where that applies (see module doc).

  Call it first thing in an entry point's `if __name__ == "__main__":` block,
  before JAX starts. Returns normally when no restart is needed.
  """
  env = tuned_environment_here(os.environ)
  if env is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  # sys.orig_argv holds the command line as given (e.g. ["python", "-m", "experiments.train", ...]).
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
