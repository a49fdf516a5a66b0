"""JAX's persistent compilation cache, turned on by the entry points and the test suite.

On a 2-core CPU a run of the paper's model spends minutes compiling (one program per
training length, one per evaluation bucket), and a resumed run, every job of a sweep
and every test run used to compile the same programs again. JAX can keep compiled
programs on disk (CPU programs included, with the JAX we pin) keyed by the program and
the compiler's settings, so a second process with the same programs loads them instead
(figures: docs/benchmark.md, "Figures behind code choices").

Where the cache lives, first match wins:
  1. the config setting `compilation_cache` (a folder, or "off"), when not empty;
  2. the environment variable RANDOMIZED_PE_COMPILATION_CACHE (a folder, or "off");
  3. $XDG_CACHE_HOME/randomized_pe/jax (default ~/.cache/randomized_pe/jax).
`enable` also exports the folder in RANDOMIZED_PE_COMPILATION_CACHE, so processes the
run starts (sweep workers) share it. Results do not depend on the cache; only time does.

JAX's cache only skips XLA's compiling: every process still traces and lowers each
program to compute the cache key, seconds a program for the paper's 5-layer grid step on
a CPU (a warm start still took a large part of a cold one's time). So
the training and evaluation programs of a run are `Program`s: their whole executables
are also kept (in the folder's `executables/`), keyed without tracing by what decides
the program: the run's config, the arguments' shapes, dtypes and placements, the
project's source files and data, the versions of JAX and the libraries it builds on,
the devices and XLA_FLAGS. A warm start then loads them and traces nothing (the paper
model's training programs: docs/benchmark.md, "The persistent compilation cache").
Files are written whole (a temporary file, then renamed); one that cannot be read is
compiled again and rewritten. Code that
the key cannot see turns this layer off for the process: an entry of a registry
(families, samplers, models, optimizers, datasets) or a task defined outside the
project's folders, e.g. a family registered from a notebook. The test suite, whose
tests monkeypatch project code, leaves it off (`enable(..., executables=False)`).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import pickle
import sys
import threading
import zlib
from typing import Any, Callable, Mapping, Optional

import jax
from jax.experimental import serialize_executable
from jax.experimental.compilation_cache import compilation_cache

from experiments.storage import io_utils
from randomized_pe import registry
import tasks  # pylint: disable=unused-import  (foreign_components reads its registry)

ENV = "RANDOMIZED_PE_COMPILATION_CACHE"
OFF = ("0", "off", "false", "no", "none")
# Programs that compile faster than this are not written. Entry points write every
# program (a run is a few dozen jitted programs); the test suite skips eager one-op
# programs, of which it compiles thousands.
MIN_COMPILE_SECONDS = 0.0

EXECUTABLES = "executables"  # Subfolder of the cache folder with whole executables.

# XLA options every `Program` is compiled with, per platform. On a CPU, LLVM's
# optimisation level 1 instead of 2: the training and evaluation programs of the paper's
# model compile in about 0.8 of the time with steps as fast and, for that model, the
# same parameters bit for bit; other models may differ in the last bits (float
# rounding, as between two CPUs). Figures: docs/benchmark.md, "LLVM's level 1".
# XLA_FLAGS naming an option keeps the user's value.
COMPILER_OPTIONS = {"cpu": {"xla_backend_optimization_level": 1}}


def compiler_options(environ: Mapping[str, str] = os.environ) -> dict:
  """The options of `COMPILER_OPTIONS` for JAX's default backend that XLA_FLAGS does not
  set itself."""
  flags = environ.get("XLA_FLAGS", "")
  return {name: value for name, value in COMPILER_OPTIONS.get(jax.default_backend(), {}).items()
          if f"--{name}=" not in flags}

_events: collections.Counter = collections.Counter()
_listening = False
_folder: Optional[str] = None
_executables: Optional[str] = None  # Folder of whole executables; None: layer off.


def default_folder(environ: Mapping[str, str] = os.environ) -> str:
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "randomized_pe", "jax")


def resolve(setting: str = "", environ: Mapping[str, str] = os.environ) -> Optional[str]:
  """The cache folder for `setting` and `environ` (see the module docstring); None: off."""
  for value in (setting or "", environ.get(ENV, "")):
    value = value.strip()
    if value:
      return None if value.lower() in OFF else os.path.abspath(os.path.expanduser(value))
  return default_folder(environ)


def _count(name: str, **kwargs) -> None:
  del kwargs
  if name.startswith("/jax/compilation_cache/"):
    _events[name.rsplit("/", 1)[-1]] += 1


def enable(setting: str = "", min_compile_seconds: float = MIN_COMPILE_SECONDS,
           executables: bool = True) -> Optional[str]:
  """Turns the persistent cache on (or off) for this process; returns the folder or None.

  Call it before anything compiles. Raises OSError if the folder cannot be made.
  executables: also keep whole executables of `Program`s (module docstring).
  """
  global _listening, _folder, _executables

  if not _listening:
    jax.monitoring.register_event_listener(_count)
    _listening = True
  folder = resolve(setting)
  _folder = folder
  # JAX settles its cache's folder and whether it is used at the first compile of the
  # process; forgetting that makes a second call (tests switching folders) take effect.
  compilation_cache.reset_cache()
  _executables = os.path.join(folder, EXECUTABLES) if folder is not None and executables else None
  if folder is None:
    jax.config.update("jax_enable_compilation_cache", False)
    os.environ[ENV] = "off"
    return None
  os.makedirs(folder, exist_ok=True)
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  os.environ[ENV] = folder
  return folder


def stats() -> dict:
  """Programs this process asked the cache for, loaded from it, and compiled anew."""
  asked = _events["compile_requests_use_cache"]
  loaded = _events["cache_hits"]
  return {"folder": _folder, "requests": asked, "loaded": loaded, "compiled": asked - loaded,
          "written": _events["cache_misses"],
          "executables_loaded": _events["executables_loaded"],
          "executables_written": _events["executables_written"]}


def summary() -> str:
  """One line for the end of a run."""
  s = stats()
  if s["folder"] is None:
    return "compilation cache: off"
  return (f"compilation cache {s['folder']}: {s['loaded']} programs loaded, "
          f"{s['compiled']} compiled ({s['written']} written); "
          f"{s['executables_loaded']} executables loaded without tracing "
          f"({s['executables_written']} written)")



# --------------------------------------------------------------------------
# Whole executables, loaded without tracing.

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The project's folders: their files (code and data) are part of every executable's key.
PROJECT_PACKAGES = ("randomized_pe", "experiments", "tasks", "configs")
_LIBRARIES = ("jax", "jaxlib", "dm-haiku", "optax", "chex", "numpy", "ml_collections")
# Settings that change what tracing produces.
_TRACE_FLAGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
                "jax_threefry_partitionable", "jax_numpy_rank_promotion",
                "jax_numpy_dtype_promotion", "jax_softmax_custom_jvp")
# Config fields that change where or how visibly a run works, never its programs.
_NOT_IN_KEY = ("compilation_cache", "progress")


def run_key(config, task) -> dict:
  """The key of a run's programs (`Program`): its config but `_NOT_IN_KEY`, and the task
  (or dataset) the model is built for."""
  values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  return {"config": {k: v for k, v in values.items() if k not in _NOT_IN_KEY},
          "task": [type(task).__module__, type(task).__qualname__,
                   str(getattr(task, "name", ""))]}


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
  """sha256 of every file of the project's folders (paths and contents)."""
  digest = hashlib.sha256()
  for package in PROJECT_PACKAGES:
    for folder, dirs, files in os.walk(os.path.join(_ROOT, package)):
      dirs[:] = sorted(d for d in dirs if d != "__pycache__")
      for name in sorted(files):
        if name.endswith((".pyc", ".pyo")):
          continue
        path = os.path.join(folder, name)
        digest.update(os.path.relpath(path, _ROOT).encode() + b"\0")
        with open(path, "rb") as f:
          digest.update(hashlib.sha256(f.read()).digest())
  return digest.hexdigest()


