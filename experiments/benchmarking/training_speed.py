"""Section `train`: the paper model's training speed, today's code beside a previous
commit's and the original release's, each in its own process (processes.compare_training),
with and without huge-page malloc (part `speed`); and the limit (part `limit`): FLOPs of
the compiled step, steps/s and the achieved fraction of this CPU's float32 matmul
throughput, for the paper model at fixed lengths and the CPU protocol's model."""

import contextlib
import gc
import os
import statistics
import sys
import tempfile

import jax

from configs import default
from configs import scales
from experiments.benchmarking import processes
from experiments.benchmarking import throughput
from experiments.benchmarking import timing
from experiments.training import steps


# The label of today's step with attention's core replaced by a pass-through (a bound).
BOUND = "today, attention free (bound)"


def bench_train(*, scratch: str | None, parts, encodings, max_train_length: int,
                steps: int, round_steps: int, malloc, baseline_commit: str | None,
                release_path: str | None, release_python: str | None,
                release_semantics: bool, limit_encodings, limit_lengths, limit_steps: int,
                limit_profile_steps: int, attention_free_bound: bool = False) -> dict:
  """Training speed of the paper model, today's code beside `baseline_commit` and the
  release (`release_path`, run by `release_python`, default this interpreter), with and
  without huge-page malloc (`malloc`: "on", "off"); then the limit: FLOPs of the step,
  this CPU's matmul throughput and the achieved fraction (experiments/benchmark.py's
  docstring; the arguments are its flags of the same names; attention_free_bound also
  times today's step with attention's core replaced by a pass-through, driver.py's
  `attention_free`, a bound rather than a model). `scratch`: the folder of
  the subprocesses' logs (None: a new temporary folder); `parts`: "speed", "limit"."""
  folder = scratch or tempfile.mkdtemp(prefix="randomized_pe_benchmark_")
  os.makedirs(folder, exist_ok=True)
  results = {"cpu": timing.cpu_name(), "load_start": timing.load(), "scratch": folder}
  matmul = throughput.matmul_throughput()
  results["matmul"] = matmul
  peak = matmul["gflops_best"]
  print(f"CPU: {results['cpu']}; load average {results['load_start']}; float32 jnp.dot "
        f"{throughput.MATMUL_SIZE}x{throughput.MATMUL_SIZE}: best {peak:.1f} GFLOP/s (median "
        f"{matmul['gflops_median']:.1f})\n")
  if "speed" in parts:
    results["speed"] = _train_speed(
        folder, peak, sys.executable, encodings=encodings, max_train_length=max_train_length,
        steps=steps, round_steps=round_steps, malloc=malloc, baseline_commit=baseline_commit,
        release_path=release_path, release_python=release_python,
        release_semantics=release_semantics, attention_free_bound=attention_free_bound)
  if "limit" in parts:
    results["limit"] = _train_limit(peak, limit_encodings, limit_lengths, limit_steps,
                                     limit_profile_steps, scratch)
  results["load_end"] = timing.load()
  print(f"\nload average at the end: {results['load_end']}; logs: {folder}")
  return results


def _train_speed(scratch: str, peak: float, python: str, *, encodings,
                 max_train_length: int, steps: int, round_steps: int, malloc,
                 baseline_commit: str | None, release_path: str | None,
                 release_python: str | None, release_semantics: bool,
                 attention_free_bound: bool = False) -> dict:
  malloc_modes = [{"on": True, "off": False}[m] for m in malloc]
  lengths = list(range(1, max_train_length + 1))
  out = {}
  with contextlib.ExitStack() as stack:
    participants = [{"label": "today", "kind": "ours", "root": processes.REPO, "python": python}]
    if attention_free_bound:
      participants.append({"label": BOUND, "kind": "ours", "root": processes.REPO,
                           "python": python, "stand_in": "attention_free"})
    if baseline_commit:
      path, commit = stack.enter_context(processes.baseline_worktree(baseline_commit))
      participants.append({"label": f"commit {commit}", "kind": "ours", "root": path,
                           "python": python})
      out["baseline_commit"] = commit
    if release_path:
      participants.append({"label": "release", "kind": "release", "root": release_path,
                           "python": release_python or python})
    runs = [(pe, "paper") for pe in encodings]
    if "randomized_relative" in encodings and release_semantics:
      runs.append(("randomized_relative", "release"))  # Our code, the release's computation.
    for pe, compat in runs:
      # The release (another computation) only beside our paper semantics.
      parts = [p for p in participants if compat == "paper" or p["kind"] == "ours"]
      print(f"### {pe}, compat={compat}: lengths 1..{lengths[-1]}, batch 128, {steps} "
            f"steps each in rounds of {round_steps} (load {timing.load()})\n", flush=True)
      r = processes.compare_training(parts, pe, compat, lengths, steps, round_steps, 128,
                                     malloc_modes, scratch)
      out[f"{pe}/{compat}"] = r
      _print_speed(r, peak)
  return out


