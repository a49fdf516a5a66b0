"""What a trained run attends to and where its activations go beyond the training
lengths: the attention maps and their numbers (paper's Figure 6), the PCA of the
activations (Figure 5), analysis.json. The command line and what it writes:
experiments/analyze.py (python -m experiments.analyze); the numbers: docs/analyze.md."""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments import cli
from experiments.storage import checkpoints
from experiments.storage import io_utils
from experiments.storage import workdir as workdir_lib
from experiments.training import data
from experiments.training import evaluation
from experiments.training import steps
from experiments.training import trained_run
from randomized_pe import probes
from randomized_pe.models import encoder
import tasks as tasks_lib

KINDS = ("attention", "pca", "all")
OUT_FOLDER = "analysis"
JSON_FILE = "analysis.json"


class BadInput(ValueError):
  """Input the user can correct (exit code 2)."""


# --------------------------------------------------------------------------
# Which input an output should read, for the tasks where that is defined.


def _reverse(n_in: int, n_out: int) -> np.ndarray:
  del n_out
  return n_in - 1 - np.arange(n_in)


def _duplicate(n_in: int, n_out: int) -> np.ndarray:
  return np.arange(n_out) % n_in


def _odds_first(n_in: int, n_out: int) -> np.ndarray:
  del n_out
  return np.concatenate([np.arange(1, n_in, 2), np.arange(0, n_in, 2)])


# task -> (what the expected source is, (input length, output length) -> int [O]: the
# input token index output i should read).
EXPECTED_SOURCES: dict[str, tuple[str, Callable[[int, int], np.ndarray]]] = {
    "reverse_string": ("output i reads input n-1-i: the anti-diagonal of the "
                       "output-to-input block", _reverse),
    "duplicate_string": ("output i reads input i mod n", _duplicate),
    "odds_first": ("outputs read the inputs at odd indices, then those at even indices",
                   _odds_first),
}
# The name the expected source mass also goes by in analysis.json.
ALIASES = {"reverse_string": "anti_diagonal_fraction"}


def expected_source(task, length: int) -> Optional[np.ndarray]:
  """int [T]: the token each query row of a `length` sample should read (-1: none); None
  for tasks that define none. Inputs come first, then one empty token per output."""
  entry = EXPECTED_SOURCES.get(task.name)
  if entry is None:
    return None
  n_in, n_out = task.input_length(length), task.output_length(length)
  return np.concatenate([np.full(n_in, -1), entry[1](n_in, n_out)]).astype(np.int32)


# --------------------------------------------------------------------------
# A run, checked before anything expensive.


@dataclasses.dataclass
class Run:
  """A workdir's run and what the analysis will do with it (`prepare`)."""

  workdir: str
  config: object  # ml_collections.ConfigDict
  task: object
  model: object  # randomized_pe.models.encoder.EncoderModel
  kind: str
  length: int
  beyond_length: int
  num_sequences: int
  member: int
  members: list
  seed: int
  out: str


def prepare(workdir: str, kind: str = "all", length: Optional[int] = None,
            beyond_length: Optional[int] = None, out: Optional[str] = None,
            num_sequences: int = 30, member: int = 0, seed: int = 0) -> Run:
  """Reads and checks everything the analysis needs, cheaply (nothing compiles).

  Raises:
    BadInput: one line, for anything the user can correct.
    io_utils.CorruptFileError: a damaged config.json.
  """


  if kind not in KINDS:
    raise BadInput(f"unknown kind {kind!r}; valid kinds: {', '.join(KINDS)}")
  if not workdir or not os.path.isdir(workdir):
    raise BadInput(f"no run folder at {workdir!r} (--workdir: a folder of "
                   "python -m experiments.train)")
  stored = workdir_lib.stored_config(workdir)
  if stored is None:
    raise BadInput(f"{workdir} has no {workdir_lib.CONFIG_FILE}: not a run of "
                   "python -m experiments.train")
  config = ml_collections.ConfigDict(stored)
  if not checkpoints.Checkpoints(os.path.abspath(workdir)).steps():
    raise BadInput(f"no checkpoint in {os.path.join(workdir, 'checkpoints')}: train the run "
                   "first")
  if config.task not in tasks_lib.TASKS:
    raise BadInput(f"task {config.task!r} is not a generated task of lengths; the analysis "
                   f"takes runs of: {', '.join(tasks_lib.NAMES)}")
  task = tasks_lib.get(config.task)
  try:
    model = steps.build_model(config, task)
  except ValueError as e:
    raise BadInput(cli.one_line(e)) from None
  if not isinstance(model, encoder.EncoderModel):
    raise BadInput(f"the analysis takes the paper's encoder (model.name='encoder'), got "
                   f"{model.description}")

  t, e = config.training, config.evaluation
  if length is None:
    length = t.max_length
  if not t.min_length <= length <= t.max_length:
    raise BadInput(f"--length={length} is not a training length of this run "
                   f"({t.min_length}..{t.max_length})")
  if beyond_length is None:
    beyond_length = min(3 * t.max_length, e.max_length)
    if beyond_length <= t.max_length:
      raise BadInput(f"the run evaluates no length beyond its training lengths (up to "
                     f"{t.max_length}); choose one with --beyond_length")
  if beyond_length <= t.max_length:
    raise BadInput(f"--beyond_length={beyond_length} must exceed the longest training length "
                   f"{t.max_length}")
  try:
    model.check_sequence_length(data.sequence_length(task, beyond_length),
                                f"--beyond_length={beyond_length}")
  except ValueError as e:
    raise BadInput(cli.one_line(e)) from None
  if num_sequences < 1:
    raise BadInput(f"--num_sequences must be >= 1, got {num_sequences}")
  members = steps.grid_members(config)
  if not 0 <= member < len(members):
    raise BadInput(f"--member={member}: the run has {len(members)} model(s) "
                   f"(0..{len(members) - 1})")
  out = out or os.path.join(workdir, OUT_FOLDER)
  return Run(workdir, config, task, model, kind, length, beyond_length, num_sequences, member,
             members, seed, out)


