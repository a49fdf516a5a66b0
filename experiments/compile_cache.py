"""JAX's persistent compilation cache, turned on by the entry points and the test suite.

On a 2-core CPU a run of the paper's model spends minutes compiling (one program per
training length, one per evaluation bucket), and a resumed run, every job of a sweep
and every test run used to compile the same programs again. JAX can keep compiled
programs on disk (CPU programs included, with the JAX we pin) keyed by the program and
the compiler's settings, so a second process with the same programs loads them instead.
A tiny training run of two programs measured 31.5 s cold and 4.0 s warm here.

Where the cache lives, first match wins:
  1. the config setting `compilation_cache` (a folder, or "off"), when not empty;
  2. the environment variable RANDOMIZED_PE_COMPILATION_CACHE (a folder, or "off");
  3. $XDG_CACHE_HOME/randomized_pe/jax (default ~/.cache/randomized_pe/jax).
`enable` also exports the folder in RANDOMIZED_PE_COMPILATION_CACHE, so processes the
run starts (sweep workers) share it. Results do not depend on the cache; only time does.
"""
from __future__ import annotations

import collections
import os
from typing import Mapping, Optional

ENV = "RANDOMIZED_PE_COMPILATION_CACHE"
OFF = ("0", "off", "false", "no", "none")
# Programs that compile faster than this are not written. Entry points write every
# program (a run is a few dozen jitted programs); the test suite skips eager one-op
# programs, of which it compiles thousands.
MIN_COMPILE_SECONDS = 0.0

_events: collections.Counter = collections.Counter()
_listening = False
_folder: Optional[str] = None


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


def enable(setting: str = "", min_compile_seconds: float = MIN_COMPILE_SECONDS
           ) -> Optional[str]:
  """Turns the persistent cache on (or off) for this process; returns the folder or None.

  Call it before anything compiles. Raises OSError if the folder cannot be made.
  """
  global _listening, _folder
  import jax  # pylint: disable=import-outside-toplevel

  if not _listening:
    jax.monitoring.register_event_listener(_count)
    _listening = True
  folder = resolve(setting)
  _folder = folder
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
          "written": _events["cache_misses"]}


def summary() -> str:
  """One line for the end of a run."""
  s = stats()
  if s["folder"] is None:
    return "compilation cache: off"
  return (f"compilation cache {s['folder']}: {s['loaded']} programs loaded, "
          f"{s['compiled']} compiled ({s['written']} written)")
