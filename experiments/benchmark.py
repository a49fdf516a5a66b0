"""Speed benchmarks (measured here, never asserted in tests).

  python -m experiments.benchmark                  # every section
  python -m experiments.benchmark --sections=tasks # one section

Sections:
  tasks: milliseconds per batch of every task at batch 128 x length 40 and
         500 x 500 (median of repeats, after one warm-up call).

Prints Markdown tables; `--output=FILE.json` also writes the raw numbers.
"""

from __future__ import annotations

import json
import statistics
import time

from absl import app
from absl import flags

_SECTIONS = flags.DEFINE_list("sections", ["tasks"], "Which benchmarks to run.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed repeats per measurement (tasks).")
_OUTPUT = flags.DEFINE_string("output", None, "Optional JSON file for the raw numbers.")

# The release's numbers on the same 2-core CPU (DESIGN.md section 7 and issue 3),
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


SECTIONS = {"tasks": bench_tasks}


def main(argv):
  del argv
  unknown = [s for s in _SECTIONS.value if s not in SECTIONS]
  if unknown:
    raise app.UsageError(f"unknown sections {unknown}; valid: {', '.join(SECTIONS)}")
  results = {}
  for section in _SECTIONS.value:
    print(f"\n## {section}\n")
    results[section] = SECTIONS[section](_REPEATS.value)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
