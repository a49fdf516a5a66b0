"""Sections `grid` and `attention`: model-steps per second of a grid of 30 models in one
program (each `grid.layout`) against one model, and one layer's attention over the whole
batch against cache-sized chunks."""

import statistics
import time

import jax
import jax.numpy as jnp

from configs import default
from experiments.benchmarking import timing
from experiments.training import data
from experiments.training import members
from experiments.training import steps
from randomized_pe import attention
from randomized_pe import encodings
from randomized_pe import samplers
import tasks


def bench_grid(length: int, steps_per_setting: int, grid_models: int = 30,
               rounds: int = 3) -> dict:
  """Model-steps per second of one model and of a grid of `grid_models` models (seeds x 3
  learning rates, one program) in each layout of `grid.layout`, at training length
  `length`: every program compiled first, then `rounds` alternating rounds of about
  `steps_per_setting` model steps each (at least 2 grid steps); the best round and the
  median of rounds, each against one model's."""
  task = tasks.get("reverse_string")
  rates = (1e-4, 3e-4, 5e-4) if grid_models % 3 == 0 else (1e-4,)
  seeds = tuple(range(grid_models // len(rates)))
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; "
        f"{timing.cpu_name()}; reverse_string, paper model, batch 128, length {length} "
        f"(sequence {2 * length}), randomized_relative; load {timing.load()}\n")
  settings = [("one model", (0,), (1e-4,), members.DEFAULT)]
  settings += [(f"{len(seeds) * len(rates)} models, {layout}", seeds, rates, layout)
               for layout in members.LAYOUTS]
  batch = data.make_batch(task, jax.random.PRNGKey(0), 128, length)
  programs = []
  for name, grid_seeds, grid_rates, layout in settings:
    config = default.get_config()
    config.model.pe = "randomized_relative"
    config.grid.seeds, config.grid.learning_rates = grid_seeds, grid_rates
    config.grid.layout = layout
    trainer = steps.build_trainer(config, task, jax.devices()[:1])
    step = jax.jit(steps.make_grid_step(trainer.model, steps.optimizer_for(trainer.model, config),
                                        layout))
    start = time.perf_counter()
    compiled = step.lower(trainer.state, trainer.seeds, batch).compile()
    compile_s = time.perf_counter() - start
    programs.append((name, compiled, trainer.state, trainer.seeds, len(trainer.members),
                     compile_s))
  rates_by_setting = {name: [] for name, *_ in programs}
  for r in range(rounds):
    order = programs[r % len(programs):] + programs[:r % len(programs)]
    for name, compiled, state, seeds_array, models, _ in order:
      jax.block_until_ready(compiled(state, seeds_array, batch))  # Warm.
      timed = max(2, steps_per_setting // models)
      start = time.perf_counter()
      for _ in range(timed):
        out = compiled(state, seeds_array, batch)
      jax.block_until_ready(out)
      rates_by_setting[name].append(timed * models / (time.perf_counter() - start))
  results = {"device": jax.devices()[0].device_kind, "cpu": timing.cpu_name(),
             "length": length, "rounds": rounds, "settings": {}}
  print("| setting | compile s | model-steps/s (best / median of rounds) | vs one model "
        "(best / median) |")
  print("|---|---:|---:|---:|")
  base = rates_by_setting["one model"]
  for name, *_, compile_s in programs:
    got = rates_by_setting[name]
    best, median = max(got), statistics.median(got)
    results["settings"][name] = {"compile_s": compile_s, "model_steps_per_s": got}
    print(f"| {name} | {compile_s:.1f} | {best:.2f} / {median:.2f} | "
          f"{best / max(base):.2f}x / {median / statistics.median(base):.2f}x |", flush=True)
  print(f"\nload after: {timing.load()}")
  return results


def bench_attention(repeats: int) -> dict:
  """Attention forward + backward of one layer of the paper model: whole batch vs chunks."""
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
        times.append(timing.median_ms(
            lambda i, g=grad: jax.block_until_ready(g(q, k, v, kernel)), repeats))
      results[f"{name}/{length}"] = {"whole_ms": times[0], "chunked_ms": times[-1], "rows": rows}
      if rows >= batch:  # The logits fit: the default runs the whole batch at once.
        print(f"| {length} | {name} | {times[0]:.1f} | one piece | - |", flush=True)
        continue
      print(f"| {length} | {name} | {times[0]:.1f} | {times[1]:.1f} ({rows}) | "
            f"{times[0] / times[1]:.2f}x |", flush=True)
  return results