# --------------------------------------------------------------------------
# Probing: the model's own intermediates.


def make_probe(model, attention: bool, activations: bool):
  """probe(params, key, tokens, targets, mask, length, input_length, source) -> arrays.

  One program serves every length of a padded shape, as in evaluation: tokens [B, P] hold
  `length` real tokens (traced), the rest padding masked out of attention; positions are
  drawn for the true length with the evaluation sampler (padded, the first `length` equal
  the unpadded draw), so the numbers equal those of the unpadded sequences. targets/mask
  [B, O] are the outputs from `input_length` (padded outputs masked); source [P] the token
  each query should read (-1: none; `expected_source`, padded with -1). The forward pass is
  the evaluator's (`experiments.training.evaluation.predict_padded`), positions from the first and
  dropout (where it runs at evaluation) from the second half of `jax.random.split(key)`,
  with the model's intermediates (`EncoderModel.apply(..., intermediates=True)`).

  Returns (jit it): "accuracy" on the output tokens; with `activations`, "activations"
  [N + 1, B, P, M] (the embeddings as layer 0 sees them, then every layer's output); with
  `attention`, "maps" [N, P, P] (per layer, the max over heads for the first sequence) and
  "stats" (`probes.attention_stats` over the real query rows, [N, H] each). Host code crops
  the padding.
  """


  def probe(params, key, tokens, targets, mask, length, input_length, source):
    pos_key, dropout_key = jax.random.split(key)
    real = jnp.arange(tokens.shape[1]) < length  # [P]
    predictions, intermediates = evaluation.predict_padded(
        model, params, pos_key, dropout_key, tokens, length, input_length, targets.shape[1],
        intermediates=True)
    correct = (predictions == targets) & mask
    out = {"accuracy": jnp.sum(correct) / jnp.maximum(jnp.sum(mask), 1)}
    if activations:
      out["activations"] = jnp.stack([intermediates.embeddings, *intermediates.layers])
    if attention:
      weights = intermediates.attention  # Per layer [B, H, P, P].
      stats = [probes.attention_stats(w, source, real) for w in weights]
      out.update(maps=jnp.stack([jnp.max(w[0], axis=0) for w in weights]),
                 stats={name: jnp.stack([s[name] for s in stats]) for name in stats[0]})
    return out

  return probe


def probe_inputs(task, n: int, num_sequences: int, seed: int, padded_tokens: int,
                 padded_outputs: int):
  """The arguments of a probe after (params, key) for `num_sequences` samples of length n:
  tokens and targets padded as evaluation pads them, and the expected source (-1: none)."""


  batch = data.make_batch(task, jax.random.fold_in(jax.random.PRNGKey(seed), n),
                          num_sequences, n)
  length = int(batch["sequence_length"][0])
  input_length = length - int(batch["output_length"][0])
  batch = data.pad_batch(task, batch, padded_tokens, padded_outputs, num_sequences)
  source = np.full(padded_tokens, -1, np.int32)
  expected = expected_source(task, n)
  if expected is not None:
    source[:length] = expected
  return (batch["tokens"], batch["targets"], batch["mask"], np.int32(length),
          np.int32(input_length), source)


