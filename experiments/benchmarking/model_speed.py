"""Sections `grid` and `attention`: model-steps per second of a grid of 30 models in one
program against one model, and one layer's attention over the whole batch against
cache-sized chunks."""

import time

import jax
import jax.numpy as jnp

from configs import default
from experiments.benchmarking import timing
from experiments.training import data
from experiments.training import steps
from randomized_pe import attention
from randomized_pe import encodings
from randomized_pe import samplers
import tasks


def bench_grid(length: int, steps_per_setting: int) -> dict:
  """Model-steps per second of a 10-seed x 3-rate grid against one model at training
  length `length`, each timed over `steps_per_setting` model steps (at least 2 grid
  steps)."""
  task = tasks.get("reverse_string")
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
    timed = max(2, steps_per_setting // len(members))
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
