"""The benchmark's other processes: a code version (today's tree, a temporary `git
worktree` of a previous commit, the original release) timed in its own process by the
driver (driver.py, copied to a scratch folder so that it imports the code under test
only), with huge-page malloc on or off (malloc_environment); compare_training and
compare_evaluation time them side by side in alternating rounds."""

import json
import os
import shutil
import subprocess
import tempfile

import numpy as np

from experiments.benchmarking import timing
from experiments.training import runtime

# The checkout whose code is "today's" (experiments/benchmarking/ is two folders down).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "driver.py")


def malloc_environment(tuned: bool, environ=None) -> dict | None:
  """The environment of a timed subprocess with glibc's huge-page malloc on (`tuned`) or
  off (experiments/training/runtime.py); None when it does not apply on this machine. The
  subprocesses get it explicitly (GLIBC_TUNABLES), whatever this process runs with."""
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

  def __init__(self, rev: str, repo: str = REPO):
    self.rev, self.repo = rev, repo

  def __enter__(self):
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
    subprocess.run(["git", "-C", self.repo, "worktree", "remove", "--force", self.path],
                   capture_output=True, check=False)
    subprocess.run(["git", "-C", self.repo, "worktree", "prune"], capture_output=True,
                   check=False)
    shutil.rmtree(self.folder, ignore_errors=True)
    return False


class TrainWorker:
  """One code version's training step in its own process (driver.py, copied
  to `scratch` and run there so that it imports the code under test from `root`
  only): compiles one program per length, then times rounds of steps on request."""

  def __init__(self, label: str, python: str, spec: dict, env: dict, scratch: str):
    self.label, self.ready, self.error = label, None, None
    driver = os.path.join(scratch, "train_driver.py")
    if not os.path.exists(driver):
      shutil.copy(DRIVER, driver)
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
  "ours" or "release", root, python, and optionally stand_in: "attention_free", see
  driver.py) under each malloc mode (True: huge pages), in
  subprocesses started one after the other (so compiles do not overlap), then timed in
  rounds of `round_steps` steps that alternate between them (the order rotating), every
  one on the same lengths, drawn uniformly from `lengths` with `seed`. `model`: overrides
  of the model config (tests: a tiny model).

  Returns {label/malloc: {"params", "compile_s", "programs", "steps_per_s",
  "round_seconds", "gflops" (from the programs' cost analysis), "flops_per_step", ...}
  or {"error": ...}, "lengths": ..., "steps": ...}.
  """
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
                                                   "root": part["root"],
                                                   "stand_in": part.get("stand_in")},
                             env, scratch)
        ready = worker.wait_ready()
        if ready is None:
          results[key] = {"error": worker.error}
          echo(f"{key}: cannot be timed: {worker.error}")
          worker.close()
          continue
        workers.append(worker)
        results[key] = {**ready, "round_seconds": [], "seconds": 0.0, "flops_done": 0.0,
                        "tuned": tuned, "label": part["label"], "load_compiled": timing.load()}
    draw = np.random.default_rng(seed).integers(min(lengths), max(lengths) + 1, steps)
    draw = [int(n) if n in lengths else lengths[0] for n in draw]
    results["load_before_steps"] = timing.load()
    for r, first in enumerate(range(0, steps, round_steps)):
      chunk = draw[first:first + round_steps]
      order = workers[r % max(1, len(workers)):] + workers[:r % max(1, len(workers))]
      for worker in order:
        row = results[worker.label]
        seconds = worker.run(chunk, r)
        row["round_seconds"].append(seconds)
        row["seconds"] += seconds
        row["flops_done"] += sum(float(row["flops"][str(n)]) for n in chunk)
    results["load_after_steps"] = timing.load()
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
        row.setdefault("load", []).append(timing.load())
  finally:
    for _, worker in workers:
      worker.close()
  first = next((row["accuracy"] for row in results.values() if row.get("accuracy")), None)
  for row in results.values():
    if row.get("accuracy") is not None:
      row["identical_to_first"] = row["accuracy"] == first
  return results