# --------------------------------------------------------------------------
# Figures.


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def plot_attention(maps: dict, input_lengths: dict, path: str, title: str) -> None:
  """maps: {length: [N, T, T]}; a row per length, a column per layer."""
  plt = _pyplot()
  lengths = list(maps)
  num_layers = maps[lengths[0]].shape[0]
  fig, axes = plt.subplots(len(lengths), num_layers, squeeze=False, layout="constrained",
                           figsize=(max(2.6 * num_layers + 1.2, 5.0), 2.7 * len(lengths) + 0.6))
  for row, n in enumerate(lengths):
    for layer in range(num_layers):
      ax = axes[row][layer]
      image = ax.imshow(maps[n][layer], vmin=0.0, vmax=1.0, cmap="viridis",
                        interpolation="nearest")
      boundary = input_lengths[n] - 0.5  # Inputs, then the empty output tokens.
      ax.axhline(boundary, color="white", linewidth=0.6, linestyle="--")
      ax.axvline(boundary, color="white", linewidth=0.6, linestyle="--")
      ax.set_title(f"layer {layer}, length {n}", fontsize=8)
      ax.set_xlabel("key (token)", fontsize=7)
      ax.set_ylabel("query (token)", fontsize=7)
      ax.tick_params(labelsize=6)
  fig.colorbar(image, ax=[a for r in axes for a in r], shrink=0.8,
               label="max over heads of the attention weight")
  fig.suptitle(title, fontsize=8)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_pca(projections: list, names: list, lengths: tuple, path: str, title: str) -> None:
  """projections: per panel (training [N, 2], beyond [N', 2])."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(names), squeeze=False, layout="constrained",
                           figsize=(max(2.8 * len(names), 5.0), 3.2))
  for ax, name, (inside, beyond) in zip(axes[0], names, projections):
    ax.scatter(beyond[:, 0], beyond[:, 1], s=3, alpha=0.35, color="tab:orange",
               label=f"length {lengths[1]}", linewidths=0)
    ax.scatter(inside[:, 0], inside[:, 1], s=3, alpha=0.35, color="tab:blue",
               label=f"length {lengths[0]} (fit)", linewidths=0)
    ax.set_title(name, fontsize=8)
    ax.set_xlabel("PC 1", fontsize=7)
    ax.set_ylabel("PC 2", fontsize=7)
    ax.tick_params(labelsize=6)
  axes[0][0].legend(fontsize=6, markerscale=3)
  fig.suptitle(title, fontsize=8)
  fig.savefig(path, dpi=110)
  plt.close(fig)


# --------------------------------------------------------------------------
# The analysis.


def _head_summary(values) -> dict:
  values = np.asarray(values, np.float64)
  return {"max_over_heads": float(values.max()), "mean_over_heads": float(values.mean()),
          "per_head": values.tolist()}


def pca_numbers(inside: np.ndarray, beyond: np.ndarray):
  """(fit on `inside` [N, M] only, its numbers, (inside, beyond) projected [., 2])."""

  fit = probes.fit_pca(inside)
  distances = probes.cloud_distances(inside, beyond, fit)
  numbers = {"explained_variance_ratio": fit.explained_variance_ratio.tolist(),
             "spread": distances["spread"],
             "nearest_training_distance": distances["nearest_training_distance"],
             "centroid_shift": distances["centroid_shift"],
             "mahalanobis_2d": {"training": distances["mahalanobis_2d"]["training"],
                                "beyond": distances["mahalanobis_2d"]["other"]}}
  return fit, numbers, (probes.project(fit, inside), probes.project(fit, beyond))


def run_analysis(run: Run, progress: Callable[[str], None] = lambda s: None) -> dict:
  """Restores the run's newest checkpoint, probes it at both lengths, writes the figures and
  analysis.json into run.out, and returns the JSON's content."""

  attention = run.kind in ("attention", "all")
  activations = run.kind in ("pca", "all")
  restored = trained_run.restore_run(run.workdir)
  params = restored.params(run.member)
  step = int(np.asarray(restored.state.step)[run.member])
  lengths = {"training": run.length, "beyond": run.beyond_length}
  seed, rate = run.members[run.member]
  result = {
      "workdir": os.path.abspath(run.workdir), "step": step, "task": run.config.task,
      **run.model.record,
      "member": {"index": run.member, "seed": seed, "learning_rate": rate},
      "num_sequences": run.num_sequences, "lengths": lengths,
      "sequence_tokens": {k: data.sequence_length(run.task, n) for k, n in lengths.items()},
      "positions": run.model.config.eval_sampler.name, "accuracy": {}}
  probes_out = {}
  # Both lengths padded to the longer one's shape: one compiled program.
  probe = jax.jit(make_probe(run.model, attention, activations))
  padded_tokens = data.sequence_length(run.task, run.beyond_length)
  padded_outputs = max(run.task.output_length(n) for n in lengths.values())
  for which, n in lengths.items():
    inputs = probe_inputs(run.task, n, run.num_sequences, run.seed, padded_tokens,
                          padded_outputs)
    key = jax.random.fold_in(jax.random.PRNGKey(run.seed + 1), n)
    progress(f"probing {run.num_sequences} sequences of length {n}")
    out = jax.device_get(probe(params, key, *inputs))
    tokens = result["sequence_tokens"][which]  # Crop the padding.
    if "maps" in out:
      out["maps"] = out["maps"][:, :tokens, :tokens]
    if "activations" in out:
      out["activations"] = out["activations"][:, :, :tokens]
    probes_out[which] = out
    result["accuracy"][which] = float(out["accuracy"])

  os.makedirs(run.out, exist_ok=True)
  # The encoder's own config (the analysis takes the encoder only).
  title = (f"{run.config.task}, {run.model.label} ({run.model.config.compat}), step {step}"
           + (f", model {run.member}" if len(run.members) > 1 else ""))
  if attention:
    entry = EXPECTED_SOURCES.get(run.task.name)
    layers = []
    for layer in range(run.model.config.num_layers):
      record = {"layer": layer}
      for which in lengths:
        stats = probes_out[which]["stats"]
        numbers = {name: _head_summary(values[layer]) for name, values in stats.items()}
        if run.task.name in ALIASES and "expected_source_mass" in numbers:
          numbers[ALIASES[run.task.name]] = numbers["expected_source_mass"]
        record[which] = numbers
      layers.append(record)
    path = os.path.join(run.out, "attention.png")
    plot_attention({n: probes_out[w]["maps"] for w, n in lengths.items()},
                   {n: run.task.input_length(n) for n in lengths.values()}, path,
                   f"{title}\nmax over heads of the attention weights (first sequence)")
    result["attention"] = {
        "figure": path, "expected_source": entry[0] if entry else None, "layers": layers}
  if activations:
    names = ["embeddings"] + [f"layer {i}" for i in range(run.model.config.num_layers)]
    panels, numbers = [], []
    for i, name in enumerate(names):
      inside = probes_out["training"]["activations"][i].reshape(
          -1, run.model.config.d_model)
      beyond = probes_out["beyond"]["activations"][i].reshape(-1, run.model.config.d_model)
      _, layer_numbers, projected = pca_numbers(inside, beyond)
      panels.append(projected)
      numbers.append({"activations": name, **layer_numbers})
    path = os.path.join(run.out, "pca.png")
    plot_pca(panels, names, (run.length, run.beyond_length), path,
             f"{title}\n2-D PCA fitted on length {run.length}, length {run.beyond_length} "
             "projected with the same fit")
    result["pca"] = {"figure": path, "fitted_on": "training", "layers": numbers}
  io_utils.write_json(os.path.join(run.out, JSON_FILE), result)
  return result


