"""The entry points' restart with glibc's huge-page malloc (experiments/training/runtime.py)."""
import os
import subprocess
import sys

import pytest

from experiments.training import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINUX = ("Linux", (2, 36), "madvise")


@pytest.mark.parametrize("system,glibc,thp", [LINUX, ("Linux", (2, 36), "always")])
def test_adds_the_tunable_where_it_applies(system, glibc, thp):
  environ = {"PATH": "/bin"}
  env = runtime.tuned_environment(environ, system, glibc, thp)
  assert env == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  assert environ == {"PATH": "/bin"}  # The caller's mapping is left alone.


def test_keeps_other_tunables():
  env = runtime.tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, *LINUX)
  assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("environ,system,glibc,thp", [
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, *LINUX),  # After the restart: no loop.
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"}, *LINUX),  # User's.
    ({runtime.OPT_OUT: "0"}, *LINUX),
    ({runtime.OPT_OUT: "off"}, *LINUX),
    ({}, "Darwin", None, None),
    ({}, "Linux", None, "madvise"),  # musl or another C library.
    ({}, "Linux", (2, 34), "madvise"),  # glibc without the tunable.
    ({}, "Linux", (2, 36), "never"),
    ({}, "Linux", (2, 36), None),  # No THP support in the kernel.
])
def test_no_restart(environ, system, glibc, thp):
  assert runtime.tuned_environment(environ, system, glibc, thp) is None


@pytest.mark.parametrize("opt_out", [None, "0"])
def test_restart_keeps_arguments_and_sets_the_tunable(opt_out):
  """The real exec path: same interpreter, same arguments, tunable set iff it applies here."""
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", runtime.OPT_OUT)}
  env["PYTHONPATH"] = ROOT
  if opt_out is not None:
    env[runtime.OPT_OUT] = opt_out
  code = ("import os, sys\n"
          "from experiments.training import runtime\n"
          "runtime.maybe_reexec()\n"
          "print(repr(sys.argv[1:]), os.environ.get('GLIBC_TUNABLES', ''))\n")
  out = subprocess.run([sys.executable, "-c", code, "a b", "--flag=1"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60, check=True)
  applies = runtime.tuned_environment_here(env) is not None
  expected = "glibc.malloc.hugetlb=1" if applies else ""
  assert out.stdout.strip() == f"['a b', '--flag=1'] {expected}".strip()
  if opt_out is not None:
    assert not applies
