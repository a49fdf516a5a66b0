"""One MLIR context per thread for every program the suite lowers (conftest.py, and the
entry-point server of tests/entry_points.py for the runs it forks).

JAX makes a new MLIR context for every program it lowers, loading and registering its
dialects each time: about 5 ms of CPU, and the suite lowers some 5,400 programs, most of
them the one-op programs of models run op by op. The contexts also stay alive with what
JAX caches of a lowering. Lowering them all in one context per thread took 9% off the
suite's CPU time and its largest worker from 3.6 to 1.2 GB (docs/benchmark.md, "The test
suite"). The context only holds the IR while it is built: the lowered text and what XLA
compiles from it are the same (tests/test_compile_cache.py compares them).
"""
import os
import threading

# Set to 1 (or true) to run the suite at JAX's and XLA's defaults (conftest.py).
DEFAULTS_ENV = "RANDOMIZED_PE_TEST_XLA_DEFAULTS"


def wanted(environ=os.environ) -> bool:
  """Whether the suite's own compile settings apply (not RANDOMIZED_PE_TEST_XLA_DEFAULTS)."""
  return environ.get(DEFAULTS_ENV, "") not in ("1", "true")


def reuse() -> bool:
  """Makes JAX lower in one MLIR context per thread from now on; False if this JAX has no
  `make_ir_context` to wrap (then nothing changes). Calling it again changes nothing."""
  from jax._src.interpreters import mlir  # pylint: disable=import-outside-toplevel

  make = getattr(mlir, "make_ir_context", None)
  if make is None:
    return False
  if getattr(make, "fresh", None) is not None:
    return True
  local = threading.local()

  def per_thread():
    if getattr(local, "context", None) is None:
      local.context = make()
    return local.context

  per_thread.fresh = make  # JAX's own, for comparing.
  mlir.make_ir_context = per_thread
  return True