def summary(result: dict) -> str:
  """The printed report of `run_analysis`'s result."""
  n, m = result["lengths"]["training"], result["lengths"]["beyond"]
  acc = result["accuracy"]
  lines = [f"accuracy on {result['num_sequences']} sequences: {acc['training']:.3f} at length "
           f"{n} (training), {acc['beyond']:.3f} at length {m} (beyond)"]
  if "attention" in result:
    a = result["attention"]
    source = a["expected_source"]
    head = ["layer"]
    if source:
      head += [f"source mass {n}", f"source mass {m}"]
    head += [f"entropy {n}", f"entropy {m}", f"distance {n}", f"distance {m}"]
    rows = []
    for layer in a["layers"]:
      row = [str(layer["layer"])]
      if source:
        row += [f"{layer[w]['expected_source_mass']['max_over_heads']:.3f}"
                for w in ("training", "beyond")]
      row += [f"{layer[w]['entropy']['mean_over_heads']:.2f}" for w in ("training", "beyond")]
      row += [f"{layer[w]['mean_distance']['mean_over_heads']:.2f}"
              for w in ("training", "beyond")]
      rows.append(row)
    lines.append("attention" + (f" (source mass: max over heads; {source})" if source else "")
                 + ":")
    lines.append(_markdown(head, rows))
  if "pca" in result:
    head = ["activations", "nearest training point / spread", "centroid shift / spread",
            f"mahalanobis 2-D {n}", f"mahalanobis 2-D {m}"]
    rows = [[p["activations"], f"{p['nearest_training_distance']:.3f}",
             f"{p['centroid_shift']:.3f}", f"{p['mahalanobis_2d']['training']:.2f}",
             f"{p['mahalanobis_2d']['beyond']:.2f}"] for p in result["pca"]["layers"]]
    lines.append(f"PCA fitted on length {n}; length {m} projected with the same fit:")
    lines.append(_markdown(head, rows))
  return "\n".join(lines)


def _markdown(head, rows) -> str:
  out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1))
         + "|"]
  return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


# --------------------------------------------------------------------------
# The command line.
