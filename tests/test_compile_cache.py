"""The persistent compilation cache (experiments/compile_cache.py)."""
import json
import os
import re
import subprocess
import sys

from experiments import compile_cache


def test_compilation_cache_folder_resolution():
  env = {"XDG_CACHE_HOME": "/x"}
  assert compile_cache.resolve("", env) == "/x/randomized_pe/jax"
  assert compile_cache.resolve("", {**env, compile_cache.ENV: "/y"}) == "/y"
  assert compile_cache.resolve("/z", {**env, compile_cache.ENV: "/y"}) == "/z"  # Config wins.
  assert compile_cache.resolve("off", env) is None
  assert compile_cache.resolve("", {compile_cache.ENV: "0"}) is None
  assert compile_cache.resolve("", {"HOME": "/h"}).endswith(
      os.path.join(".cache", "randomized_pe", "jax"))


def _cache_line(stdout):
  lines = [l for l in stdout.splitlines() if l.startswith("compilation cache ")]
  assert len(lines) == 1, stdout
  numbers = re.findall(r"(\d+) (?:programs loaded|compiled|written)", lines[0])
  return tuple(int(n) for n in numbers)


def test_a_second_process_with_a_warm_cache_compiles_nothing(tmp_path):
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
    out = subprocess.run([sys.executable, "-m", "experiments.train", *args,
                          f"--workdir={tmp_path / name}"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    runs.append(_cache_line(out.stdout))
  (cold_loaded, cold_compiled, cold_written), (warm_loaded, warm_compiled, warm_written) = runs
  assert cold_loaded == 0 and cold_compiled > 3 and cold_written == cold_compiled
  assert warm_compiled == 0 and warm_written == 0 and warm_loaded == cold_compiled
  # Same results either way.
  cold = json.loads((tmp_path / "cold" / "eval.json").read_text())
  warm = json.loads((tmp_path / "warm" / "eval.json").read_text())
  assert cold["accuracy"] == warm["accuracy"]
