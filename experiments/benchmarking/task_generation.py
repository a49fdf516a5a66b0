"""Section `tasks`: milliseconds per batch of every task's generation at batch 128 x
length 40 and 500 x 500, beside the release's figures on the same CPU."""

import jax
import numpy as np

from experiments.benchmarking import timing
import tasks

# The release's numbers on the same 2-core CPU (measured when issue 3 was worked on),
# in ms per batch at 128 x 40 and 500 x 500.
RELEASE_TASK_MS = {
    "stack_manipulation": (24.5, 705), "modular_arithmetic_brackets": (8.8, 385),
    "solve_equation": (10.3, 379), "binary_addition": (3.8, 150),
    "binary_multiplication": (3.9, 154), "compute_sqrt": (3.0, 119),
}
TASK_SHAPES = ((128, 40), (500, 500))


def bench_tasks(repeats: int) -> dict:
  """Every task's ms per batch at TASK_SHAPES: the median of `repeats` calls (fewer at
  the larger shape), after a warm-up call."""
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
      row.append(timing.median_ms(
          lambda i: task.sample_batch(keys[i], batch_size, length), reps))
    results[name] = row
    release = RELEASE_TASK_MS.get(name)
    release = f"{release[0]} / {release[1]}" if release else "< 1 / < 14"
    print(f"| {name} | {row[0]:.2f} | {row[1]:.1f} | {release} |", flush=True)
  worst = [max(r[0] for r in results.values()), max(r[1] for r in results.values())]
  print(f"\nslowest task: {worst[0]:.2f} ms at 128 x 40 (target <= 2), "
        f"{worst[1]:.1f} ms at 500 x 500 (target <= 50)")
  return results
