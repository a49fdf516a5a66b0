"""Section `ito`: Ito et al.'s Latin-square model (configs/latin_square.py: learn, sigma
0.2, scale small; issue 26, item 1): FLOPs per step from XLA's cost analysis beside an
analytic count of its matrix products, steps/s, the achieved fraction of this CPU's
float32 matmul throughput, and the op shares of a profile, for one model and a grid of
seeds in one program."""

import gc

import jax

from configs import latin_square
from experiments.benchmarking import throughput
from experiments.benchmarking import timing

ITO_CONFIG = "encoding=learn,sigma=0.2,scale=small"


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


def ito_step_figures(config, timed_steps: int, profile_steps: int = 0,
                     scratch: str | None = None) -> dict:
  """`step_figures` of an Ito config (one program: its batches have one shape), beside
  the analytic count of its matrix products (`ito_matmul_flops`)."""
  result = throughput.step_figures(config, timed_steps, profile_steps, scratch, batches=4)
  result["analytic_matmul_flops_per_model_step"] = ito_matmul_flops(config)
  return result


def bench_ito(*, grid_sizes, model_steps: int, profile_steps: int,
              scratch: str | None) -> dict:
  """Ito's Latin-square model (configs/latin_square.py, learn σ 0.2, scale small): FLOPs
  per step from XLA's cost analysis, this CPU's float32 matmul throughput measured in the
  same run, steps/s, the achieved fraction, and the op shares of a profile, for one model
  and for a grid of seeds in one program: one program per grid size (seeds) of
  `grid_sizes`, each timed over `model_steps` model steps (at least 2 grid steps),
  `profile_steps` steps profiled (0: none), the profiles under `scratch` (None: a
  temporary folder)."""
  results = {"device": jax.devices()[0].device_kind, "load_start": timing.load(),
             "config": ITO_CONFIG, "matmul": throughput.matmul_throughput()}
  peak = results["matmul"]["gflops_best"]
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; load average "
        f"{results['load_start']}")
  size = throughput.MATMUL_SIZE
  print(f"float32 jnp.dot {size}x{size}: best {peak:.1f} GFLOP/s, median "
        f"{results['matmul']['gflops_median']:.1f} GFLOP/s\n")
  print("| models | GFLOP per step (cost analysis) | per model | analytic matmuls per model "
        "| compile s | s per step | model steps/s | GFLOP/s | of the matmul's best |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for seeds in (int(s) for s in grid_sizes):
    config = latin_square.get_config(f"{ITO_CONFIG},seeds={seeds}")
    figures = ito_step_figures(config, max(2, model_steps // seeds), profile_steps,
                               scratch)
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
  for seeds in (int(s) for s in grid_sizes):
    profile = results[f"seeds_{seeds}"].get("profile")
    if profile and profile.get("shares"):
      shares = ", ".join(f"{k} {v:.1%}" for k, v in profile["shares"].items())
      print(f"\nop time by category, {seeds} model(s), {profile['steps']} profiled steps "
            f"({profile['total_op_ms']:.0f} ms of op time): {shares}")
  results["load_end"] = timing.load()
  print(f"\nload average at the end: {results['load_end']}")
  return results
