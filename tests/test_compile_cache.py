"""The persistent compilation cache (experiments/training/compile_cache.py)."""
import dataclasses
import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.training import compile_cache
from randomized_pe import families
import tasks
from tests import entry_points
from tests import mlir_contexts


def test_compilation_cache_folder_resolution():
  env = {"XDG_CACHE_HOME": "/x"}
  assert compile_cache.resolve("", env) == "/x/randomized_pe/jax"
  assert compile_cache.resolve("", {**env, compile_cache.ENV: "/y"}) == "/y"
  assert compile_cache.resolve("/z", {**env, compile_cache.ENV: "/y"}) == "/z"  # Config wins.
  assert compile_cache.resolve("off", env) is None
  assert compile_cache.resolve("", {compile_cache.ENV: "0"}) is None
  assert compile_cache.resolve("", {"HOME": "/h"}).endswith(
      os.path.join(".cache", "randomized_pe", "jax"))


def test_the_suites_temporary_cache_folder_is_removed_by_the_process_that_made_it(
    tmp_path, monkeypatch):
  """Without pytest's cache provider the suite caches in a temporary folder: the process
  that made it (pytest-xdist's controller) removes it at the end, a worker that inherited
  it does not."""
  conftest = _conftest()

  class Config:  # pytest's config without the cache provider.
    cache = None

  monkeypatch.setattr(compile_cache, "enable", lambda *args, **kwargs: None)
  monkeypatch.setattr(conftest.tempfile, "tempdir", str(tmp_path))
  monkeypatch.setattr(conftest, "_made_folder", None)
  monkeypatch.delenv(conftest._RUN_CACHE_ENV, raising=False)  # pylint: disable=protected-access
  monkeypatch.delenv(compile_cache.ENV, raising=False)
  conftest.pytest_configure(Config())
  made = os.environ[conftest._RUN_CACHE_ENV]  # pylint: disable=protected-access
  assert os.path.isdir(made) and os.path.dirname(made) == str(tmp_path)
  assert os.environ[compile_cache.ENV] == made
  monkeypatch.setattr(conftest, "_made_folder", None)  # A worker: inherits, keeps.
  conftest.pytest_configure(Config())
  conftest.pytest_unconfigure(Config())
  assert os.path.isdir(made)
  monkeypatch.setattr(conftest, "_made_folder", made)  # The controller: removes.
  conftest.pytest_unconfigure(Config())
  assert not os.listdir(tmp_path)



def _conftest():
  conftest, = [m for m in list(sys.modules.values())
               if getattr(m, "__file__", None) == os.path.join(os.path.dirname(__file__),
                                                               "conftest.py")]
  return conftest


def test_programs_lowered_in_the_suites_shared_mlir_context_equal_fresh_ones(monkeypatch):
  """The suite lowers every program of a thread in one MLIR context (tests/mlir_contexts.py):
  one context per thread, and the same lowered text and results as JAX's fresh contexts."""
  from jax._src.interpreters import mlir  # pylint: disable=import-outside-toplevel
  import threading  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(mlir, "make_ir_context", mlir.make_ir_context)  # Undone at the end.
  assert mlir_contexts.reuse()  # Already on unless RANDOMIZED_PE_TEST_XLA_DEFAULTS=1.
  assert mlir_contexts.reuse()  # Wraps once.
  assert getattr(mlir.make_ir_context.fresh, "fresh", None) is None
  assert mlir.make_ir_context() is mlir.make_ir_context()
  other = []
  thread = threading.Thread(target=lambda: other.append(mlir.make_ir_context()))
  thread.start()
  thread.join()
  assert other[0] is not mlir.make_ir_context()

  @jax.jit
  def inner(x):
    return jnp.tanh(x) @ x.T @ x / 10

  def program(x, y):
    z = jax.lax.fori_loop(0, 3, lambda i, z: z + inner(z) * i, x)
    return jax.nn.softmax(z * y, axis=-1).sum(), jnp.cumsum(z, axis=0)

  x = jnp.arange(12.0).reshape(3, 4) / 7
  y = jnp.linspace(-1.0, 1.0, 4)

  def lowered_twice():  # The second time in a context that already holds a module.
    first = jax.jit(program).lower(x, y)
    return first.as_text(), jax.jit(program).lower(x + 1, y).as_text(), jax.jit(
        program)(x, y), first.compile()(x, y)

  reused = lowered_twice()
  jax.clear_caches()
  monkeypatch.setattr(mlir, "make_ir_context", mlir.make_ir_context.fresh)
  fresh = lowered_twice()
  assert mlir.make_ir_context() is not mlir.make_ir_context()
  assert reused[0] == fresh[0] and reused[1] == fresh[1]
  for a, b in zip(jax.tree.leaves(reused[2:]), jax.tree.leaves(fresh[2:])):
    np.testing.assert_array_equal(a, b)
  jax.clear_caches()


def _cache_line(stdout):
  """(JAX programs loaded, compiled, written; executables loaded, written) of a run."""
  lines = [l for l in stdout.splitlines() if l.startswith("compilation cache ")]
  assert len(lines) == 1, stdout
  numbers = re.findall(r"(\d+) (?:programs loaded|compiled|\(?written|executables loaded)",
                       lines[0])
  assert len(numbers) == 5, lines[0]
  return tuple(int(n) for n in numbers)


