"""Speed benchmarks (measured here, never asserted in tests).

  python -m experiments.benchmark                  # every section
  python -m experiments.benchmark --sections=tasks # one section
  python -m experiments.benchmark --sections=buckets --output=buckets.json

Sections:
  tasks: milliseconds per batch of every task at batch 128 x length 40 and
         500 x 500 (median of repeats, after one warm-up call).
  train: the paper model on reverse_string, batch 128, lengths 1..40 (part `speed`):
         today's code beside a previous commit's (--baseline_commit=REV: a temporary
         `git worktree` of REV, removed afterwards) and the original release
         (--release_path=DIR of a checkout of google-deepmind/randomized_positional_encodings,
         run by --release_python=PY; its own modules imported from DIR by a driver that
         this benchmark writes to a temporary folder, experiments/benchmark_driver.py;
         nothing of the release is in this project), each with and without huge-page
         malloc (--train_malloc=on,off), every one in its own process: compile seconds
         of one program per length (ahead of time; processes started one after another),
         then --steps steps each on the same uniformly drawn lengths, in rounds of
         --train_round that alternate between them. Ratios are to today's code with the
         same malloc (total time and median of the rounds' ratios); FLOPs per step from
         each program's cost analysis give GFLOP/s and the fraction of this CPU's float32
         matmul throughput measured at the start of the section. Part `limit`: FLOPs of
         the compiled step (XLA's cost analysis), steps/s and the achieved fraction for
         the paper model at fixed lengths (--limit_lengths=20,40) and the CPU protocol's
         model (configs/scales.py `apply_cpu`, lengths 1..12, batch 128; 1 and 3 models).
  eval:  the paper model's evaluation (randomized_relative, batch 500, its max_buckets
         and max_logits) of lengths 41..100 (--eval_lengths), today's code beside
         --baseline_commit, each in its own process, --eval_rounds alternating rounds
         (the first with a fresh evaluator: compile included), and whether the
         accuracies are identical.
  roofline: a projection (not a measurement) of the GPU-hours of the Table 1 protocol
         on V100, A100 and H100 (FP32 and TF32/FP16 peaks and memory bandwidth from the
         vendors' datasheets, GPUS) from the roofline of the paper model's programs:
         FLOPs and bytes accessed from XLA's cost analysis of the training step at
         --roofline_train_lengths and of one length's evaluation at
         --roofline_eval_lengths (other lengths: a quadratic fit), beside the paper's
         Table 2 (V100 hours per run). Not in the default sections.
  grid:  model-steps per second of a grid of 30 models (10 seeds x 3 learning
         rates, one program) against one model, at one training length.
  attention: one layer's attention (forward + backward) over the whole batch
         against cache-sized chunks (randomized_pe.attention), T = 20, 40, 80.
  buckets: training-length buckets (training.max_programs) and the persistent
         compilation cache, for the paper model on reverse_string with
         randomized_relative, lengths 1..40 (docs/benchmark.md). Parts
         (--bucket_parts): `compile`: per setting of --bucket_programs (0 = one
         program per length, and 1, 4, 8), the programs and seconds to compile
         every training program ahead of time, then steps/s over the training
         length distribution (the same steps for every setting, prefetched as
         training does, in alternating rounds) and its ratio to exact lengths;
         `cache`: a subprocess's compile phase (trainer and every training program)
         started twice with its own fresh cache folder, cold then warm; `demo`:
         the wall time of `python -m experiments.train --config=configs/demo.py`
         (or each of --demo_configs) in a fresh workdir, cold cache then warm, with
         the accuracies it reached.
         `--quick` runs it all on a tiny model to check that it works.
  ito:   Ito et al.'s Latin-square model (configs/latin_square.py:encoding=learn,
         sigma=0.2,scale=small; not in the default sections, --sections=ito): this
         CPU's float32 matmul throughput (jnp.dot of two 2048 x 2048 matrices, best of
         10) measured in the same run; then for one model and a grid of seeds in one
         program (--ito_seeds=1,3): the FLOPs of the compiled training step from XLA's
         cost analysis (`lower(...).compile().cost_analysis()`) beside an analytic count
         of its matrix products, steps/s of that program (--ito_steps model steps),
         the achieved GFLOP/s and its fraction of the matmul's, and the share of the
         step's op time by category (matmul, reduction, elementwise fusion, copy, ...)
         from a jax.profiler trace of a few steps (--ito_profile_steps; the CPU runtime
         records one event per executed HLO op, categorised from the optimized HLO).

This process never reads a persistent compilation cache (compile seconds mean
compiling); the `cache` and `demo` parts start subprocesses with their own folders
under --scratch.

Training times the training loop's own step, built by the same builder
(experiments.training.steps.build_trainer: a grid of one model, the batch split over devices
when there are several); `train` and `eval` give their subprocesses GLIBC_TUNABLES
explicitly. Like
`experiments.train`, the benchmark restarts itself with glibc's huge-page malloc
where that applies (experiments/training/runtime.py); it prints the GLIBC_TUNABLES it
ran with. RANDOMIZED_PE_MALLOC_TUNING=0 measures without it.

Prints Markdown tables; `--output=FILE.json` also writes the raw numbers.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time

from absl import app
from absl import flags

_SECTIONS = flags.DEFINE_list("sections", ["tasks", "train", "eval", "grid", "attention", "buckets"],
                              "Which benchmarks to run.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed repeats per measurement (tasks).")
_OUTPUT = flags.DEFINE_string("output", None, "Optional JSON file for the raw numbers.")
_ENCODINGS = flags.DEFINE_list(
    "encodings", ["sin_cos", "relative", "randomized_sin_cos", "randomized_relative",
                  "randomized_rope", "randomized_alibi"], "Encodings timed by `train`.")
_STEPS = flags.DEFINE_integer("steps", 200, "Timed training steps per encoding (train).")
_MAX_TRAIN_LENGTH = flags.DEFINE_integer("max_train_length", 40, "Training lengths 1..N.")
_GRID_LENGTH = flags.DEFINE_integer("grid_length", 20, "Input length of the grid benchmark.")
_BUCKET_PROGRAMS = flags.DEFINE_list(
    "bucket_programs", ["0", "1", "4", "8"],
    "training.max_programs settings timed by `buckets` (0: one program per length).")
_BUCKET_STEPS = flags.DEFINE_integer(
    "bucket_steps", 400, "Timed training steps per setting (buckets), in rounds of "
    "--bucket_round steps that alternate between the settings.")
_BUCKET_ROUND = flags.DEFINE_integer("bucket_round", 50, "Steps per setting and round (buckets).")
_BUCKET_PARTS = flags.DEFINE_list(
    "bucket_parts", ["compile", "cache", "demo"],
    "Parts of `buckets`: compile (programs, compile seconds and steps/s per setting), "
    "cache (cold vs warm second start, subprocesses), demo (the demo's wall time).")
_CACHE_PROGRAMS = flags.DEFINE_list(
    "cache_programs", ["0", "8"], "max_programs settings whose cold and warm starts "
    "`buckets` times (part cache).")
_DEMO_CONFIGS = flags.DEFINE_list(
    "demo_configs", ["configs/demo.py"], "Configs of the demo timed by `buckets` (part "
    "demo), each with its own fresh cache folder; e.g. the previous demo beside this one.")
_DEMO_ARGS = flags.DEFINE_list("demo_args", [], "Extra flags for the demo runs, e.g. "
                               "config.training.steps=500 (without the leading --).")
_SCRATCH = flags.DEFINE_string("scratch", None, "Folder for the subprocesses' caches, "
                               "workdirs and logs (default: a new temporary folder).")
_QUICK = flags.DEFINE_bool("quick", False, "A tiny model and few steps: checks that "
                           "`buckets` runs; its figures mean nothing.")
_ITO_SEEDS = flags.DEFINE_list("ito_seeds", ["1", "3"], "Grid sizes timed by `ito` "
                              "(seeds of configs/latin_square.py in one program).")
_ITO_STEPS = flags.DEFINE_integer("ito_steps", 30, "Timed model steps per grid size (ito): "
                                  "grid steps = this / models, at least 2.")
_ITO_PROFILE_STEPS = flags.DEFINE_integer("ito_profile_steps", 3, "Grid steps profiled "
                                          "for the op shares (ito; 0: no profile).")
_BASELINE_COMMIT = flags.DEFINE_string(
    "baseline_commit", None, "train: also time this commit's code (a temporary git "
    "worktree, removed afterwards) beside today's, in alternating rounds.")
_RELEASE_PATH = flags.DEFINE_string(
    "release_path", None, "train: also time the original release "
    "(google-deepmind/randomized_positional_encodings) checked out in this folder, "
    "imported from there by a driver run with --release_python.")
_RELEASE_PYTHON = flags.DEFINE_string(
    "release_python", None, "The interpreter for --release_path (default: this one); it "
    "needs the release's dependencies (jax, dm-haiku, optax, chex, numpy).")
_TRAIN_MALLOC = flags.DEFINE_list("train_malloc", ["on", "off"], "train: huge-page "
                                  "malloc settings timed (on, off), each a subprocess.")
_TRAIN_ROUND = flags.DEFINE_integer("train_round", 25, "train: steps per code version and "
                                    "round (the rounds alternate between them).")
_TRAIN_PARTS = flags.DEFINE_list("train_parts", ["speed", "limit"], "Parts of train: "
                                 "speed (the comparison), limit (FLOPs and achieved fraction).")
_RELEASE_SEMANTICS = flags.DEFINE_bool(
    "release_semantics", True, "train: also time randomized_relative with "
    "model.compat=release (our code, the release's computation).")
_LIMIT_ENCODINGS = flags.DEFINE_list("limit_encodings", ["randomized_relative"],
                                     "train, part limit: encodings measured.")
_LIMIT_LENGTHS = flags.DEFINE_list("limit_lengths", ["20", "40"], "train, part limit: "
                                   "fixed training lengths of the paper model.")
_LIMIT_STEPS = flags.DEFINE_integer("limit_steps", 20, "train, part limit: timed model "
                                    "steps per program set.")
_EVAL_LENGTHS = flags.DEFINE_list("eval_lengths", ["41", "100"], "eval: the first and "
                                   "last length evaluated (batch 500).")
_EVAL_ENCODING = flags.DEFINE_string("eval_encoding", "randomized_relative", "eval: encoding.")
_EVAL_ROUNDS = flags.DEFINE_integer("eval_rounds", 2, "eval: evaluations per code version, "
                                    "alternating; the first compiles.")
_ROOFLINE_ENCODING = flags.DEFINE_string("roofline_encoding", "randomized_relative",
                                         "roofline: the encoding costed.")
_ROOFLINE_TRAIN_LENGTHS = flags.DEFINE_list(
    "roofline_train_lengths", ["1", "8", "16", "24", "32", "40"],
    "roofline: training lengths whose step is compiled and costed (others: fitted).")
_ROOFLINE_EVAL_LENGTHS = flags.DEFINE_list(
    "roofline_eval_lengths", ["41", "100", "200", "300", "400", "500"],
    "roofline: evaluation lengths compiled and costed (others: fitted).")
_LIMIT_PROFILE_STEPS = flags.DEFINE_integer(
    "limit_profile_steps", 0, "train, part limit: steps of each one-model program "
    "profiled for the share of op time by category (0: none; e.g. --limit_lengths=10,20,40 "
    "--limit_profile_steps=3 for issue 27's item 3).")
_CACHE_CHILD = flags.DEFINE_integer("cache_child", None, "Internal: compile the training "
                                    "programs of this max_programs and print the times.")


# The release's numbers on the same 2-core CPU (measured when issue 3 was worked on),
# in ms per batch at 128 x 40 and 500 x 500.
RELEASE_TASK_MS = {
    "stack_manipulation": (24.5, 705), "modular_arithmetic_brackets": (8.8, 385),
    "solve_equation": (10.3, 379), "binary_addition": (3.8, 150),
    "binary_multiplication": (3.9, 154), "compute_sqrt": (3.0, 119),
}
TASK_SHAPES = ((128, 40), (500, 500))


def _median_ms(fn, repeats):
  fn(0)  # Warm-up.
  times = []
  for i in range(repeats):
    start = time.perf_counter()
    fn(i + 1)
    times.append((time.perf_counter() - start) * 1000)
  return statistics.median(times)


def bench_tasks(repeats: int) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  import tasks  # pylint: disable=import-outside-toplevel

  # Keys are made up front so that the timing is the task's generation alone.
  keys = [np.asarray(jax.random.PRNGKey(i)) for i in range(repeats + 1)]
  results = {}
  print("| task | ms at 128 x 40 | ms at 500 x 500 | release (128x40 / 500x500) |")
  print("|---|---:|---:|---|")
  for name in tasks.NAMES:
    task = tasks.get(name)
    row = []
    for batch_size, length in TASK_SHAPES:
      reps = repeats if batch_size * length <= 128 * 40 else max(3, repeats // 4)
      row.append(_median_ms(lambda i: task.sample_batch(keys[i], batch_size, length), reps))
    results[name] = row
    release = RELEASE_TASK_MS.get(name)
    release = f"{release[0]} / {release[1]}" if release else "< 1 / < 14"
    print(f"| {name} | {row[0]:.2f} | {row[1]:.1f} | {release} |", flush=True)
  worst = [max(r[0] for r in results.values()), max(r[1] for r in results.values())]
  print(f"\nslowest task: {worst[0]:.2f} ms at 128 x 40 (target <= 2), "
        f"{worst[1]:.1f} ms at 500 x 500 (target <= 50)")
  return results


# --- train: today's code beside a previous commit and the release, alternating rounds ------

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmark_driver.py")


def malloc_environment(tuned: bool, environ=None) -> dict | None:
  """The environment of a timed subprocess with glibc's huge-page malloc on (`tuned`) or
  off (experiments/training/runtime.py); None when it does not apply on this machine. The
  subprocesses get it explicitly (GLIBC_TUNABLES), whatever this process runs with."""
  from experiments.training import runtime  # pylint: disable=import-outside-toplevel
  env = dict(os.environ if environ is None else environ)
  items = [i for i in env.get("GLIBC_TUNABLES", "").split(":")
           if i and i.split("=", 1)[0] != runtime.TUNABLE]
  env.pop("GLIBC_TUNABLES", None)
  if items:
    env["GLIBC_TUNABLES"] = ":".join(items)
  env.pop(runtime.OPT_OUT, None)
  env["JAX_ENABLE_COMPILATION_CACHE"] = "false"  # Compile seconds mean compiling.
  if tuned:
    return runtime.tuned_environment_here(env)
  env[runtime.OPT_OUT] = "0"
  return env


class baseline_worktree:  # pylint: disable=invalid-name
  """A temporary `git worktree` of `rev` (detached): `with baseline_worktree(rev) as
  (path, commit):`; removed (and pruned) on exit."""

  def __init__(self, rev: str, repo: str = _REPO):
    self.rev, self.repo = rev, repo

  def __enter__(self):
    import subprocess  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel
    self.folder = tempfile.mkdtemp(prefix="randomized_pe_baseline_")
    self.path = os.path.join(self.folder, "tree")
    done = subprocess.run(["git", "-C", self.repo, "worktree", "add", "--detach", self.path,
                           self.rev], capture_output=True, text=True, check=False)
    if done.returncode != 0:
      os.rmdir(self.folder)
      raise ValueError(f"--baseline_commit={self.rev}: git worktree add failed: "
                       f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    commit = subprocess.run(["git", "-C", self.path, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    return self.path, commit

  def __exit__(self, *exc):
    import shutil  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    subprocess.run(["git", "-C", self.repo, "worktree", "remove", "--force", self.path],
                   capture_output=True, check=False)
    subprocess.run(["git", "-C", self.repo, "worktree", "prune"], capture_output=True,
                   check=False)
    shutil.rmtree(self.folder, ignore_errors=True)
    return False


class TrainWorker:
  """One code version's training step in its own process (experiments/benchmark_driver.py,
  copied to `scratch` and run there so that it imports the code under test from `root`
  only): compiles one program per length, then times rounds of steps on request."""

  def __init__(self, label: str, python: str, spec: dict, env: dict, scratch: str):
    import shutil  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    self.label, self.ready, self.error = label, None, None
    driver = os.path.join(scratch, "train_driver.py")
    if not os.path.exists(driver):
      shutil.copy(_DRIVER, driver)
    safe = "".join(c if c.isalnum() else "_" for c in label)
    self.log_path = os.path.join(scratch, f"train_{safe}.log")
    self._log = open(self.log_path, "w")  # pylint: disable=consider-using-with
    try:
      self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
          [python, driver, json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
          stderr=self._log, text=True, env=env, cwd=scratch)
    except OSError as error:
      self.proc, self.error = None, f"cannot start {python}: {error}"

  def _read(self, tag: str) -> dict | None:
    for line in self.proc.stdout:
      if line.startswith("ERROR "):
        self.error = json.loads(line[6:])["error"]
        return None
      if line.startswith(tag + " "):
        return json.loads(line[len(tag) + 1:])
    self.proc.wait()
    self.error = f"exited with {self.proc.returncode} (log: {self.log_path})"
    return None

  def wait_ready(self) -> dict | None:
    """Compile figures (READY), or None with `error` set."""
    if self.proc is not None:
      self.ready = self._read("READY")
    return self.ready

  def run(self, lengths, seed: int) -> float:
    """Seconds of the steps at these lengths (their batches made before timing)."""
    self.proc.stdin.write(json.dumps({"lengths": [int(n) for n in lengths], "seed": seed})
                          + "\n")
    self.proc.stdin.flush()
    done = self._read("DONE")
    if done is None:
      raise RuntimeError(f"{self.label}: {self.error}")
    return done["seconds"]

  def close(self):
    if self.proc is not None and self.proc.poll() is None:
      self.proc.stdin.close()
      try:
        self.proc.wait(timeout=60)
      except Exception:  # pylint: disable=broad-except
        self.proc.kill()
        self.proc.wait()
    self._log.close()


def compare_training(participants, pe: str, compat: str, lengths, steps: int,
                     round_steps: int, batch: int, malloc_modes, scratch: str,
                     max_position: int = 2048, seed: int = 0, echo=print,
                     model: dict | None = None) -> dict:
  """Steps/s of each participant's training step (`participants`: dicts with label, kind
  "ours" or "release", root, python) under each malloc mode (True: huge pages), in
  subprocesses started one after the other (so compiles do not overlap), then timed in
  rounds of `round_steps` steps that alternate between them (the order rotating), every
  one on the same lengths, drawn uniformly from `lengths` with `seed`. `model`: overrides
  of the model config (tests: a tiny model).

  Returns {label/malloc: {"params", "compile_s", "programs", "steps_per_s",
  "round_seconds", "gflops" (from the programs' cost analysis), "flops_per_step", ...}
  or {"error": ...}, "lengths": ..., "steps": ...}.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  lengths = [int(n) for n in lengths]
  workers, results = [], {}
  spec = {"pe": pe, "compat": compat, "batch": batch, "lengths": lengths,
          "max_position": max_position, "model": model or {}}
  try:
    for part in participants:
      for tuned in malloc_modes:
        key = f"{part['label']}/{'huge pages' if tuned else 'plain malloc'}"
        env = malloc_environment(tuned)
        if env is None:
          results[key] = {"error": "huge-page malloc does not apply on this machine"}
          continue
        worker = TrainWorker(key, part["python"], {**spec, "kind": part["kind"],
                                                   "root": part["root"]}, env, scratch)
        ready = worker.wait_ready()
        if ready is None:
          results[key] = {"error": worker.error}
          echo(f"{key}: cannot be timed: {worker.error}")
          worker.close()
          continue
        workers.append(worker)
        results[key] = {**ready, "round_seconds": [], "seconds": 0.0, "flops_done": 0.0,
                        "tuned": tuned, "label": part["label"], "load_compiled": _load()}
    draw = np.random.default_rng(seed).integers(min(lengths), max(lengths) + 1, steps)
    draw = [int(n) if n in lengths else lengths[0] for n in draw]
    results["load_before_steps"] = _load()
    for r, first in enumerate(range(0, steps, round_steps)):
      chunk = draw[first:first + round_steps]
      order = workers[r % max(1, len(workers)):] + workers[:r % max(1, len(workers))]
      for worker in order:
        row = results[worker.label]
        seconds = worker.run(chunk, r)
        row["round_seconds"].append(seconds)
        row["seconds"] += seconds
        row["flops_done"] += sum(float(row["flops"][str(n)]) for n in chunk)
    results["load_after_steps"] = _load()
  finally:
    for worker in workers:
      worker.close()
  for worker in workers:
    row = results[worker.label]
    row["steps_per_s"] = steps / row["seconds"]
    row["gflops"] = row["flops_done"] / row["seconds"] / 1e9
    row["flops_per_step"] = row["flops_done"] / steps
  results["lengths"], results["steps"], results["round_steps"] = lengths, steps, round_steps
  return results


def _ratio(results, key, base) -> tuple:
  """(total-time ratio, median of per-round ratios) of base's time to key's."""
  a, b = results[key], results[base]
  median = statistics.median(x / y for x, y in zip(b["round_seconds"], a["round_seconds"]))
  return b["seconds"] / a["seconds"], median


def bench_train(repeats: int) -> dict:
  """Training speed of the paper model, today's code beside --baseline_commit and the
  release (--release_path), with and without huge-page malloc; then the limit: FLOPs of
  the step, this CPU's matmul throughput and the achieved fraction (module docstring)."""
  del repeats
  import sys  # pylint: disable=import-outside-toplevel
  import tempfile  # pylint: disable=import-outside-toplevel

  scratch = _SCRATCH.value or tempfile.mkdtemp(prefix="randomized_pe_benchmark_")
  os.makedirs(scratch, exist_ok=True)
  results = {"cpu": cpu_name(), "load_start": _load(), "scratch": scratch}
  matmul = matmul_throughput()
  results["matmul"] = matmul
  peak = matmul["gflops_best"]
  print(f"CPU: {results['cpu']}; load average {results['load_start']}; float32 jnp.dot "
        f"{MATMUL_SIZE}x{MATMUL_SIZE}: best {peak:.1f} GFLOP/s (median "
        f"{matmul['gflops_median']:.1f})\n")
  if "speed" in _TRAIN_PARTS.value:
    results["speed"] = _train_speed(scratch, peak, sys.executable)
  if "limit" in _TRAIN_PARTS.value:
    results["limit"] = _train_limit(peak)
  results["load_end"] = _load()
  print(f"\nload average at the end: {results['load_end']}; logs: {scratch}")
  return results


def _train_speed(scratch: str, peak: float, python: str) -> dict:
  import contextlib  # pylint: disable=import-outside-toplevel
  malloc_modes = [{"on": True, "off": False}[m] for m in _TRAIN_MALLOC.value]
  lengths = list(range(1, _MAX_TRAIN_LENGTH.value + 1))
  out = {}
  with contextlib.ExitStack() as stack:
    participants = [{"label": "today", "kind": "ours", "root": _REPO, "python": python}]
    if _BASELINE_COMMIT.value:
      path, commit = stack.enter_context(baseline_worktree(_BASELINE_COMMIT.value))
      participants.append({"label": f"commit {commit}", "kind": "ours", "root": path,
                           "python": python})
      out["baseline_commit"] = commit
    if _RELEASE_PATH.value:
      participants.append({"label": "release", "kind": "release",
                           "root": _RELEASE_PATH.value,
                           "python": _RELEASE_PYTHON.value or python})
    runs = [(pe, "paper") for pe in _ENCODINGS.value]
    if "randomized_relative" in _ENCODINGS.value and _RELEASE_SEMANTICS.value:
      runs.append(("randomized_relative", "release"))  # Our code, the release's computation.
    for pe, compat in runs:
      # The release (another computation) only beside our paper semantics.
      parts = [p for p in participants if compat == "paper" or p["kind"] == "ours"]
      print(f"### {pe}, compat={compat}: lengths 1..{lengths[-1]}, batch 128, {_STEPS.value} "
            f"steps each in rounds of {_TRAIN_ROUND.value} (load {_load()})\n", flush=True)
      r = compare_training(parts, pe, compat, lengths, _STEPS.value, _TRAIN_ROUND.value, 128,
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
  print(f"\nload {r['load_before_steps']} before the timed rounds, {r['load_after_steps']} "
        "after\n")


def cpu_name() -> str:
  """lscpu's model name (or platform.processor()) and the logical CPUs."""
  import platform  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  name = ""
  try:
    text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    name = next((l.split(":", 1)[1].strip() for l in text.splitlines()
                 if l.startswith("Model name")), "")
  except OSError:
    pass
  return f"{name or platform.processor() or 'unknown CPU'}, {os.cpu_count()} logical CPUs"


def paper_limit_configs(encoding: str = "randomized_relative", lengths=(20, 40)) -> list:
  """(label, config) of the programs whose achieved fraction `train` reports: the paper's
  model (configs/default.py, batch 128) at each fixed training length, and the CPU
  protocol's (configs/scales.py `apply_cpu`: lengths 1..12 in its 2 programs, batch 128)
  as one model and as its 3-seed grid."""
  from configs import default  # pylint: disable=import-outside-toplevel
  from configs import scales  # pylint: disable=import-outside-toplevel
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


def _train_limit(peak: float) -> dict:
  import jax  # pylint: disable=import-outside-toplevel

  from experiments.training import steps  # pylint: disable=import-outside-toplevel
  out = {}
  lengths = [int(n) for n in _LIMIT_LENGTHS.value]
  print(f"### the limit: FLOPs per step from XLA's cost analysis of the compiled step, "
        f"steps/s of that program ({_LIMIT_STEPS.value} model steps, after 2 warm-up steps), "
        f"against the float32 matmul's best {peak:.1f} GFLOP/s (load {_load()})\n")
  print("| model | encoding | programs | GFLOP per model step | compile s | model steps/s | "
        "GFLOP/s | of the matmul's |")
  print("|---|---|---:|---:|---:|---:|---:|---:|")
  for encoding in _LIMIT_ENCODINGS.value:
    for label, config in paper_limit_configs(encoding, lengths):
      models = len(steps.grid_members(config))
      figures = step_figures(config, max(2, _LIMIT_STEPS.value // models),
                             _LIMIT_PROFILE_STEPS.value if models == 1 else 0, _SCRATCH.value)
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

def bench_grid(repeats: int) -> dict:
  """Model-steps per second of a 10-seed x 3-rate grid against one model (one length)."""
  del repeats
  import jax  # pylint: disable=import-outside-toplevel

  import tasks  # pylint: disable=import-outside-toplevel
  from configs import default  # pylint: disable=import-outside-toplevel
  from experiments.training import data  # pylint: disable=import-outside-toplevel
  from experiments.training import steps  # pylint: disable=import-outside-toplevel

  task = tasks.get("reverse_string")
  length = _GRID_LENGTH.value
  results = {"device": jax.devices()[0].device_kind, "length": length}
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; reverse_string, "
        f"batch 128, length {length} (sequence {2 * length}), randomized_relative\n")
  print("| models | steps/s | model-steps/s | vs one model |")
  print("|---:|---:|---:|---:|")
  base = None
  for seeds, rates in [((0,), (1e-4,)), (tuple(range(10)), (1e-4, 3e-4, 5e-4))]:
    config = default.get_config()
    config.model.pe = "randomized_relative"
    config.grid.seeds, config.grid.learning_rates = seeds, rates
    trainer = steps.build_trainer(config, task, jax.devices()[:1])
    state, member_seeds, step, members = (trainer.state, trainer.seeds, trainer.step,
                                          trainer.members)
    batch = data.make_batch(task, jax.random.PRNGKey(0), 128, length)
    state, _ = step(state, member_seeds, batch)  # Compile.
    jax.block_until_ready(state)
    timed = max(2, _STEPS.value // len(members))
    start = time.perf_counter()
    for _ in range(timed):
      state, _ = step(state, member_seeds, batch)
    jax.block_until_ready(state)
    rate = timed / (time.perf_counter() - start)
    model_rate = rate * len(members)
    base = base or model_rate
    results[len(members)] = {"steps_per_s": rate, "model_steps_per_s": model_rate}
    print(f"| {len(members)} | {rate:.3f} | {model_rate:.2f} | {model_rate / base:.2f}x |",
          flush=True)
  return results


def bench_attention(repeats: int) -> dict:
  """Attention forward + backward of one layer of the paper model: whole batch vs chunks."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from randomized_pe import attention  # pylint: disable=import-outside-toplevel
  from randomized_pe import encodings  # pylint: disable=import-outside-toplevel
  from randomized_pe import samplers  # pylint: disable=import-outside-toplevel

  batch, heads, head_size = 128, 8, 8
  results = {}
  print("batch 128, 8 heads of 8; ms per forward + backward (median); one device\n")
  print("| T | scores | whole batch | chunks (rows) | speed-up |")
  print("|---:|---|---:|---:|---:|")
  for length in (20, 40, 80):
    keys = jax.random.split(jax.random.PRNGKey(length), 5)
    q, k, v, cot = (jax.random.normal(keys[i], (batch, length, heads, head_size), jnp.float32)
                    for i in range(4))
    kernel = jax.random.normal(keys[4], (heads * head_size, heads, head_size)) * 0.1
    pos = samplers.randomized(jax.random.PRNGKey(0), length, 2048)

    def relative(kernel):
      table = encodings.relative_key_table(pos, kernel)
      return lambda cq, ck: attention.dot_scores(cq, ck) + encodings.relative_logits_from_table(
          cq * (1.0 / head_size**0.5), table)

    rows = attention.default_chunk_rows(batch, heads, length, length, backend="cpu")
    for name, scorer in (("dot", lambda kernel: attention.dot_scores), ("relative", relative)):
      times = []
      for chunk in ((batch, rows) if rows < batch else (batch,)):
        def loss(q, k, v, w, chunk=chunk, scorer=scorer):
          out = attention.attention(q, k, v, scorer(w), chunk_rows=chunk)
          return jnp.vdot(out, cot)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
        times.append(_median_ms(lambda i, g=grad: jax.block_until_ready(g(q, k, v, kernel)),
                                repeats))
      results[f"{name}/{length}"] = {"whole_ms": times[0], "chunked_ms": times[-1], "rows": rows}
      if rows >= batch:  # The logits fit: the default runs the whole batch at once.
        print(f"| {length} | {name} | {times[0]:.1f} | one piece | - |", flush=True)
        continue
      print(f"| {length} | {name} | {times[0]:.1f} | {times[1]:.1f} ({rows}) | "
            f"{times[0] / times[1]:.2f}x |", flush=True)
  return results


# --- buckets: training-length buckets, the persistent compilation cache, the demo ---------


def _load() -> str:
  """The 1, 5 and 15 minute load averages (the machine is shared; read figures beside it)."""
  return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _bucket_config(max_programs: int):
  """The paper's config (configs/default.py) on reverse_string, randomized_relative,
  training lengths 1..--max_train_length, with `training.max_programs = max_programs`."""
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.task = "reverse_string"
  config.model.pe = "randomized_relative"
  config.training.max_length = _MAX_TRAIN_LENGTH.value
  config.training.max_programs = max_programs
  if _QUICK.value:  # Checks the code path only.
    config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 16, 2
    config.training.batch_size = 8
  return config


def _program_batches(task, config) -> dict:
  """One host batch per training program of `config`: {(tokens shape, targets shape): batch}.

  Exact lengths (max_programs 0): one per length; buckets: one per bucket shape
  (experiments.training.data.training_shapes), built as training builds them.
  """
  from experiments.training import data  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  t = config.training
  shapes = data.training_shapes(task, config)
  batches = {}
  for n in range(t.min_length, t.max_length + 1):
    batch = data.make_batch(task, jax.random.PRNGKey(n), t.batch_size, n)
    if shapes is not None:
      batch = data.pad_batch(task, batch, *shapes[n], t.batch_size)
    batches.setdefault(_shape_key(batch), batch)
  return batches


def _shape_key(batch) -> tuple:
  return batch["tokens"].shape, batch["targets"].shape


def _compile_programs(trainer, batches) -> tuple[dict, float]:
  """Lowers and compiles the step for every batch shape; (programs, seconds)."""
  start = time.perf_counter()
  compiled = {key: trainer.step.compile(trainer.state, trainer.seeds, trainer.place(batch))
              for key, batch in batches.items()}
  return compiled, time.perf_counter() - start


def _bucket_compile_and_speed(task) -> dict:
  """Programs, compile seconds and steps/s per max_programs setting (one process)."""
  import jax  # pylint: disable=import-outside-toplevel

  from experiments.training import data  # pylint: disable=import-outside-toplevel
  from experiments.training import steps  # pylint: disable=import-outside-toplevel

  settings = [int(v) for v in _BUCKET_PROGRAMS.value]
  runs = {}
  print(f"compile (load {_load()}):\n")
  print("| max_programs | programs | token sizes | compile s | s per program |")
  print("|---:|---:|---|---:|---:|")
  for mp in settings:
    config = _bucket_config(mp)
    trainer = steps.build_trainer(config, task)
    batches = _program_batches(task, config)
    compiled, seconds = _compile_programs(trainer, batches)
    sizes = sorted(key[0][1] for key in batches)
    runs[mp] = {"config": config, "trainer": trainer, "compiled": compiled,
                "shapes": data.training_shapes(task, config), "batches": batches,
                "state": trainer.state, "time": 0.0, "round_times": []}
    trainer.state = None  # The timing loop owns (and donates) the state.
    size_text = (f"{sizes[0]}..{sizes[-1]} (every length)" if mp <= 0
                 else ", ".join(str(x) for x in sizes))
    print(f"| {mp or 'exact'} | {len(compiled)} | {size_text} | {seconds:.1f} | "
          f"{seconds / len(compiled):.2f} |", flush=True)
    runs[mp].update(programs=len(compiled), compile_s=seconds, token_sizes=sizes)
  # A program's first execution is slower on CPU: run each once before timing.
  for run in runs.values():
    for key, batch in run["batches"].items():
      run["state"], _ = run["compiled"][key](run["state"], run["trainer"].seeds,
                                              run["trainer"].place(batch))
    jax.block_until_ready(run["state"])
  # Steady state over the training length distribution: the same steps (so the same
  # lengths) for every setting, drawn and prefetched as the training loop draws them, in
  # rounds that alternate between the settings so that a change of the machine's load
  # falls on all of them alike.
  total, chunk = _BUCKET_STEPS.value, max(1, min(_BUCKET_ROUND.value, _BUCKET_STEPS.value))
  load_before = _load()
  for r, first in enumerate(range(0, total, chunk)):
    last = min(total, first + chunk)
    order = settings[r % len(settings):] + settings[:r % len(settings)]
    for mp in order:
      run = runs[mp]
      config, shapes, trainer = run["config"], run["shapes"], run["trainer"]
      prefetch = data.Prefetcher(
          lambda s, c=config, sh=shapes: data.data_for_step(task, c, s, sh), first, last,
          depth=config.training.prefetch, place=trainer.place)
      start = time.perf_counter()
      state = run["state"]
      for _ in range(first, last):
        batch = prefetch.next()
        state, _ = run["compiled"][_shape_key(batch)](state, trainer.seeds, batch)
      jax.block_until_ready(state)
      elapsed = time.perf_counter() - start
      prefetch.close()
      run["state"] = state
      run["time"] += elapsed
      run["round_times"].append(elapsed)
  exact = runs.get(0)
  print(f"\nsteps/s over lengths 1..{_MAX_TRAIN_LENGTH.value} ({total} steps per setting in "
        f"rounds of {chunk}; load {load_before} before, {_load()} after):\n")
  print("| max_programs | programs | compile s | steps/s | vs exact (total) | "
        "vs exact (median of rounds) |")
  print("|---:|---:|---:|---:|---:|---:|")
  results = {}
  for mp in settings:
    run = runs[mp]
    rate = total / run["time"]
    row = {"programs": run["programs"], "compile_s": run["compile_s"],
           "token_sizes": run["token_sizes"], "steps_per_s": rate,
           "round_seconds": run["round_times"]}
    ratio_text = median_text = "-"
    if exact is not None:
      row["vs_exact"] = exact["time"] / run["time"]
      row["vs_exact_median_round"] = statistics.median(
          e / b for e, b in zip(exact["round_times"], run["round_times"]))
      row["compile_vs_exact"] = run["compile_s"] / exact["compile_s"]
      ratio_text = f"{row['vs_exact']:.3f}"
      median_text = f"{row['vs_exact_median_round']:.3f}"
    results[str(mp)] = row
    print(f"| {mp or 'exact'} | {run['programs']} | {run['compile_s']:.1f} | {rate:.2f} | "
          f"{ratio_text} | {median_text} |", flush=True)
  results["steps"], results["round"] = total, chunk
  results["load_before_steps"], results["load_after_steps"] = load_before, _load()
  del runs, exact
  jax.clear_caches()
  gc.collect()
  return results


def _cache_child(max_programs: int) -> None:
  """A process's compile phase for one setting, with the persistent cache of the
  environment (RANDOMIZED_PE_COMPILATION_CACHE): the trainer (its init program) and every
  training program. Prints one JSON line."""
  start = time.perf_counter()
  from experiments.training import compile_cache  # pylint: disable=import-outside-toplevel
  compile_cache.enable("")
  import tasks  # pylint: disable=import-outside-toplevel
  from experiments.training import steps  # pylint: disable=import-outside-toplevel
  task = tasks.get("reverse_string")
  config = _bucket_config(max_programs)
  compile_start = time.perf_counter()
  trainer = steps.build_trainer(config, task)
  batches = _program_batches(task, config)
  compiled, _ = _compile_programs(trainer, batches)
  end = time.perf_counter()
  print("CACHE_CHILD " + json.dumps({
      "compile_phase_s": end - compile_start, "imports_s": compile_start - start,
      "programs": len(compiled), **compile_cache.stats()}), flush=True)


def _child_flags() -> list:
  return [f"--max_train_length={_MAX_TRAIN_LENGTH.value}"] + (["--quick"] if _QUICK.value
                                                              else [])


def _run(command, env, log_path, timeout=3600) -> tuple:
  """Runs `command` (stdout and stderr to log_path); (wall seconds, stdout text)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  start = time.perf_counter()
  with open(log_path, "w") as log:
    done = subprocess.run([sys.executable, *command], env=env, stdout=log,
                          stderr=subprocess.STDOUT, timeout=timeout, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  wall = time.perf_counter() - start
  with open(log_path) as log:
    text = log.read()
  if done.returncode != 0:
    raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}; see {log_path}:\n"
                       + text[-2000:])
  return wall, text


def _bucket_cache(scratch: str) -> dict:
  """Cold start vs warm start (the same config again) of each --cache_programs setting,
  each setting with its own fresh cache folder, in subprocesses."""
  from experiments.training import compile_cache  # pylint: disable=import-outside-toplevel
  results = {}
  print("\nthe same config started twice, its own fresh cache folder (subprocesses; the "
        "compile phase: trainer and every training program):\n")
  print("| max_programs | programs | cold compile s | warm compile s | warm / cold | "
        "warm: executables loaded / programs loaded / compiled | process wall cold / warm | "
        "load |")
  print("|---:|---:|---:|---:|---:|---|---|---|")
  for mp in (int(v) for v in _CACHE_PROGRAMS.value):
    folder = os.path.join(scratch, f"cache_programs{mp}")
    env = {**os.environ, compile_cache.ENV: folder}
    starts = []
    for name in ("cold", "warm"):
      wall, text = _run(["-m", "experiments.benchmark", f"--cache_child={mp}",
                         *_child_flags()], env,
                        os.path.join(scratch, f"cache_programs{mp}_{name}.log"))
      line = [l for l in text.splitlines() if l.startswith("CACHE_CHILD ")][-1]
      starts.append({**json.loads(line[len("CACHE_CHILD "):]), "wall_s": wall})
    cold, warm = starts
    ratio = warm["compile_phase_s"] / cold["compile_phase_s"]
    results[str(mp)] = {"cold": cold, "warm": warm, "warm_vs_cold": ratio, "load": _load()}
    print(f"| {mp or 'exact'} | {cold['programs']} | {cold['compile_phase_s']:.1f} | "
          f"{warm['compile_phase_s']:.1f} | {ratio:.3f} | "
          f"{warm.get('executables_loaded', 0)} / {warm['loaded']} / {warm['compiled']} | "
          f"{cold['wall_s']:.0f} / {warm['wall_s']:.0f} | {_load()} |",
          flush=True)
  return results


def _demo_scores(workdir: str) -> dict:
  with open(os.path.join(workdir, "eval.json")) as f:
    record = json.load(f)
  return {"training_lengths": record["training_lengths"], **record["scores"],
          "step": record["step"]}


def _bucket_demo(scratch: str) -> dict:
  """`python -m experiments.train --config=<demo>` in a fresh workdir with a fresh cache
  folder (cold), then again in another fresh workdir with that folder (warm), for each
  of --demo_configs."""
  from experiments.training import compile_cache  # pylint: disable=import-outside-toplevel
  extra = [f"--{a}" for a in _DEMO_ARGS.value]
  if _QUICK.value:
    extra += ["--config.training.steps=20", "--config.evaluation.max_length=12"]
  results = {}
  print(f"\n`python -m experiments.train --config=CONFIG {' '.join(extra)}` in a fresh "
        "workdir; wall seconds of the whole process, cold cache then warm:\n")
  print("| config | cache | wall s | training lengths | unseen lengths | programs | load |")
  print("|---|---|---:|---:|---:|---|---|")
  for i, config in enumerate(_DEMO_CONFIGS.value):
    folder = os.path.join(scratch, f"cache_demo{i}")
    env = {**os.environ, compile_cache.ENV: folder}
    results[config] = {"args": extra}
    for name in ("cold", "warm"):
      workdir = os.path.join(scratch, f"demo{i}_{name}")
      wall, text = _run(["-m", "experiments.train", f"--config={config}",
                         f"--workdir={workdir}", *extra], env,
                        os.path.join(scratch, f"demo{i}_{name}.log"))
      scores = _demo_scores(workdir)
      cache_line = [l for l in text.splitlines() if l.startswith("compilation cache")]
      cache_line = cache_line[-1].split(": ", 1)[-1] if cache_line else "-"
      results[config][name] = {"wall_s": wall, **scores, "cache": cache_line,
                               "load": _load()}
      unseen = "-" if scores["unseen"] is None else f"{100 * scores['unseen']:.1f}%"
      print(f"| {config} | {name} | {wall:.1f} | {100 * scores['train_range']:.1f}% | "
            f"{unseen} | {cache_line} | {_load()} |", flush=True)
  return results


def bench_buckets(repeats: int) -> dict:
  """Training-length buckets, the persistent cache and the demo (module docstring)."""
  del repeats
  import tempfile  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  import tasks  # pylint: disable=import-outside-toplevel

  task = tasks.get("reverse_string")
  config = _bucket_config(0)
  m, t = config.model, config.training
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; reverse_string, "
        f"{m.pe}, {m.num_layers} layers, d_model {m.d_model}, batch {t.batch_size}, "
        f"training lengths {t.min_length}..{t.max_length}{' (--quick)' if _QUICK.value else ''}"
        f"\n")
  scratch = _SCRATCH.value or tempfile.mkdtemp(prefix="randomized_pe_benchmark_")
  os.makedirs(scratch, exist_ok=True)
  results = {"device": jax.devices()[0].device_kind, "quick": _QUICK.value,
             "scratch": scratch, "load_start": _load()}
  unknown = set(_BUCKET_PARTS.value) - {"compile", "cache", "demo"}
  if unknown:
    raise app.UsageError(f"unknown --bucket_parts {sorted(unknown)}")
  if "compile" in _BUCKET_PARTS.value:
    results["settings"] = _bucket_compile_and_speed(task)
  if "cache" in _BUCKET_PARTS.value:
    results["cache"] = _bucket_cache(scratch)
  if "demo" in _BUCKET_PARTS.value:
    results["demo"] = _bucket_demo(scratch)
  results["load_end"] = _load()
  print(f"\nsubprocess logs, caches and workdirs: {scratch}")
  return results



# --------------------------------------------------------------------------
# ito: Ito et al.'s Latin-square model, FLOPs and achieved throughput (issue 26, item 1).

ITO_CONFIG = "encoding=learn,sigma=0.2,scale=small"
MATMUL_SIZE = 2048


def matmul_throughput(size: int = MATMUL_SIZE, repeats: int = 10) -> dict:
  """This CPU's float32 jnp.dot of two size x size matrices: the best of `repeats`
  timed calls after a warm-up (2 size^3 FLOPs each)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  keys = jax.random.split(jax.random.PRNGKey(0))
  a = jax.random.normal(keys[0], (size, size), jnp.float32)
  b = jax.random.normal(keys[1], (size, size), jnp.float32)
  dot = jax.jit(jnp.dot)
  dot(a, b).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    dot(a, b).block_until_ready()
    times.append(time.perf_counter() - start)
  flops = 2.0 * size ** 3
  return {"size": size, "repeats": repeats, "best_s": min(times),
          "median_s": statistics.median(times), "gflops_best": flops / min(times) / 1e9,
          "gflops_median": flops / statistics.median(times) / 1e9}


def ito_matmul_flops(config) -> float:
  """The analytic FLOPs of the matrix products of one training step of one model of
  Ito's Transformer (randomized_pe/models/ito.py), 2 m n k per product: forward per
  token the embedding (vocabulary 6 x d), per block the q, k, v and output projections
  (4 d^2), the scores and the weighted values (2 T d) and the MLP (2 d m), and the
  read-out on every cell (d x 4 classes); the backward pass twice the forward (the
  gradients of the inputs and of the weights), less the input gradient of the embedding.
  Elementwise work (GELU, LayerNorm, softmax, Adam) is not counted."""
  m = config.model
  d, mlp, layers = m.d_model, m.mlp_size, m.num_layers
  tokens = config.training.batch_size * 16
  cells = 16
  embed = 2 * 6 * d
  block = 2 * (4 * d * d + 2 * cells * d + 2 * d * mlp)
  readout = 2 * d * 4
  forward = tokens * (embed + layers * block + readout)
  return float(3 * forward - tokens * embed)


def _hlo_categories(hlo_text: str) -> dict:
  """{instruction name: category} for the instructions of an optimized HLO module:
  "matmul" (a dot or convolution, or a fusion or custom call holding one),
  "reduction" (a fusion with a reduce), "elementwise/other fusion", "copy/transpose",
  "control" (while, call, conditional: their bodies' ops are counted instead), or the
  opcode."""
  import re  # pylint: disable=import-outside-toplevel

  line_re = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\S.*?\s([a-z][\w\-]*)\(")
  computations, current = {}, None
  instructions = {}
  for line in hlo_text.splitlines():
    header = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
    if header and "=" not in line.split("{")[0]:
      current = header.group(1)
      computations[current] = set()
      continue
    found = line_re.match(line)
    if not found or current is None:
      continue
    name, opcode = found.groups()
    computations[current].add(opcode)
    calls = re.findall(r"calls=%?([\w.\-]+)", line)
    target = re.search(r'custom_call_target="([^"]+)"', line)
    instructions[name] = (opcode, calls, target.group(1) if target else "")

  def inner(computation, seen=()):
    ops = set(computations.get(computation, ()))
    return ops

  out = {}
  for name, (opcode, calls, target) in instructions.items():
    ops = set()
    for c in calls:
      ops |= inner(c)
    if opcode in ("dot", "convolution") or ops & {"dot", "convolution"} or (
        opcode == "custom-call" and re.search("matmul|dot|gemm", target, re.I)):
      category = "matmul"
    elif opcode in ("while", "call", "conditional"):
      category = "control"
    elif opcode == "fusion":
      category = "reduction" if ops & {"reduce", "reduce-window"} else "elementwise/other fusion"
    elif opcode in ("copy", "transpose"):
      category = "copy/transpose"
    elif opcode in ("reduce", "reduce-window"):
      category = "reduction"
    else:
      category = opcode
    out[name] = category
  return out


def profile_shares(run_steps, hlo_text: str, scratch: str, module: str = "grid_step") -> dict:
  """The share of the time of the step's HLO ops by category, from a jax.profiler trace
  of `run_steps()`: the XLA CPU runtime records one event per executed op (stat
  `hlo_op`); events are summed per category (`_hlo_categories`); ops that ran in
  parallel on the two cores both count, so shares are of the summed op time. Only the
  events of HLO modules whose name holds `module` count."""
  import glob  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel
  from jax.profiler import ProfileData  # pylint: disable=import-outside-toplevel

  with jax.profiler.trace(scratch):
    run_steps()
  files = sorted(glob.glob(os.path.join(scratch, "**", "*.xplane.pb"), recursive=True),
                 key=os.path.getmtime)
  if not files:
    return {"error": "no trace written"}
  categories = _hlo_categories(hlo_text)
  totals, unknown = {}, 0.0
  for plane in ProfileData.from_file(files[-1]).planes:
    for line in plane.lines:
      for event in line.events:
        stats = dict(event.stats)
        op = stats.get("hlo_op")
        if op is None or module not in str(stats.get("hlo_module", "")):
          continue
        category = categories.get(op)
        if category is None:
          unknown += event.duration_ns
          category = "(not in the HLO text)"
        if category == "control":
          continue  # Its body's ops have their own events.
        totals[category] = totals.get(category, 0.0) + event.duration_ns
  total = sum(totals.values())
  return {"total_op_ms": total / 1e6,
          "shares": {k: v / total for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
                    if total else {}}


def step_figures(config, timed_steps: int, profile_steps: int = 0,
                 scratch: str | None = None, batches: int = 8) -> dict:
  """The training programs of a config, as the loop builds them: XLA's cost analysis of
  each compiled step (FLOPs per grid step), the compile seconds, and steps/s over
  `timed_steps` after two warm-up steps on the first `batches` batches of the run's data
  (cycled; one program per distinct shape among them, so a config of several lengths or
  buckets is timed over its own length mix; FLOPs per step are the mean over the timed
  steps), and (profile_steps > 0) the op shares of the first batch's program."""
  import tempfile  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  from experiments.training import data  # pylint: disable=import-outside-toplevel
  from experiments.training import steps  # pylint: disable=import-outside-toplevel

  source = data.source(config)
  trainer = steps.build_trainer(config, source.task, jax.devices()[:1])
  state, seeds, step_fn = trainer.state, trainer.seeds, trainer.step
  trainer.state = None
  models = len(trainer.members)
  batches = [trainer.place(source.batch(s)) for s in range(batches)]
  keys = [_shape_key(b) for b in batches]
  programs, costs = {}, {}
  start = time.perf_counter()
  for key, batch in zip(keys, batches):
    if key not in programs:
      programs[key] = step_fn.lower(state, seeds, batch).compile()
  compile_s = time.perf_counter() - start
  for key, compiled in programs.items():
    cost = compiled.cost_analysis()
    costs[key] = cost[0] if isinstance(cost, (list, tuple)) else cost
  for s in range(2):
    state, _ = programs[keys[s % len(batches)]](state, seeds, batches[s % len(batches)])
  jax.block_until_ready(state)
  start = time.perf_counter()
  for s in range(timed_steps):
    i = s % len(batches)
    state, _ = programs[keys[i]](state, seeds, batches[i])
  jax.block_until_ready(state)
  seconds = (time.perf_counter() - start) / max(timed_steps, 1)
  timed = [keys[s % len(batches)] for s in range(max(timed_steps, 1))]
  mean = lambda name: sum(float(costs[k].get(name, 0.0)) for k in timed) / len(timed)
  flops = mean("flops")
  result = {"models": models, "programs": len(programs), "flops_per_step": flops,
            "flops_per_model_step": flops / models,
            "transcendentals_per_step": mean("transcendentals"),
            "bytes_accessed_per_step": mean("bytes accessed"),
            "flops_per_program": {str(k[0]): float(c["flops"]) for k, c in costs.items()},
            "compile_s": compile_s, "timed_steps": timed_steps,
            "seconds_per_step": seconds, "steps_per_s": 1.0 / seconds,
            "model_steps_per_s": models / seconds,
            "gflops_achieved": flops / seconds / 1e9}
  if profile_steps > 0:
    holder = {"state": state}
    compiled = programs[keys[0]]

    def run_steps():
      current = holder["state"]
      for _ in range(profile_steps):
        current, _ = compiled(current, seeds, batches[0])
      jax.block_until_ready(current)
      holder["state"] = current

    folder = tempfile.mkdtemp(prefix="step_profile_", dir=scratch)
    result["profile"] = profile_shares(run_steps, compiled.as_text(), folder)
    result["profile"]["steps"] = profile_steps
  return result


def ito_step_figures(config, timed_steps: int, profile_steps: int = 0,
                     scratch: str | None = None) -> dict:
  """`step_figures` of an Ito config (one program: its batches have one shape), beside
  the analytic count of its matrix products (`ito_matmul_flops`)."""
  result = step_figures(config, timed_steps, profile_steps, scratch, batches=4)
  result["analytic_matmul_flops_per_model_step"] = ito_matmul_flops(config)
  return result


def bench_ito(repeats: int) -> dict:
  """Ito's Latin-square model (configs/latin_square.py, learn σ 0.2, scale small): FLOPs
  per step from XLA's cost analysis, this CPU's float32 matmul throughput measured in the
  same run, steps/s, the achieved fraction, and the op shares of a profile, for one model
  and for a grid of seeds in one program."""
  del repeats
  import jax  # pylint: disable=import-outside-toplevel

  from configs import latin_square  # pylint: disable=import-outside-toplevel

  results = {"device": jax.devices()[0].device_kind, "load_start": _load(),
             "config": ITO_CONFIG, "matmul": matmul_throughput()}
  peak = results["matmul"]["gflops_best"]
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; load average "
        f"{results['load_start']}")
  print(f"float32 jnp.dot {MATMUL_SIZE}x{MATMUL_SIZE}: best {peak:.1f} GFLOP/s, median "
        f"{results['matmul']['gflops_median']:.1f} GFLOP/s\n")
  print("| models | GFLOP per step (cost analysis) | per model | analytic matmuls per model "
        "| compile s | s per step | model steps/s | GFLOP/s | of the matmul's best |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for seeds in (int(s) for s in _ITO_SEEDS.value):
    config = latin_square.get_config(f"{ITO_CONFIG},seeds={seeds}")
    figures = ito_step_figures(config, max(2, _ITO_STEPS.value // seeds),
                               _ITO_PROFILE_STEPS.value, _SCRATCH.value)
    figures["fraction_of_matmul"] = figures["gflops_achieved"] / peak
    results[f"seeds_{seeds}"] = figures
    print(f"| {seeds} | {figures['flops_per_step'] / 1e9:.2f} | "
          f"{figures['flops_per_model_step'] / 1e9:.2f} | "
          f"{figures['analytic_matmul_flops_per_model_step'] / 1e9:.2f} | "
          f"{figures['compile_s']:.0f} | {figures['seconds_per_step']:.3f} | "
          f"{figures['model_steps_per_s']:.2f} | {figures['gflops_achieved']:.1f} | "
          f"{figures['fraction_of_matmul']:.0%} |", flush=True)
    jax.clear_caches()
    gc.collect()
  for seeds in (int(s) for s in _ITO_SEEDS.value):
    profile = results[f"seeds_{seeds}"].get("profile")
    if profile and profile.get("shares"):
      shares = ", ".join(f"{k} {v:.1%}" for k, v in profile["shares"].items())
      print(f"\nop time by category, {seeds} model(s), {profile['steps']} profiled steps "
            f"({profile['total_op_ms']:.0f} ms of op time): {shares}")
  results["load_end"] = _load()
  print(f"\nload average at the end: {results['load_end']}")
  return results


# --------------------------------------------------------------------------
# eval: the paper model's evaluation of lengths 41..100 at batch 500 (issue 27, item 6).


def compare_evaluation(participants, pe: str, lengths, rounds: int, scratch: str,
                       echo=print, overrides: dict | None = None) -> dict:
  """Seconds of `RangeEvaluator.evaluate` over `lengths` (the paper's evaluation config:
  batch 500, its max_buckets and max_logits) per participant (dicts with label, root,
  python; our code only), each in its own process with huge-page malloc where it applies,
  in `rounds` alternating rounds: the first with a fresh evaluator (compiling included),
  the others with its programs compiled. Also whether each one's accuracies equal the
  first participant's, length by length. `overrides`: {"model": {...}, "evaluation":
  {...}} config overrides (tests)."""
  workers, results = [], {}
  env = malloc_environment(True) or malloc_environment(False)
  spec = {"kind": "eval", "pe": pe, "lengths": [int(n) for n in lengths],
          **(overrides or {})}
  try:
    for part in participants:
      worker = TrainWorker(f"eval {part['label']}", part["python"],
                           {**spec, "root": part["root"]}, env, scratch)
      if worker.wait_ready() is None:
        results[part["label"]] = {"error": worker.error}
        echo(f"{part['label']}: cannot be timed: {worker.error}")
        worker.close()
        continue
      workers.append((part["label"], worker))
      results[part["label"]] = {"seconds": [], "traces": [], "accuracy": None}
    for r in range(rounds):
      order = workers[r % max(1, len(workers)):] + workers[:r % max(1, len(workers))]
      for label, worker in order:
        worker.proc.stdin.write(json.dumps({"fresh": r == 0}) + "\n")
        worker.proc.stdin.flush()
        done = worker._read("DONE")  # pylint: disable=protected-access
        if done is None:
          raise RuntimeError(f"{label}: {worker.error}")
        row = results[label]
        row["seconds"].append(done["seconds"])
        row["traces"].append(done["traces"])
        row["accuracy"] = row["accuracy"] or done["accuracy"]
        row.setdefault("load", []).append(_load())
  finally:
    for _, worker in workers:
      worker.close()
  first = next((row["accuracy"] for row in results.values() if row.get("accuracy")), None)
  for row in results.values():
    if row.get("accuracy") is not None:
      row["identical_to_first"] = row["accuracy"] == first
  return results


def bench_eval(repeats: int) -> dict:
  """The paper model's evaluation of --eval_lengths at batch 500, today's code beside
  --baseline_commit, alternating rounds (module docstring)."""
  del repeats
  import contextlib  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  import tempfile  # pylint: disable=import-outside-toplevel

  low, high = (int(x) for x in _EVAL_LENGTHS.value)
  scratch = _SCRATCH.value or tempfile.mkdtemp(prefix="randomized_pe_benchmark_")
  os.makedirs(scratch, exist_ok=True)
  results = {"cpu": cpu_name(), "load_start": _load(), "lengths": [low, high]}
  with contextlib.ExitStack() as stack:
    participants = [{"label": "today", "root": _REPO, "python": sys.executable}]
    if _BASELINE_COMMIT.value:
      path, commit = stack.enter_context(baseline_worktree(_BASELINE_COMMIT.value))
      participants.append({"label": f"commit {commit}", "root": path,
                           "python": sys.executable})
    print(f"CPU: {results['cpu']}; load average {results['load_start']}; "
          f"{_EVAL_ENCODING.value}, lengths {low}..{high} at batch 500, "
          f"{_EVAL_ROUNDS.value} rounds alternating (the first compiles)\n", flush=True)
    runs = compare_evaluation(participants, _EVAL_ENCODING.value, range(low, high + 1),
                              _EVAL_ROUNDS.value, scratch)
  results["runs"] = runs
  print("| code | programs | first evaluation s (compile included) | later evaluations s "
        "(compiled) | accuracies identical to today's | load |")
  print("|---|---:|---:|---:|---|---|")
  for label, row in runs.items():
    if "error" in row:
      print(f"| {label} | cannot be timed: {row['error']} |")
      continue
    later = ", ".join(f"{s:.1f}" for s in row["seconds"][1:]) or "-"
    print(f"| {label} | {row['traces'][0]} | {row['seconds'][0]:.1f} | {later} | "
          f"{row.get('identical_to_first')} | {row['load'][0]} .. {row['load'][-1]} |")
  base = next((k for k in runs if k.startswith("commit")), None)
  if base and "seconds" in runs.get("today", {}) and "seconds" in runs[base]:
    ratio = runs["today"]["seconds"][0] / runs[base]["seconds"][0]
    results["today_vs_baseline_first"] = ratio
    print(f"\ntoday's first evaluation takes {ratio:.2f}x the time of {base}'s (target <= 0.5)")
  results["load_end"] = _load()
  print(f"\nload average at the end: {results['load_end']}")
  return results


# --------------------------------------------------------------------------
# roofline: the paper's protocol on GPUs, projected from the programs' cost analysis
# (issue 27, item 7). A projection, not a measurement.

# Public peak figures (dense, no sparsity), from the vendors' datasheets:
#   V100 SXM2: NVIDIA Tesla V100 datasheet (2020): 15.7 TFLOPS FP32, 125 TFLOPS tensor
#     (FP16), 900 GB/s HBM2; no TF32.
#   A100 SXM4 80GB: NVIDIA A100 datasheet (2021): 19.5 TFLOPS FP32, 156 TFLOPS TF32 tensor,
#     312 TFLOPS FP16 tensor, 2,039 GB/s HBM2e.
#   H100 SXM5: NVIDIA H100 datasheet (2023): 67 TFLOPS FP32, 494.7 TFLOPS TF32 tensor and
#     989.4 TFLOPS FP16 tensor (dense: half the datasheet's "with sparsity" 989 / 1,979),
#     3.35 TB/s HBM3.
GPUS = {
    "V100 SXM2": {"FP32": 15.7e12, "TF32": None, "FP16": 125e12, "bandwidth": 900e9},
    "A100 SXM4 80GB": {"FP32": 19.5e12, "TF32": 156e12, "FP16": 312e12,
                       "bandwidth": 2039e9},
    "H100 SXM5": {"FP32": 67e12, "TF32": 494.7e12, "FP16": 989.4e12, "bandwidth": 3.35e12},
}
# The paper's Table 1 protocol (configs/table1.py): per model 2,000,000 steps of batch 128
# on lengths drawn uniformly from 1..40, then evaluation of lengths 1..500 at batch 500;
# 10 seeds x 3 learning rates x 11 encodings x 15 tasks models.
PROTOCOL = {"steps": 2_000_000, "train_lengths": (1, 40), "eval_lengths": (1, 500),
            "models": 10 * 3 * 11 * 15}


def roofline_seconds(flops: float, bytes_accessed: float, peak_flops: float,
                     bandwidth: float) -> float:
  """The roofline's lower bound on a program's time: compute or memory, whichever binds."""
  return max(flops / peak_flops, bytes_accessed / bandwidth)


def roofline_projection(train_costs: dict, eval_costs: dict, gpus=None,
                        protocol=None) -> dict:
  """GPU-hours of the protocol by the roofline, per GPU and precision.

  Args:
    train_costs: {length: (FLOPs, bytes accessed)} of one model's training step at each
      training length; lengths are drawn uniformly, so a step costs their mean.
    eval_costs: {length: (FLOPs, bytes)} of evaluating one length (the whole batch).
    gpus: {name: {precision: FLOP/s or None, "bandwidth": bytes/s}} (default GPUS).
    protocol: as PROTOCOL.

  Returns:
    {gpu: {precision: {"step_ms", "eval_s", "hours_per_model", "gpu_hours",
    "bound": share of training time bound by memory}}}.
  """
  gpus = GPUS if gpus is None else gpus
  protocol = PROTOCOL if protocol is None else protocol
  out = {}
  for name, gpu in gpus.items():
    out[name] = {}
    for precision, peak in gpu.items():
      if precision == "bandwidth" or not peak:
        continue
      train = [roofline_seconds(f, b, peak, gpu["bandwidth"]) for f, b in train_costs.values()]
      memory_bound = sum(b / gpu["bandwidth"] >= f / peak for f, b in train_costs.values())
      step = sum(train) / len(train)
      evaluation = sum(roofline_seconds(f, b, peak, gpu["bandwidth"])
                       for f, b in eval_costs.values())
      hours = (protocol["steps"] * step + evaluation) / 3600
      out[name][precision] = {"step_ms": step * 1e3, "eval_s": evaluation,
                              "hours_per_model": hours,
                              "gpu_hours": hours * protocol["models"],
                              "memory_bound_lengths": memory_bound / len(train_costs)}
  return out


def fit_costs(sampled: dict, lengths) -> dict:
  """{length: (FLOPs, bytes)} for `lengths` from a least-squares quadratic in the length
  through the sampled lengths' costs (exact where sampled): a program's work is a
  polynomial of degree 2 in its sequence length (attention) plus linear terms."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  ns = sorted(sampled)
  out = {}
  for column in (0, 1):
    coefficients = np.polyfit(ns, [sampled[n][column] for n in ns], min(2, len(ns) - 1))
    for n in lengths:
      value = sampled[n][column] if n in sampled else float(np.polyval(coefficients, n))
      out.setdefault(n, [0.0, 0.0])[column] = max(0.0, value)
  return {n: tuple(v) for n, v in out.items()}


def paper_program_costs(encoding: str, train_lengths, eval_lengths) -> tuple:
  """XLA's cost analysis (CPU compiler: its fusions, not a GPU's) of the paper model's
  programs: one model's training step at each of `train_lengths` (batch 128) and the
  evaluation of each of `eval_lengths` (batch 500, sub-batched as evaluation runs it:
  the chunk program's cost times the chunks). Returns ({n: (FLOPs, bytes)}, same)."""
  import jax  # pylint: disable=import-outside-toplevel

  import tasks  # pylint: disable=import-outside-toplevel
  from configs import default  # pylint: disable=import-outside-toplevel
  from experiments.training import data  # pylint: disable=import-outside-toplevel
  from experiments.training import evaluation  # pylint: disable=import-outside-toplevel
  from experiments.training import steps  # pylint: disable=import-outside-toplevel

  def cost_of(compiled):
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))

  task = tasks.get("reverse_string")
  config = default.get_config()
  config.model.pe = encoding
  config.training.max_length = max(train_lengths)
  trainer = steps.build_trainer(config, task, jax.devices()[:1])
  train = {}
  for n in train_lengths:
    batch = trainer.place(data.make_batch(task, jax.random.PRNGKey(n),
                                          config.training.batch_size, n))
    train[n] = cost_of(trainer.step.lower(trainer.state, trainer.seeds, batch).compile())
  e = config.evaluation
  evaluator = evaluation.RangeEvaluator(trainer.model, task, max_logits=e.max_logits)
  params = jax.tree_util.tree_map(lambda x: x[0], trainer.state.params)
  evals = {}
  for n in eval_lengths:
    size, out_size = data.sequence_length(task, n), task.output_length(n)
    chunk = evaluator.sub_batch_rows(e.batch_size,
                                     trainer.model.attention_logits_per_sequence(size))
    flops, nbytes = cost_of(evaluator.compile(params, (size, out_size, chunk)))
    chunks = -(-e.batch_size // chunk)
    evals[n] = (flops * chunks, nbytes * chunks)
  return train, evals


def paper_table2_hours() -> dict:
  """Table 2 of the paper (experiments/paper_numbers/paper_results.json): {(task, encoding): mean
  hours of one run on a V100}."""
  path = os.path.join(_REPO, "experiments", "paper_numbers", "paper_results.json")
  with open(path) as f:
    hours = json.load(f)["table2_running_hours_mean_std"]["hours"]
  return {(t, e): v[0] for t, row in hours.items() for e, v in row.items()}


def bench_roofline(repeats: int) -> dict:
  """A roofline projection of the Table 1 protocol's GPU-hours (module docstring)."""
  del repeats
  train_sample = [int(n) for n in _ROOFLINE_TRAIN_LENGTHS.value]
  eval_sample = [int(n) for n in _ROOFLINE_EVAL_LENGTHS.value]
  results = {"cpu": cpu_name(), "load_start": _load(), "encoding": _ROOFLINE_ENCODING.value}
  print(f"Cost analysis (XLA's CPU compiler, so its fusions, not a GPU's) of the paper "
        f"model's programs, {_ROOFLINE_ENCODING.value}, reverse_string; compiled here on "
        f"{results['cpu']} (load {results['load_start']})\n")
  start = time.perf_counter()
  train_sampled, eval_sampled = paper_program_costs(_ROOFLINE_ENCODING.value, train_sample,
                                                    eval_sample)
  results["cost_seconds"] = time.perf_counter() - start
  print("| program | length | GFLOP | GB accessed | FLOP per byte |")
  print("|---|---:|---:|---:|---:|")
  for what, table in (("training step (batch 128)", train_sampled),
                      ("evaluation of one length (batch 500)", eval_sampled)):
    for n, (f, b) in sorted(table.items()):
      print(f"| {what} | {n} | {f / 1e9:.2f} | {b / 1e9:.3f} | {f / max(b, 1):.1f} |")
  p = PROTOCOL
  train = fit_costs(train_sampled, range(p["train_lengths"][0], p["train_lengths"][1] + 1))
  evals = fit_costs(eval_sampled, range(p["eval_lengths"][0], p["eval_lengths"][1] + 1))
  projection = roofline_projection(train, evals)
  results.update(train_sampled={str(k): v for k, v in train_sampled.items()},
                 eval_sampled={str(k): v for k, v in eval_sampled.items()},
                 projection=projection)
  table2 = paper_table2_hours()
  paper_run = table2.get(("reverse_string", _ROOFLINE_ENCODING.value))
  paper_total = 30 * sum(table2.values())
  print(f"\nOther lengths from a quadratic fit through these. Protocol: {p['steps']:,} "
        f"steps per model on lengths {p['train_lengths'][0]}..{p['train_lengths'][1]} "
        f"(uniform), evaluation of {p['eval_lengths'][0]}..{p['eval_lengths'][1]}, "
        f"{p['models']:,} models (10 seeds x 3 learning rates x 11 encodings x 15 tasks, "
        f"each costed as this one).\n")
  print("| GPU | precision | step ms (mean over lengths) | evaluation s | hours per model | "
        "GPU-hours, whole protocol | memory-bound training lengths |")
  print("|---|---|---:|---:|---:|---:|---:|")
  for gpu, rows in projection.items():
    for precision, row in rows.items():
      print(f"| {gpu} | {precision} | {row['step_ms']:.3f} | {row['eval_s']:.1f} | "
            f"{row['hours_per_model']:.3f} | {row['gpu_hours']:,.0f} | "
            f"{row['memory_bound_lengths']:.0%} |")
  print(f"\nThe paper's Table 2 (measured, one V100 per run): reverse_string / "
        f"{_ROOFLINE_ENCODING.value} {paper_run} h per run; the mean of its "
        f"{len(table2)} task x encoding cells x 30 runs each: {paper_total:,.0f} V100-hours "
        f"for the {len(table2) * 30:,} runs it lists.")
  v100 = projection["V100 SXM2"]["FP32"]["hours_per_model"]
  if paper_run:
    print(f"The roofline's V100 FP32 bound is {v100:.3f} h per run, {v100 / paper_run:.1%} "
          f"of the paper's measured {paper_run} h: a projection, the bound of compute and "
          "memory traffic alone; a model this small (d_model 64) is bound on a GPU by kernel "
          "launches and other latency, which the roofline does not see.")
  results.update(paper_run_hours=paper_run, paper_total_hours=paper_total,
                 load_end=_load())
  return results


SECTIONS = {"tasks": bench_tasks, "train": bench_train, "grid": bench_grid,
            "attention": bench_attention, "buckets": bench_buckets,
            "ito": bench_ito, "eval": bench_eval, "roofline": bench_roofline}


def main(argv):
  del argv
  from absl import logging  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)
  if _CACHE_CHILD.value is not None:  # A subprocess of `buckets` (part cache).
    _cache_child(_CACHE_CHILD.value)
    return
  # Compile seconds here mean compiling: this process never reads a persistent cache
  # (the parts of `buckets` that measure the cache start subprocesses with their own).
  from experiments.training import compile_cache  # pylint: disable=import-outside-toplevel
  compile_cache.enable("off")
  unknown = [s for s in _SECTIONS.value if s not in SECTIONS]
  if unknown:
    raise app.UsageError(f"unknown sections {unknown}; valid: {', '.join(SECTIONS)}")
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  print(f"GLIBC_TUNABLES={tunables or '(unset)'} (see experiments/training/runtime.py)")
  results = {"glibc_tunables": tunables}
  for section in _SECTIONS.value:
    print(f"\n## {section}\n")
    results[section] = SECTIONS[section](_REPEATS.value)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  from experiments.training import runtime  # pylint: disable=ungrouped-imports
  runtime.maybe_reexec()  # Huge-page malloc for XLA CPU; see experiments/training/runtime.py.
  app.run(main)
