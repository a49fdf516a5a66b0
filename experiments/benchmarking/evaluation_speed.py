"""Section `eval`: the paper model's evaluation (batch 500, its max_buckets and
max_logits) of lengths 41..100, today's code beside a previous commit's, each in its own
process (processes.compare_evaluation), and whether their accuracies are identical
(issue 27, item 6)."""

import contextlib
import os
import sys
import tempfile

from experiments.benchmarking import processes
from experiments.benchmarking import timing


def bench_eval(*, lengths, scratch: str | None, baseline_commit: str | None,
               encoding: str, rounds: int) -> dict:
  """The paper model's evaluation of `lengths` (the first and the last) at batch 500,
  today's code beside `baseline_commit`, `rounds` alternating rounds (the first compiles;
  experiments/benchmark.py's docstring). `scratch`: the folder of the subprocesses' logs
  (None: a new temporary folder)."""
  low, high = (int(x) for x in lengths)
  scratch = scratch or tempfile.mkdtemp(prefix="randomized_pe_benchmark_")
  os.makedirs(scratch, exist_ok=True)
  results = {"cpu": timing.cpu_name(), "load_start": timing.load(), "lengths": [low, high]}
  with contextlib.ExitStack() as stack:
    participants = [{"label": "today", "root": processes.REPO, "python": sys.executable}]
    if baseline_commit:
      path, commit = stack.enter_context(processes.baseline_worktree(baseline_commit))
      participants.append({"label": f"commit {commit}", "root": path,
                           "python": sys.executable})
    print(f"CPU: {results['cpu']}; load average {results['load_start']}; "
          f"{encoding}, lengths {low}..{high} at batch 500, "
          f"{rounds} rounds alternating (the first compiles)\n", flush=True)
    runs = processes.compare_evaluation(participants, encoding, range(low, high + 1),
                                        rounds, scratch)
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
  results["load_end"] = timing.load()
  print(f"\nload average at the end: {results['load_end']}")
  return results