def test_a_second_process_with_a_warm_cache_traces_and_compiles_nothing(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": root,
         compile_cache.ENV: str(tmp_path / "cache")}
  args = ["--config=configs/demo.py", "--task=parity_check", "--pe=randomized_relative",
          "--config.model.num_layers=1", "--config.model.d_model=16",
          "--config.model.num_heads=2", "--config.training.steps=3",
          "--config.training.batch_size=8", "--config.training.max_length=3",
          "--config.evaluation.max_length=5", "--config.evaluation.batch_size=8",
          "--config.evaluation.max_buckets=2", "--config.progress=False"]
  runs = []
  for name in ("cold", "warm"):
    out = entry_points.run("experiments.train", [*args, f"--workdir={tmp_path / name}"],
                           cwd=root, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    runs.append(_cache_line(out.stdout))
  cold, warm = runs
  cold_loaded, cold_compiled, cold_written, cold_exe_loaded, cold_exe_written = cold
  # Cold: every program compiled and written, and the run's programs (initialisation,
  # one training step per length, one evaluation program per bucket) kept whole.
  assert cold_loaded == 0 and cold_compiled > 3 and cold_written == cold_compiled
  assert cold_exe_loaded == 0 and 3 <= cold_exe_written <= cold_compiled
  # Warm: the kept executables are loaded without tracing; the few programs outside them
  # (e.g. eager one-off operations) come from JAX's cache; nothing is compiled.
  warm_loaded, warm_compiled, warm_written, warm_exe_loaded, warm_exe_written = warm
  assert warm_compiled == 0 and warm_written == 0 and warm_exe_written == 0
  assert warm_exe_loaded == cold_exe_written
  assert warm_loaded == cold_compiled - cold_exe_written
  # Same results either way.
  cold = json.loads((tmp_path / "cold" / "eval.json").read_text())
  warm = json.loads((tmp_path / "warm" / "eval.json").read_text())
  assert cold["accuracy"] == warm["accuracy"]


# --- whole executables (compile_cache.Program), in this process ---------------------


@pytest.fixture
def executables(tmp_path, monkeypatch):
  """Turns the executable layer on, in a fresh folder, for one test, with JAX's own cache
  off: on a loaded machine a tiny program can take over the suite's 0.2 s to compile and
  land in JAX's cache, and a program JAX loads from its cache is (rightly) not kept
  whole, which these tests would misread as a failure to write (they failed so under
  load). The test of that rule turns JAX's cache on itself."""
  suite_folder = os.environ.get(compile_cache.ENV, "off")
  monkeypatch.setenv(compile_cache.ENV, suite_folder)  # enable() exports its folder.
  compile_cache.enable("off")
  folder = tmp_path / "executables"
  monkeypatch.setattr(compile_cache, "_executables", str(folder))
  yield folder
  # Back to the suite's settings (tests/conftest.py): JAX's cache only, in its folder.
  compile_cache.enable(suite_folder, min_compile_seconds=0.2, executables=False)


def _counting_program(key, traces, donate=()):
  def fn(x, y, scale):
    traces.append(x.shape)
    return x * scale + y.sum(), (x - 1.0).astype(jnp.bfloat16)
  return compile_cache.Program(fn, "f", key, donate_argnums=donate)


def _loaded():
  return compile_cache.stats()["executables_loaded"]


def test_a_kept_executable_is_loaded_without_tracing_and_gives_the_same_result(executables):
  x, y = jnp.arange(6.0).reshape(2, 3), jnp.ones((4,))
  traces = []
  want = _counting_program({"a": 1}, traces)(x, y, 2)
  assert traces == [(2, 3)] and len(list(executables.iterdir())) == 1
  loaded = _loaded()
  got = _counting_program({"a": 1}, traces)(x, y, 2)  # A new program object, same key.
  assert traces == [(2, 3)] and _loaded() == loaded + 1  # Loaded, not traced.
  for g, w in zip(got, want):
    assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
  # Another key, another shape, another dtype or a weak type of its own: traced anew.
  _counting_program({"a": 2}, traces)(x, y, 2)
  _counting_program({"a": 1}, traces)(x[:1], y, 2)
  _counting_program({"a": 1}, traces)(x.astype(jnp.bfloat16), y, 2)
  _counting_program({"a": 1}, traces)(x, y, 2.0)
  assert len(traces) == 5 and len(list(executables.iterdir())) == 5


def test_a_loaded_executable_still_donates_its_arguments(executables):
  traces = []
  x, y = jnp.ones((2, 3)), jnp.ones((4,))
  _counting_program({"d": 1}, traces, donate=(0,))(x, y, 1)
  assert x.is_deleted()
  x = jnp.ones((2, 3))
  out, _ = _counting_program({"d": 1}, traces, donate=(0,))(x, y, 1)
  assert len(traces) == 1 and x.is_deleted()  # Loaded, and the buffer given up.
  np.testing.assert_array_equal(np.asarray(out), np.full((2, 3), 5.0))


def test_a_damaged_executable_is_compiled_again_and_rewritten(executables, capsys):
  traces = []
  x, y = jnp.ones((2, 3)), jnp.ones((4,))
  want = _counting_program({"t": 1}, traces)(x, y, 3)[0]
  (path,) = list(executables.iterdir())
  path.write_bytes(path.read_bytes()[:100])  # Truncated.
  got = _counting_program({"t": 1}, traces)(x, y, 3)[0]
  assert len(traces) == 2 and "could not load" in capsys.readouterr().err
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  _counting_program({"t": 1}, traces)(x, y, 3)  # The rewritten file loads.
  assert len(traces) == 2


def test_no_key_no_folder_or_code_from_outside_the_project_keep_nothing(executables,
                                                                        monkeypatch):
  traces = []
  x, y = jnp.ones((2, 3)), jnp.ones((4,))
  _counting_program(None, traces)(x, y, 1)
  assert not executables.exists()
  # A family registered from outside the project's folders (here: this test module).
  family = families.get_family("relative")
  outside = dataclasses.replace(family, name="outside_relative", scorer=lambda *a: None)
  families.FAMILIES.register(outside.name, outside)
  try:
    assert any("outside_relative" in f for f in compile_cache.foreign_components())
    _counting_program({"k": 1}, traces)(x, y, 1)
    _counting_program({"k": 1}, traces)(x, y, 1)
    assert len(traces) == 3 and not executables.exists()
  finally:
    families.FAMILIES.unregister(outside.name)
  assert compile_cache.foreign_components() == []
  monkeypatch.setattr(compile_cache, "_executables", None)
  _counting_program({"k": 1}, traces)(x, y, 1)
  assert len(traces) == 4 and not executables.exists()


def test_a_program_called_inside_a_trace_is_traced_with_it(executables):
  traces = []
  shape = jax.eval_shape(lambda x: _counting_program({"e": 1}, traces)(x, x, 1)[0],
                         jnp.ones((2, 4)))
  assert shape.shape == (2, 4) and not executables.exists()


def test_the_key_of_a_run_ignores_only_where_and_how_visibly_it_runs():
  from configs import demo  # pylint: disable=import-outside-toplevel
  config, task = demo.get_config(), tasks.get("reverse_string")
  key = compile_cache.run_key(config, task)
  config.compilation_cache, config.progress = "/elsewhere", not config.progress
  assert compile_cache.run_key(config, task) == key
  for field, value in (("seed", 5), ("model.d_model", 8), ("training.max_programs", 3)):
    changed = demo.get_config()
    section, _, name = field.rpartition(".")
    setattr(changed[section] if section else changed, name, value)
    assert compile_cache.run_key(changed, task) != key, field
  assert compile_cache.run_key(demo.get_config(), tasks.get("parity_check")) != key


def test_a_program_jax_loaded_from_its_own_cache_is_not_kept(executables, tmp_path,
                                                            monkeypatch):
  # Serializing an executable that JAX loaded from its persistent cache gives one that
  # fails when loaded (jaxlib 0.10.2: "Function ... not found"), so it is not written.
  suite_folder = os.environ.get(compile_cache.ENV, "off")
  monkeypatch.setenv(compile_cache.ENV, suite_folder)  # enable() exports its folder.
  compile_cache.enable(str(tmp_path / "jax"), min_compile_seconds=0.0)
  try:
    traces = []
    x, y = jnp.ones((3, 5)), jnp.ones((2,))
    want = _counting_program({"j": 1}, traces)(x, y, 4)[0]  # Compiled, written.
    jax.clear_caches()
    got = _counting_program({"j": 2}, traces)(x, y, 4)[0]  # Same program: JAX's cache.
    assert compile_cache.stats()["loaded"] >= 1
    assert len(list((tmp_path / "jax" / compile_cache.EXECUTABLES).iterdir())) == 1
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  finally:
    # Back to the suite's settings (tests/conftest.py): JAX's cache only, in its folder.
    compile_cache.enable(suite_folder, min_compile_seconds=0.2, executables=False)


def test_programs_compile_with_the_platforms_options_unless_xla_flags_name_them(monkeypatch):
  assert compile_cache.compiler_options({}) == compile_cache.COMPILER_OPTIONS.get(
      jax.default_backend(), {})
  if jax.default_backend() == "cpu":
    assert compile_cache.compiler_options({}) == {"xla_backend_optimization_level": 1}
  for name in compile_cache.compiler_options({}):
    assert name not in compile_cache.compiler_options({"XLA_FLAGS": f"--{name}=2 --x=1"})
  seen = []
  compile_ = jax.stages.Lowered.compile
  monkeypatch.setattr(jax.stages.Lowered, "compile",
                      lambda self, options=None, **kw: seen.append(options)
                      or compile_(self, options, **kw))
  program = compile_cache.Program(lambda x: x * 3 + 1, "options test")
  np.testing.assert_array_equal(program(jnp.arange(4.0)), [1.0, 4.0, 7.0, 10.0])
  assert seen == [compile_cache.compiler_options() or None]
