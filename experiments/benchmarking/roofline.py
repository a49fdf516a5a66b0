"""Section `roofline`: the GPU-hours of the paper's Table 1 protocol on V100, A100 and
H100, projected (not measured) from the roofline of the paper model's programs: FLOPs and
bytes accessed from XLA's cost analysis of the training step and of one length's
evaluation, other lengths from a quadratic fit (issue 27, item 7)."""

import json
import os
import time

import jax
import numpy as np

from configs import default
from experiments.benchmarking import processes
from experiments.benchmarking import throughput
from experiments.benchmarking import timing
from experiments.training import data
from experiments.training import evaluation
from experiments.training import steps
from randomized_pe import attention as attn_lib
import tasks

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
  def cost_of(compiled):
    cost = throughput.cost_of(compiled)
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))

  task = tasks.get("reverse_string")
  config = default.get_config()
  config.model.pe = encoding
  config.training.max_length = max(train_lengths)
  batches = {n: data.make_batch(task, jax.random.PRNGKey(n), config.training.batch_size, n)
             for n in train_lengths}
  # The training steps with attention in one piece, as a GPU runs them.
  train = {n: (float(c.get("flops", 0.0)), float(c.get("bytes accessed", 0.0)))
           for n, c in throughput.one_piece_costs(config, task, batches).items()}
  e = config.evaluation
  model = steps.build_model(config, task)
  params = steps.init_state(model, steps.make_optimizer(config), 0).params
  evaluator = evaluation.RangeEvaluator(model, task, max_logits=e.max_logits)
  evals = {}
  for n in eval_lengths:
    size, out_size = data.sequence_length(task, n), task.output_length(n)
    chunk = evaluator.sub_batch_rows(e.batch_size, model.attention_logits_per_sequence(size))
    # Attention in one piece, as a GPU runs it (and counted whole: module docstring).
    with attn_lib.whole_batch_chunks():
      flops, nbytes = cost_of(evaluator.compile(params, (size, out_size, chunk)))
    chunks = -(-e.batch_size // chunk)
    evals[n] = (flops * chunks, nbytes * chunks)
  return train, evals


def paper_table2_hours() -> dict:
  """Table 2 of the paper (experiments/paper_numbers/paper_results.json): {(task, encoding): mean
  hours of one run on a V100}."""
  path = os.path.join(processes.REPO, "experiments", "paper_numbers", "paper_results.json")
  with open(path) as f:
    hours = json.load(f)["table2_running_hours_mean_std"]["hours"]
  return {(t, e): v[0] for t, row in hours.items() for e, v in row.items()}


def bench_roofline(encoding: str, train_lengths, eval_lengths) -> dict:
  """A roofline projection of the Table 1 protocol's GPU-hours (experiments/benchmark.py's
  docstring): `encoding`'s training step costed at `train_lengths`, its evaluation at
  `eval_lengths` (other lengths: fitted)."""
  train_sample = [int(n) for n in train_lengths]
  eval_sample = [int(n) for n in eval_lengths]
  results = {"cpu": timing.cpu_name(), "load_start": timing.load(), "encoding": encoding}
  print(f"Cost analysis (XLA's CPU compiler, so its fusions, not a GPU's) of the paper "
        f"model's programs, {encoding}, reverse_string; compiled here on "
        f"{results['cpu']} (load {results['load_start']})\n")
  start = time.perf_counter()
  train_sampled, eval_sampled = paper_program_costs(encoding, train_sample,
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
  paper_run = table2.get(("reverse_string", encoding))
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
        f"{encoding} {paper_run} h per run; the mean of its "
        f"{len(table2)} task x encoding cells x 30 runs each: {paper_total:,.0f} V100-hours "
        f"for the {len(table2) * 30:,} runs it lists.")
  v100 = projection["V100 SXM2"]["FP32"]["hours_per_model"]
  if paper_run:
    print(f"The roofline's V100 FP32 bound is {v100:.3f} h per run, {v100 / paper_run:.1%} "
          f"of the paper's measured {paper_run} h: a projection, the bound of compute and "
          "memory traffic alone; a model this small (d_model 64) is bound on a GPU by kernel "
          "launches and other latency, which the roofline does not see.")
  results.update(paper_run_hours=paper_run, paper_total_hours=paper_total,
                 load_end=timing.load())
  return results
