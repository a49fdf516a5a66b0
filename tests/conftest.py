"""Shared test settings: CPU, and one persistent compilation cache for the whole run.

The cache lives in pytest's cache folder (.pytest_cache/d/jax-compilation-cache), so a
second `make test` on the same checkout loads most programs instead of compiling them;
with pytest's cache provider off, in a temporary folder for this run. Only JAX's own
cache in this process; whole executables (compile_cache.Program) are the entry points'. Entry points that
tests start as subprocesses inherit it through RANDOMIZED_PE_COMPILATION_CACHE. A test
that needs its own cache sets that variable for its subprocess.
"""
import os
import shutil
import tempfile

import pytest

from tests import mlir_contexts

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The suite's models are tiny and train for a few steps, so XLA's compile time dominates it.
# LLVM's optimisation level 0 with XLA's older (non-MLIR) fusion emitters compiles a 1-layer
# training step about 7x faster on the CI's CPU (1.2 s instead of 8.3 s; level 0 alone:
# 2.7 s; docs/benchmark.md, "The test suite"). Set before JAX starts its backend, and
# inherited by the entry points that tests start as subprocesses (their caches key on it).
# XLA's FAST_COMPILE preset and one LLVM module per program (no split for parallel
# codegen, whose threads only compete with the other pytest worker for the two cores) take
# about another 35% off a compile's CPU time, 15% off that of the model tests (with the
# MLIR emitters the preset makes compiles slower, not faster).
# JAX lowers every program in one MLIR context per thread (tests/mlir_contexts.py).
# RANDOMIZED_PE_TEST_XLA_DEFAULTS=1 runs the suite with JAX's and XLA's defaults instead.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
                      "--xla_cpu_opt_preset=FAST_COMPILE",
                      "--xla_cpu_parallel_codegen_split_count=1")
if mlir_contexts.wanted():
  _flags = os.environ.get("XLA_FLAGS", "").split()
  os.environ["XLA_FLAGS"] = " ".join(_flags + [f for f in FAST_COMPILE_FLAGS if f not in _flags])
  mlir_contexts.reuse()

# Eager one-op programs (thousands in the reference implementations) are not written.
_MIN_COMPILE_SECONDS = 0.2
# This run's temporary cache folder when pytest's cache provider is off (see below).
_RUN_CACHE_ENV = "RANDOMIZED_PE_TEST_RUN_CACHE"
# That folder when this process made it (and removes it at the end), else None.
_made_folder = None


def pytest_configure(config):
  from experiments.training import compile_cache  # pylint: disable=import-outside-toplevel

  if compile_cache.resolve() is None:
    return  # Turned off on purpose (RANDOMIZED_PE_COMPILATION_CACHE=off): leave it off.
  cache = getattr(config, "cache", None)
  if cache is not None:
    folder = str(cache.mkdir("jax-compilation-cache"))
  else:
    # Without the cache provider, one temporary folder for the whole run: made by the
    # first process (pytest-xdist's controller) and inherited by its workers, so that they
    # share it as they share .pytest_cache's folder otherwise.
    global _made_folder  # pylint: disable=global-statement
    folder = os.environ.get(_RUN_CACHE_ENV)
    if not folder:
      folder = _made_folder = tempfile.mkdtemp(prefix="jax-compilation-cache-")
    os.environ[_RUN_CACHE_ENV] = folder
  os.environ[compile_cache.ENV] = folder
  # Whole executables (compile_cache.Program) stay off in this process: tests monkeypatch
  # project code, which their key cannot see. Entry points started as subprocesses use them.
  compile_cache.enable(folder, min_compile_seconds=_MIN_COMPILE_SECONDS, executables=False)


def pytest_unconfigure(config):
  """Removes the temporary cache folder this process made (pytest-xdist's controller
  unconfigures after its workers have finished)."""
  del config
  if _made_folder is not None:
    shutil.rmtree(_made_folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_whole_executables_in_this_process(monkeypatch):
  """Keeps compile_cache.Program's disk layer off in every test, also after a test that
  ran an entry point's code in this process (which turns it on): tests monkeypatch
  project code, which the executables' key cannot see."""
  from experiments.training import compile_cache  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(compile_cache, "_executables", None)