def _module_of(obj) -> set:
  """Modules whose code `obj` runs: its own, and (for a dataclass, e.g. a Family) those of
  the callables among its fields."""
  modules = set()
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    for field in dataclasses.fields(obj):
      value = getattr(obj, field.name, None)
      if callable(value):
        modules |= _module_of(value)
    modules.add(type(obj).__module__)
    return modules
  func = getattr(obj, "func", None)  # functools.partial
  target = func if func is not None else obj
  module = getattr(target, "__module__", None) or type(target).__module__
  modules.add(module)
  return modules


def foreign_components() -> list:
  """Names of registered components whose code lies outside the project's folders."""
  entries = [(f"{r.what} {name!r}", r.get(name)) for r in registry.all_registries()
             for name in r.names()]
  ours = PROJECT_PACKAGES + ("builtins", "functools", "optax", "jax", "haiku", "numpy")
  foreign = []
  for label, entry in entries:
    outside = [m for m in _module_of(entry) if m.split(".")[0] not in ours]
    if outside:
      foreign.append(f"{label} ({', '.join(sorted(outside))})")
  return foreign


def _environment() -> dict:
  versions = {}
  for name in _LIBRARIES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  devices = jax.devices()
  return {"source": _source_digest(), "libraries": versions, "python": sys.version,
          "flags": {f: str(getattr(jax.config, f, None)) for f in _TRACE_FLAGS},
          "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "compiler_options": compiler_options(),
          "devices": [devices[0].platform, devices[0].client.platform_version,
                      [d.device_kind for d in devices], jax.process_count()]}


def _leaf_signature(x):
  """What a compiled program fixes about an argument: a JAX array's aval (shape, dtype,
  weak type) and placement, a host array's shape and dtype, a Python scalar's type (JAX
  passes it as a weakly typed array)."""
  aval = getattr(x, "aval", None)
  if aval is not None:
    return aval, x.sharding
  shape = getattr(x, "shape", None)
  if shape is not None:
    return shape, x.dtype
  return type(x)