def _print_speed(r: dict, peak: float) -> None:
  rows = [k for k, v in r.items() if isinstance(v, dict) and "steps_per_s" in v]
  print("| code | malloc | params | compile s (programs) | steps/s | vs today (total / "
        "median of rounds) | GFLOP/step | GFLOP/s | of the matmul's |")
  print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
  for key in rows:
    row = r[key]
    malloc = "huge pages" if row["tuned"] else "plain"
    base = f"today/{key.split('/', 1)[1]}"
    vs = "-" if base == key or base not in rows else "{:.2f}x / {:.2f}x".format(
        *_ratio(r, key, base))
    print(f"| {row['label']} | {malloc} | {row['params']:,} | {row['compile_s']:.0f} "
          f"({row['programs']}) | {row['steps_per_s']:.2f} | {vs} | "
          f"{row['flops_per_step'] / 1e9:.2f} | {row['gflops']:.1f} | "
          f"{row['gflops'] / peak:.0%} |", flush=True)
  for key in rows:
    if r[key].get("costed") == "as compiled" and r[key]["label"] != "release":
      print(f"| {key} | - | FLOPs as compiled: where its attention runs in chunks, XLA's "
            "cost analysis counts one chunk, so GFLOP/s is understated |")
  for key, row in r.items():
    if isinstance(row, dict) and "error" in row:
      print(f"| {key} | - | cannot be timed: {row['error']} |")
  for malloc in ("huge pages", "plain malloc"):
    today, release = f"today/{malloc}", f"release/{malloc}"
    if today in rows and release in rows:
      total, median = _ratio(r, release, today)
      total, median = 1 / total, 1 / median
      print(f"\ntoday / release ({malloc}): {total:.2f}x steps/s (median of rounds "
            f"{median:.2f}x; target >= 3x), compile {r[today]['compile_s']:.0f} s against "
            f"{r[release]['compile_s']:.0f} s (target: no more)")
    bound = f"{BOUND}/{malloc}"
    if bound in rows and release in rows:
      total, median = _ratio(r, release, bound)
      print(f"attention free (a bound, not a model) / release ({malloc}): "
            f"{1 / total:.2f}x steps/s (median of rounds {1 / median:.2f}x): what today's "
            "step would reach if attention cost nothing")
  print(f"\nload {r['load_before_steps']} before the timed rounds, {r['load_after_steps']} "
        "after\n")


def _ratio(results, key, base) -> tuple:
  """(total-time ratio, median of per-round ratios) of base's time to key's."""
  a, b = results[key], results[base]
  median = statistics.median(x / y for x, y in zip(b["round_seconds"], a["round_seconds"]))
  return b["seconds"] / a["seconds"], median


def paper_limit_configs(encoding: str = "randomized_relative", lengths=(20, 40)) -> list:
  """(label, config) of the programs whose achieved fraction `train` reports: the paper's
  model (configs/default.py, batch 128) at each fixed training length, and the CPU
  protocol's (configs/scales.py `apply_cpu`: lengths 1..12 in its 2 programs, batch 128)
  as one model and as its 3-seed grid."""
  out = []
  for n in lengths:
    config = default.get_config()
    config.model.pe = encoding
    config.training.min_length = config.training.max_length = n
    out.append((f"paper, length {n}", config))
  for seeds in ((0,), scales.SEEDS):
    config = scales.apply_cpu(default.get_config(), seeds=seeds)
    config.model.pe = encoding
    out.append((f"CPU protocol, lengths 1..{scales.CPU_MAX_LENGTH}, {len(seeds)} model(s)",
                config))
  return out


def _train_limit(peak: float, encodings, limit_lengths, limit_steps: int,
                 profile_steps: int, scratch: str | None) -> dict:
  out = {}
  lengths = [int(n) for n in limit_lengths]
  print(f"### the limit: FLOPs per step from XLA's cost analysis of the compiled step, "
        f"steps/s of that program ({limit_steps} model steps, after 2 warm-up steps), "
        f"against the float32 matmul's best {peak:.1f} GFLOP/s (load {timing.load()})\n")
  print("| model | encoding | programs | GFLOP per model step | compile s | model steps/s | "
        "GFLOP/s | of the matmul's |")
  print("|---|---|---:|---:|---:|---:|---:|---:|")
  for encoding in encodings:
    for label, config in paper_limit_configs(encoding, lengths):
      models = len(steps.grid_members(config))
      figures = throughput.step_figures(config, max(2, limit_steps // models),
                                        profile_steps if models == 1 else 0, scratch)
      figures["fraction_of_matmul"] = figures["gflops_achieved"] / peak
      out[f"{encoding}/{label}"] = figures
      print(f"| {label} | {encoding} | {figures['programs']} | "
            f"{figures['flops_per_model_step'] / 1e9:.2f} | {figures['compile_s']:.0f} | "
            f"{figures['model_steps_per_s']:.2f} | {figures['gflops_achieved']:.1f} | "
            f"{figures['fraction_of_matmul']:.1%} |", flush=True)
      jax.clear_caches()
      gc.collect()
  for key, figures in out.items():
    profile = figures.get("profile")
    if profile and profile.get("shares"):
      shares = ", ".join(f"{k} {v:.1%}" for k, v in profile["shares"].items())
      print(f"\nop time by category, {key}, {profile['steps']} profiled steps "
            f"({profile['total_op_ms']:.0f} ms of op time): {shares}")
  return out