class Program:
  """A jitted function whose compiled executables are also kept whole on disk.

  Calling it (or `compile`) with arguments of a new signature (tree structure, shapes,
  dtypes, weak types, placements) loads the executable from the cache's folder when
  one was written for the same key, signature and environment (module docstring), and
  otherwise lowers and compiles as `jax.jit` would (JAX's own cache may still skip
  XLA's compiling) and writes it. With the layer off (no folder, `key` None, or code the
  key cannot see) it is `jax.jit` with a per-signature table.

  Args:
    fn: the function; everything it closes over must be determined by `key`.
    name: which program of a run this is (part of the key).
    key: JSON-able description of what `fn` closes over (e.g. `run_key(config, task)`);
      None: never read or written on disk.
    donate_argnums: as for `jax.jit`.
  """

  def __init__(self, fn: Callable, name: str, key: Any = None, donate_argnums=()):
    self._jitted = jax.jit(fn, donate_argnums=donate_argnums)
    self._name = name
    self._key = key
    self._compiled: dict = {}
    self._locks: dict = {}  # Per signature: threads wanting the same program build it once.
    self._locks_lock = threading.Lock()

  def lower(self, *args):
    return self._jitted.lower(*args)

  @property
  def num_compiled(self) -> int:
    """How many signatures this program has been compiled (or loaded) for."""
    return len(self._compiled)

  def compile(self, *args):
    """The compiled program for these arguments (loaded, or compiled), without running."""
    return self._compiled_for(*jax.tree_util.tree_flatten(args), args)

  def __call__(self, *args):
    leaves, treedef = jax.tree_util.tree_flatten(args)
    if jax.config.jax_disable_jit or any(isinstance(x, jax.core.Tracer) for x in leaves):
      return self._jitted(*args)  # Inside a trace (e.g. jax.eval_shape), or run eagerly.
    return self._compiled_for(leaves, treedef, args)(*args)

  def _compiled_for(self, leaves, treedef, args):
    signature = (treedef, tuple(_leaf_signature(x) for x in leaves))
    compiled = self._compiled.get(signature)
    if compiled is None:
      with self._locks_lock:
        lock = self._locks.setdefault(signature, threading.Lock())
      with lock:
        compiled = self._compiled.get(signature)
        if compiled is None:
          compiled = self._compiled[signature] = self._load_or_compile(args, signature)
    return compiled

  def _path(self, signature) -> Optional[str]:
    folder = _executables
    if folder is None or self._key is None or _foreign_code():
      return None
    text = json.dumps({"name": self._name, "key": self._key, "environment": _environment(),
                       "tree": str(signature[0]), "leaves": [repr(s) for s in signature[1]]},
                      sort_keys=True, default=repr)
    return os.path.join(folder, hashlib.sha256(text.encode()).hexdigest() + ".executable")

  def _load_or_compile(self, args, signature):
    path = self._path(signature)
    if path is not None and os.path.exists(path):
      try:
        with open(path, "rb") as f:
          payload, in_tree, out_tree = pickle.loads(zlib.decompress(f.read()))
        compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        _events["executables_loaded"] += 1
        return compiled
      except Exception as error:  # pylint: disable=broad-except
        # A truncated or incompatible file: compile, and write it again below.
        print(f"compilation cache: could not load {path} ({type(error).__name__}: "
              f"{error}); compiling instead", file=sys.stderr)
    hits = _events["cache_hits"]
    compiled = self._jitted.lower(*args).compile(compiler_options() or None)
    # Only an executable XLA compiled here is written: one that JAX loaded from its own
    # cache serializes incompletely with jaxlib 0.10.2 (loading it later fails with
    # "Function convert_bitcast_fusion.1 not found"); such a program keeps coming from
    # JAX's cache instead.
    if path is not None and _events["cache_hits"] == hits:
      _write(path, compiled)
    return compiled


def _write(path: str, compiled) -> None:
  """Writes an executable atomically (a partly written file is never read)."""
  try:
    # Compressed: the paper model's training step is 5 MB raw, under 1 MB compressed.
    blob = zlib.compress(pickle.dumps(serialize_executable.serialize(compiled)), 1)
  except (ValueError, NotImplementedError, TypeError, pickle.PicklingError):
    return  # This program cannot be serialized (e.g. closed-over arrays): JAX's cache only.
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    io_utils.atomic_write_bytes(path, blob, durable=False)  # A lost file is compiled again.
    _events["executables_written"] += 1
  except OSError:
    pass  # A full or read-only disk costs a compile next time, not this run.


_foreign_noted = False


def _foreign_code() -> bool:
  """Whether code outside the project is registered (then the layer is off; said once)."""
  global _foreign_noted
  foreign = foreign_components()
  if foreign and not _foreign_noted:
    _foreign_noted = True
    print("compilation cache: whole executables are not reused in this process, because "
          f"code outside the project is registered: {'; '.join(foreign)}", file=sys.stderr)
  return bool(foreign)
