"""The analyses of Ito et al. (2024) on trained Latin-square runs: the runs found in a
folder (find_runs, RunInfo), attention similarity, Procrustes, noise robustness, the
people's comparison and the σ curve, their figures and JSON, and the job output a sweep
job writes from its checkpoints (write_job_inputs). What is measured and the command
line: experiments/ito_analysis.py (python -m experiments.ito_analysis)."""
from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
import sys
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from scipy import linalg
from scipy import spatial
from scipy import stats
from scipy.spatial import distance

from configs import latin_square
from experiments.analysis import figures
from experiments.storage import checkpoints as checkpoints_lib
from experiments.storage import io_utils
from experiments.storage import workdir as workdir_lib
from experiments.training import data
from experiments.training import evaluation
from experiments.training import trained_run
from randomized_pe.models import ito
from tasks.latin_square import data as lst

NOISE_SDS = (0.02, 0.04, 0.06, 0.08, 0.10)  # The paper's (Fig. 5).
REFERENCE = "2d_fixed"
PAIRINGS = ("all", "same_seed")
SPLIT = "validation"
# The optimizer settings of the paper's runs (experiments/paper_numbers/ito2024_results.json):
# name -> (optimizer, learning rate, weight decay). The main results are "adam".
PROTOCOLS = {"adam": ("adam", 1e-4, 0.0), "sgd": ("sgd", 1e-3, 0.0),
             "adamw": ("adamw", 1e-4, 0.1)}
MAIN_PROTOCOL = "adam"


# --------------------------------------------------------------------------
# The metrics (pure numpy / scipy).


def attention_cosine(a, b) -> float:
  """Cosine similarity of two attention maps (any equal shapes), flattened."""

  return float(1.0 - distance.cosine(np.ravel(a).astype(np.float64),
                                     np.ravel(b).astype(np.float64)))


def attention_cosine_puzzle_mean(a, b) -> float:
  """Cosine of two models' attention maps [..., puzzles, T, T] averaged over the puzzles
  first: another reading of the paper's unstated metric (its Fig. 3 shows maps averaged
  over puzzles); it credits a shared average pattern even where the per-puzzle maps
  differ."""

  return attention_cosine(np.mean(np.asarray(a, np.float64), axis=-3),
                          np.mean(np.asarray(b, np.float64), axis=-3))


def attention_js(a, b) -> float:
  """Mean Jensen-Shannon divergence (base 2, in [0, 1]) between the rows of two attention
  maps [..., T] (each row a distribution over the keys): scipy's distance, squared."""

  a = np.asarray(a, np.float64).reshape(-1, np.shape(a)[-1])
  b = np.asarray(b, np.float64).reshape(-1, np.shape(b)[-1])
  return float(np.mean(distance.jensenshannon(a, b, base=2.0, axis=1) ** 2))


def procrustes_distance(learned, target) -> float:
  """||P R - T||_F with R the orthogonal matrix minimising it
  (scipy.linalg.orthogonal_procrustes(P, T)); P, T [N, M], no centring or scaling."""

  learned = np.asarray(learned, np.float64)
  target = np.asarray(target, np.float64)
  rotation, _ = linalg.orthogonal_procrustes(learned, target)
  return float(np.linalg.norm(learned @ rotation - target))


def procrustes_disparity(learned, target) -> float:
  """scipy.spatial.procrustes(T, P)'s disparity: both centred and scaled to Frobenius
  norm 1, P rotated and scaled onto T; the sum of squared differences, in [0, 1]."""

  _, _, disparity = spatial.procrustes(np.asarray(target, np.float64),
                                       np.asarray(learned, np.float64))
  return float(disparity)


def human_similarity(model_accuracy, human_accuracy) -> dict:
  """Per-puzzle model accuracy m against human accuracy h (the paper's Fig. 6):
  {"cosine": m.h / |m||h|, "spearman": rho, "spearman_p", "composite": (cosine + rho) / 2}.
  rho (and so the composite) is None when either vector is constant."""

  m = np.asarray(model_accuracy, np.float64)
  h = np.asarray(human_accuracy, np.float64)
  if m.shape != h.shape:
    raise ValueError(f"model {m.shape} and human {h.shape} accuracies differ in shape")
  norms = np.linalg.norm(m) * np.linalg.norm(h)
  cosine = float(m @ h / norms) if norms > 0 else None
  rho = p = None
  if np.ptp(m) > 0 and np.ptp(h) > 0:
    result = stats.spearmanr(m, h)
    rho, p = float(result.statistic), float(result.pvalue)
  composite = None if cosine is None or rho is None else (cosine + rho) / 2
  return {"cosine": cosine, "spearman": rho, "spearman_p": p, "composite": composite}


def spearman(x, y) -> Optional[dict]:
  """{"rho", "p", "levels"} over paired values (None where either is missing); None for
  fewer than 3 complete pairs or a constant side."""

  pairs = [(a, b) for a, b in zip(x, y) if _finite(a) and _finite(b)]
  if len(pairs) < 3:
    return None
  a, b = np.array(pairs, np.float64).T
  if np.ptp(a) == 0 or np.ptp(b) == 0:
    return None
  result = stats.spearmanr(a, b)
  return {"rho": float(result.statistic), "p": float(result.pvalue), "levels": len(pairs)}


def summary(values, keep=None) -> dict:
  """{"per_seed": values (None kept), "mean", "sd" (ddof 1, as the paper), "count"} over
  the finite values of the kept models."""
  values = [None if not _finite(v) else float(v) for v in values]
  chosen = [v for i, v in enumerate(values)
            if v is not None and (keep is None or keep[i])]
  return {"per_seed": values,
          "mean": float(np.mean(chosen)) if chosen else None,
          "sd": float(np.std(chosen, ddof=1)) if len(chosen) > 1 else None,
          "count": len(chosen)}


def similarity_to_reference(maps, reference, metric, same_run: bool, pairing: str = "all",
                            seeds=None, reference_seeds=None, reference_keep=None) -> list:
  """Per model of `maps` [S, ...], the metric against the reference models [R, ...].

  pairing "all": the mean over the reference models (kept ones, and not the model itself
  when `same_run`); "same_seed": the reference model of the same seed. None where there
  is nothing to compare with.
  """
  if pairing not in PAIRINGS:
    raise ValueError(f"unknown pairing {pairing!r}; valid choices: {', '.join(PAIRINGS)}")
  keep = reference_keep if reference_keep is not None else [True] * len(reference)
  out = []
  for s, own in enumerate(maps):
    if pairing == "same_seed":
      if same_run:
        out.append(None)
        continue
      match = [r for r, seed in enumerate(reference_seeds) if seed == seeds[s] and keep[r]]
    else:
      match = [r for r in range(len(reference)) if keep[r] and not (same_run and r == s)]
    out.append(float(np.mean([metric(own, reference[r]) for r in match])) if match else None)
  return out


def _finite(value) -> bool:
  return value is not None and isinstance(value, (int, float, np.floating, np.integer)) \
      and math.isfinite(float(value))


# --------------------------------------------------------------------------
# Finding runs and naming them (no JAX here: experiments.ito_report uses it too).


@dataclasses.dataclass(frozen=True)
class RunInfo:
  """A workdir of one Latin-square run, from its config.json.

  Attributes:
    workdir: the folder.
    config: its config.json (a dict).
    encoding: model.pe.
    sigma: model.pe_sigma for `learn`, else None.
    protocol: "adam", "sgd" or "adamw" when the optimizer settings are the paper's, else
      a description ("adam, lr 0.001, wd 0").
    label: the encoding ("learn-0.2" for learn), with " (PROTOCOL)" unless it is the
      paper's main one (Adam, lr 1e-4, no decay).
    seeds: the grid's seeds (of every folder, in `parts` order, for a merged run).
    parts: for runs of one label in several folders with disjoint seeds (e.g. one job
      per seed of experiments.sweep), the RunInfo of each folder; () for one folder.
      `workdir` and `config` are then the first part's.
  """

  workdir: str
  config: dict
  encoding: str
  sigma: Optional[float]
  protocol: str
  label: str
  seeds: tuple
  parts: tuple = ()

  @property
  def encoding_label(self) -> str:
    return self.label.split(" (")[0]

  @property
  def workdirs(self) -> tuple:
    return tuple(p.workdir for p in self.parts) if self.parts else (self.workdir,)

  @property
  def folders(self) -> tuple:
    """The single-folder runs this run is made of (itself for one folder)."""
    return self.parts or (self,)


def _protocol(training: dict) -> str:
  optimizer = training.get("optimizer", "adam")
  rate = float(training.get("learning_rate", 0.0))
  decay = float(training.get("weight_decay", 0.0))
  for name, (o, r, d) in PROTOCOLS.items():
    if optimizer == o and math.isclose(rate, r, rel_tol=1e-6) and math.isclose(decay, d):
      return name
  return f"{optimizer}, lr {rate:g}, wd {decay:g}"


def encoding_label(encoding: str, sigma) -> str:
  """"learn-0.2" for the learned encoding of σ 0.2 ("learn-1.0" for 1, as the paper's
  tables), else the encoding's name."""
  if encoding != "learn":
    return encoding
  text = f"{float(sigma):g}"
  return f"learn-{text}" + (".0" if text.isdigit() else "")


def run_info(workdir: str) -> RunInfo:
  """The run in `workdir`; ValueError (one line) if it holds no Latin-square run of Ito's
  model."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise ValueError(f"{workdir} holds no run (no config.json)")
  try:
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path} cannot be read: {e}") from None
  model = config.get("model", {})
  if model.get("name") != "ito":
    raise ValueError(f"{workdir} holds a run of model {model.get('name')!r}, not Ito's "
                     "Latin-square model (model.name='ito')")
  encoding = str(model.get("pe"))
  sigma = float(model.get("pe_sigma", 1.0)) if encoding == "learn" else None
  training = config.get("training", {})
  protocol = _protocol(training)
  label = encoding_label(encoding, sigma)
  if protocol != MAIN_PROTOCOL:
    label += f" ({protocol})"
  seeds = tuple(config.get("grid", {}).get("seeds") or [config.get("seed")])
  return RunInfo(workdir, config, encoding, sigma, protocol, label, seeds)


def is_finished(workdir: str) -> bool:
  """Whether the run in `workdir` finished training: its eval.json is for the configured
  steps (as the sweep decides a job is finished). A stopped run has only checkpoints."""
  try:
    with open(os.path.join(workdir, "eval.json"), encoding="utf-8") as f:
      step = json.load(f).get("step")
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      steps = json.load(f).get("training", {}).get("steps")
  except (OSError, ValueError):
    return False
  return step is not None and step == steps


def find_runs(sweep_dir: str | None = None, workdirs: Sequence[str] = (),
              skipped: list | None = None) -> list[RunInfo]:
  """The runs of a sweep folder (the folder itself, its subfolders, and theirs) or of
  the given workdirs, in label order. ValueError (one line) for a missing folder, a
  workdir without a run, no run at all, or two runs of one label.

  skipped: when a list, the runs of the sweep folder that have not finished training
  (`is_finished`) are left out and their folders appended to it: an analysis of a sweep
  still running should not read a stopped job at its newest checkpoint as if it were
  trained. Given workdirs are always analysed, finished or not."""
  if bool(sweep_dir) == bool(workdirs):
    raise ValueError("give either --sweep_dir or --workdirs")
  if workdirs:
    missing = [w for w in workdirs if not os.path.isdir(w)]
    if missing:
      raise ValueError(f"no run folder at {', '.join(missing)}")
    runs = [run_info(w) for w in workdirs]
  else:
    if not os.path.isdir(sweep_dir):
      raise ValueError(f"no sweep folder at {sweep_dir}")
    candidates = [sweep_dir]
    for name in sorted(os.listdir(sweep_dir)):
      sub = os.path.join(sweep_dir, name)
      if os.path.isdir(sub) and ".replaced-" not in name:
        candidates.append(sub)
        candidates += [os.path.join(sub, n) for n in sorted(os.listdir(sub))
                       if os.path.isdir(os.path.join(sub, n)) and ".replaced-" not in n]
    runs = []
    for folder in candidates:
      if not os.path.isfile(os.path.join(folder, "config.json")):
        continue
      try:
        info = run_info(folder)
      except ValueError:
        continue  # Another model's run in a shared sweep folder.
      if skipped is not None and not is_finished(folder):
        skipped.append(folder)
        continue
      runs.append(info)
    if not runs:
      raise ValueError(f"no Latin-square run of Ito's model (a config.json with "
                       f"model.name='ito') in {sweep_dir} or its subfolders")
  by_label = {}
  for run in runs:
    by_label.setdefault(run.label, []).append(run)
  merged = [group[0] if len(group) == 1 else merge_runs(group) for group in by_label.values()]
  return sorted(merged, key=lambda r: sort_key(r.label))


# Settings runs of one label may differ in when they are merged: the seeds, and what
# changes neither the models nor their evaluation (experiments.storage.workdir.NOT_IDENTITY).
_MERGE_IGNORED = ("seed", "grid.seeds") + workdir_lib.NOT_IDENTITY


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in d.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = json.dumps(value, sort_keys=True)
  return out


def _seed_rank(seed):
  """The seed's place among the original's 15 (configs/latin_square.SEEDS), then others."""
  return (latin_square.SEEDS.index(seed) if seed in latin_square.SEEDS
          else len(latin_square.SEEDS), seed if isinstance(seed, int) else 0)


def merge_runs(group: Sequence[RunInfo]) -> RunInfo:
  """One run of the folders of one label (the same encoding, σ and optimizer setting)
  with disjoint seeds: its models are the union, ordered by the original's seed order.
  ValueError (one line) for a seed given twice or other settings that differ (the
  number of steps, the model, the evaluation: such runs are not one experiment)."""
  group = sorted(group, key=lambda r: (_seed_rank(r.seeds[0]), r.workdir))
  owner = {}
  for run in group:
    for seed in run.seeds:
      if seed in owner:
        raise ValueError(f"two runs of {run.label} both have seed {seed}: {owner[seed]} and "
                         f"{run.workdir}; pass the ones to compare with --workdirs")
      owner[seed] = run.workdir
  ignored = lambda key: any(key == p or key.startswith(p + ".") for p in _MERGE_IGNORED)  # pylint: disable=unnecessary-lambda-assignment
  first = {k: v for k, v in _flat(group[0].config).items() if not ignored(k)}
  for run in group[1:]:
    other = {k: v for k, v in _flat(run.config).items() if not ignored(k)}
    differ = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
    if differ:
      raise ValueError(f"two runs of {run.label} differ in {', '.join(differ[:4])}"
                       f"{' ...' if len(differ) > 4 else ''}: {group[0].workdir} and "
                       f"{run.workdir}; pass the ones to compare with --workdirs")
  head = group[0]
  return dataclasses.replace(head, seeds=tuple(s for r in group for s in r.seeds),
                             parts=tuple(group))


def sort_key(label: str):
  """The paper's order: 2d_fixed, learn-σ by σ, the other encodings, then other
  optimizer settings."""
  order = ["2d_fixed", "learn", "relative", "random", "rope", "1d_fixed", "nope", "c_nope"]
  name, _, protocol = label.partition(" (")
  base, _, sigma = name.partition("-")
  rank = order.index(base) if base in order else len(order)
  return (protocol, rank, float(sigma) if sigma else 0.0, name)


# --------------------------------------------------------------------------
# A run's trained models and what the analyses read from them (JAX).


@dataclasses.dataclass
class Models:
  """A run's models at its newest checkpoint, and what they give on the validation set.

  Attributes:
    info: the run.
    step, epoch: where the checkpoint is.
    keep: bool [S], the models whose loss stayed finite.
    predictions: int [S, N], the clean predicted classes of the N validation puzzles.
    correct: bool [S, N].
    maps: float32 [S, L, N, T, T], attention probabilities (heads averaged).
    terms: float [S, L, T, M] additive position terms, or None (an attention encoding).
    noise: float [S, len(sds)], validation accuracy under embedding noise.
    groups: int [N], each puzzle's condition (an index into the dataset's group_names).
  """

  info: RunInfo
  step: int
  epoch: float
  keep: np.ndarray
  predictions: np.ndarray
  correct: np.ndarray
  maps: np.ndarray
  terms: Optional[np.ndarray]
  noise: np.ndarray
  d_model: int
  grid_size: int
  max_timescale: float
  groups: np.ndarray
  group_names: tuple


def evaluate_models(info: RunInfo, noise_sds=NOISE_SDS, noise_draws: int = 1,
                    noise_seed: int = 0, recompute: bool = False) -> Optional[Models]:
  """A run's predictions, attention maps, position terms and noisy accuracies on the
  validation puzzles, from each folder's JOB_INPUTS file (`write_job_inputs`) where it
  was written from the folder's newest checkpoint with these noise settings (the same
  numbers, without evaluating anything), else from that checkpoint (always, with
  recompute); None if no folder has either.

  A merged run (`RunInfo.parts`) concatenates its folders' models in seed order; folders
  not at the most advanced step (a job still training) are left out with a warning."""
  found = []
  for part in info.folders:
    models = _evaluate_folder(part, noise_sds, noise_draws, noise_seed,
                              use_inputs="fallback" if recompute else "prefer")
    if models is None:
      if info.parts:
        print(f"warning: {part.workdir} left out of {info.label}: no checkpoint and no "
              f"{JOB_INPUTS} yet", file=sys.stderr, flush=True)
      continue
    found.append(models)
  if not found:
    return None
  if not info.parts:
    return found[0]
  step = max(m.step for m in found)
  for m in found:
    if m.step != step:
      print(f"warning: {m.info.workdir} left out of {info.label}: at step {m.step}, "
            f"other folders at {step}", file=sys.stderr, flush=True)
  found = [m for m in found if m.step == step]
  merged = dataclasses.replace(
      info, seeds=tuple(s for m in found for s in m.info.seeds),
      parts=tuple(m.info for m in found))
  head = found[0]
  terms = None if head.terms is None else np.concatenate([m.terms for m in found])
  return dataclasses.replace(
      head, info=merged, keep=np.concatenate([m.keep for m in found]),
      predictions=np.concatenate([m.predictions for m in found]),
      correct=np.concatenate([m.correct for m in found]),
      maps=np.concatenate([m.maps for m in found]), terms=terms,
      noise=np.concatenate([m.noise for m in found]))


# What a sweep job leaves for the analyses in its folder (experiments.sweep,
# `sweep.job_outputs`), computed from its checkpoints right after training, so that a
# results folder committed without checkpoints can still be analysed.
JOB_INPUTS = "ito_analysis_inputs.npz"


def write_job_inputs(workdir: str) -> str:
  """Evaluates the run in `workdir` at its newest checkpoint as the analyses do (the
  default noise settings) and writes WORKDIR/JOB_INPUTS (atomically): the step, the
  seeds, which models stayed finite, the predicted classes, the attention maps
  [S, L, 108, 16, 16] (float32), the position terms and the noisy accuracies. Returns
  the path. ValueError if the run has no checkpoint."""


  info = run_info(workdir)
  models = _evaluate_folder(info, NOISE_SDS, 1, 0, use_inputs="never")
  if models is None:
    raise ValueError(f"{workdir} has no checkpoint to write {JOB_INPUTS} from")
  arrays = {"step": np.int64(models.step), "seeds": np.asarray(info.seeds, np.int64),
            "keep": models.keep, "predictions": models.predictions.astype(np.int8),
            "maps": models.maps.astype(np.float32), "noise": models.noise,
            "noise_sds": np.asarray(NOISE_SDS, np.float64), "noise_draws": np.int64(1),
            "noise_seed": np.int64(0)}
  if models.terms is not None:
    arrays["terms"] = models.terms.astype(np.float32)
  buffer = io.BytesIO()
  np.savez_compressed(buffer, **arrays)
  path = os.path.join(workdir, JOB_INPUTS)
  io_utils.atomic_write_bytes(path, buffer.getvalue())
  return path


def _from_job_inputs(info: RunInfo, noise_sds, noise_draws, noise_seed) -> Optional[Models]:
  """The Models of a folder from its JOB_INPUTS file; None if there is none. ValueError
  if it was written for other seeds or other noise settings (the noise needs the
  checkpoint then)."""
  path = os.path.join(info.workdir, JOB_INPUTS)
  if not os.path.isfile(path):
    return None

  try:
    with np.load(path) as f:
      stored = {k: f[k] for k in f.files}
  except (OSError, ValueError) as e:
    raise ValueError(f"{path} cannot be read: {e}") from None
  if tuple(int(s) for s in stored["seeds"]) != tuple(info.seeds):
    raise ValueError(f"{path} holds seeds {stored['seeds'].tolist()}, its config "
                     f"{list(info.seeds)}")
  same_noise = (np.allclose(stored["noise_sds"], np.asarray(noise_sds, np.float64))
                if len(stored["noise_sds"]) == len(noise_sds) else False)
  if not (same_noise and int(stored["noise_draws"]) == noise_draws
          and int(stored["noise_seed"]) == noise_seed):
    raise ValueError(
        f"{info.workdir} has no checkpoint, and its {JOB_INPUTS} holds the noise at SDs "
        f"{stored['noise_sds'].tolist()}, {int(stored['noise_draws'])} draw(s), seed "
        f"{int(stored['noise_seed'])}: analyse it with those (the defaults)")
  config = ml_collections.ConfigDict(info.config)
  source = data.source(config)
  dataset = source.task
  examples = dataset.splits[SPLIT]
  predictions = stored["predictions"].astype(np.int64)
  model = config.model
  step = int(stored["step"])
  return Models(info=info, step=step, epoch=source.epoch(step),
                keep=stored["keep"].astype(bool), predictions=predictions,
                correct=predictions == examples.answers[None], maps=stored["maps"],
                terms=stored.get("terms"), noise=stored["noise"],
                d_model=int(model.d_model), grid_size=int(model.get("grid_size", 4)),
                max_timescale=float(model.get("max_timescale", 10_000.0)),
                groups=np.asarray(examples.groups), group_names=tuple(dataset.group_names))


def _evaluate_folder(info: RunInfo, noise_sds=NOISE_SDS, noise_draws: int = 1,
                     noise_seed: int = 0, use_inputs: str = "prefer") -> Optional[Models]:
  """One folder's Models from its newest checkpoint (`trained_run.restore_run`) or its
  JOB_INPUTS file; None if it has neither. use_inputs: "prefer" the file when it was
  written from the newest checkpoint with these settings (else the checkpoint),
  "fallback" to it only without a checkpoint, or "never".

  The forward pass is the evaluator's (`evaluation.predict_classes`, as `SplitEvaluator`
  reads the validation split: its key `evaluation.split_key`, the split as one chunk) with
  the model's attention weights (`apply(..., intermediates=True)`) and, for the noise,
  N(0, sd^2) added to the output of the embedding layer (`apply(..., embedding_noise=)`)."""


  if use_inputs not in ("prefer", "fallback", "never"):
    raise ValueError(f"use_inputs={use_inputs!r}: prefer, fallback or never")
  saved = checkpoints_lib.Checkpoints(info.workdir).steps()
  if use_inputs == "prefer" and saved:
    try:
      stored = _from_job_inputs(info, noise_sds, noise_draws, noise_seed)
    except ValueError:  # Other seeds or noise settings: the checkpoint says.
      stored = None
    if stored is not None and stored.step == saved[-1]:
      return stored
  try:
    run = trained_run.restore_run(info.workdir)  # ValueError for an unknown encoding.
  except FileNotFoundError:  # No (readable) checkpoint yet.
    return (None if use_inputs == "never"
            else _from_job_inputs(info, noise_sds, noise_draws, noise_seed))
  config, model, dataset, params = run.config, run.model, run.task, run.state.params
  examples = dataset.splits[SPLIT]
  tokens = jnp.asarray(examples.tokens)  # [N, T]
  split_key = evaluation.split_key(config.evaluation.seed, dataset, SPLIT)
  noise_shape = (*tokens.shape, model.config.d_model)

  def forward(p, key, sd):
    """Predicted classes [N] and attention maps [L, N, T, T] (heads averaged), with
    N(0, sd^2) noise added to the output of the embedding layer (sd 0: none, exactly)."""
    noise = sd * jax.random.normal(key, noise_shape, jnp.float32)
    classes, maps = evaluation.predict_classes(model, p, split_key, 0, tokens,
                                               intermediates=True, embedding_noise=noise)
    return classes, jnp.mean(maps, axis=2)

  # One program for the clean pass and every noise level (sd is an argument).
  forward_fn = jax.jit(jax.vmap(forward, in_axes=(0, 0, None)))
  seeds = [s for s, _ in run.members]

  def keys(*path):
    # Per model from its seed (not its place in the grid), so that a model's noise is
    # the same in a grid and in a run of its own (runs merged from one job per seed).
    root = jax.random.PRNGKey(noise_seed)
    for index in path:
      root = jax.random.fold_in(root, index)
    return jnp.stack([jax.random.fold_in(root, seed) for seed in seeds])

  predictions, maps = forward_fn(params, keys(0), jnp.float32(0.0))
  predictions = np.asarray(predictions)
  correct = predictions == examples.answers[None]
  noise = np.zeros((len(seeds), len(noise_sds)))
  for i, sd in enumerate(noise_sds):
    for draw in range(noise_draws):
      got, _ = forward_fn(params, keys(1, i, draw), jnp.float32(sd))
      noise[:, i] += (np.asarray(got) == examples.answers[None]).mean(axis=1) / noise_draws
  terms = None
  if model.config.encoding.term is not None:
    # At the positions the maps were computed with: the evaluation sampler's (arange for
    # every encoding but randomized_2d, whose term at arange would be 2d_fixed's).
    positions = evaluation.split_positions(model, split_key, tokens.shape[1])
    terms = np.asarray(jax.jit(jax.vmap(model.position_terms, in_axes=(0, None)))(
        params, positions))  # [S, L, T, M]
  return Models(info=info, step=run.step, epoch=run.epoch(),
                keep=~np.asarray(run.state.nonfinite, bool), predictions=predictions,
                correct=correct, maps=np.asarray(maps, np.float32), terms=terms, noise=noise,
                d_model=model.config.d_model, grid_size=model.config.grid_size,
                max_timescale=model.config.max_timescale,
                groups=np.asarray(examples.groups), group_names=tuple(dataset.group_names))


def fixed_2d_term(d_model: int, grid_size: int, max_timescale: float) -> np.ndarray:
  """The 2d-fixed position matrix [T, M] of the original (the Procrustes target)."""

  config = ito.ItoConfig(pe="2d_fixed", d_model=d_model, grid_size=grid_size,
                         max_timescale=max_timescale)
  return np.asarray(ito.grid_sinusoid(config.default_positions(), d_model, max_timescale),
                    np.float64)


# --------------------------------------------------------------------------
# The analyses over runs.


def _cosine_matrix(models: Sequence[Models]) -> dict:
  """Mean cosine between the attention maps of every pair of runs (Fig. 3B): over all
  pairs of kept models (a model not with itself)."""
  flat = []
  owner = []
  for r, m in enumerate(models):
    for s in range(len(m.maps)):
      if m.keep[s]:
        v = m.maps[s].astype(np.float64).ravel()
        flat.append(v / max(np.linalg.norm(v), 1e-30))
        owner.append(r)
  labels = [m.info.label for m in models]
  if not flat or len({v.size for v in flat}) > 1:
    return {"labels": labels, "values": None}
  gram = np.stack(flat) @ np.stack(flat).T
  owner = np.array(owner)
  values = []
  for a in range(len(models)):
    row = []
    for b in range(len(models)):
      block = gram[np.ix_(owner == a, owner == b)]
      if a == b:
        block = block[~np.eye(len(block), dtype=bool)]
      row.append(float(block.mean()) if block.size else None)
    values.append(row)
  return {"labels": labels, "values": values}


def analyse(runs: Sequence[RunInfo], reference: str = REFERENCE, noise_sds=NOISE_SDS,
            noise_draws: int = 1, noise_seed: int = 0, pairing: str = "all",
            log=print, recompute: bool = False) -> tuple[dict, list]:
  """Every analysis over `runs`: (the JSON record, the evaluated Models). recompute:
  evaluate every folder from its checkpoint, even where its JOB_INPUTS file holds the same
  numbers (`evaluate_models`)."""

  if pairing not in PAIRINGS:
    raise ValueError(f"unknown pairing {pairing!r}; valid choices: {', '.join(PAIRINGS)}")
  human = lst.human_accuracy()
  models = []
  for info in runs:
    log(f"evaluating {info.label} ({info.workdir})")
    evaluated = evaluate_models(info, noise_sds, noise_draws, noise_seed, recompute)
    if evaluated is None:
      print(f"warning: skipped {', '.join(info.workdirs)}: no checkpoint and no "
            f"{JOB_INPUTS} yet", file=sys.stderr, flush=True)
      continue
    models.append(evaluated)
  if not models:
    raise ValueError(f"none of the runs has a checkpoint or a {JOB_INPUTS} yet")
  by_label = {m.info.label: m for m in models}
  ref = by_label.get(reference)
  if ref is None:
    print(f"warning: no {reference} run: attention similarity left out", file=sys.stderr,
          flush=True)
  out_runs = {}
  for m in models:
    keep = m.keep
    record = {
        "workdir": m.info.workdir, "workdirs": list(m.info.workdirs),
        "encoding": m.info.encoding, "sigma": m.info.sigma,
        "protocol": m.info.protocol, "step": m.step, "epoch": m.epoch,
        "seeds": list(m.info.seeds), "diverged": [bool(not k) for k in keep],
        "validation_accuracy": summary(m.correct.mean(axis=1), keep),
        "validation_by_condition": {
            name: summary(m.correct[:, m.groups == c].mean(axis=1), keep)
            for c, name in enumerate(m.group_names)},
    }
    for key, metric in (("attention_cosine", attention_cosine),
                        ("attention_cosine_puzzle_mean", attention_cosine_puzzle_mean),
                        ("attention_js", attention_js)):
      if ref is None or ref.maps.shape[1:] != m.maps.shape[1:]:
        record[key] = None
        continue
      record[key] = summary(similarity_to_reference(
          m.maps, ref.maps, metric, same_run=m is ref, pairing=pairing,
          seeds=list(m.info.seeds), reference_seeds=list(ref.info.seeds),
          reference_keep=ref.keep), keep)
    if m.terms is None:
      record["procrustes_distance"] = record["procrustes_disparity"] = None
      record["pe_cosine"] = None
    else:
      target = fixed_2d_term(m.d_model, m.grid_size, m.max_timescale)
      for key, metric in (("procrustes_distance", procrustes_distance),
                          ("procrustes_disparity", procrustes_disparity),
                          ("pe_cosine", attention_cosine)):
        per_layer = [[metric(layer, target) for layer in model_terms] for model_terms in m.terms]
        record[key] = summary([float(np.mean(v)) for v in per_layer], keep)
        record[key]["per_layer"] = per_layer
        record[key]["layer_0"] = summary([v[0] for v in per_layer], keep)
    per_sd = [summary(m.noise[:, i], keep) for i in range(len(noise_sds))]
    record["noise"] = {"sds": list(noise_sds), "draws": noise_draws,
                       "accuracy": per_sd,
                       "mean_over_sds": summary(m.noise.mean(axis=1), keep)}
    kept = m.correct[keep]
    per_puzzle = kept.mean(axis=0) if len(kept) else None
    record["human"] = (None if per_puzzle is None else
                       {**human_similarity(per_puzzle, human),
                        "model_accuracy_per_puzzle": per_puzzle.tolist()})
    out_runs[m.info.label] = record
  result = {
      "reference": reference if ref is not None else None, "pairing": pairing,
      "split": SPLIT, "noise_sds": list(noise_sds), "noise_draws": noise_draws,
      "noise_seed": noise_seed,
      "human": {"file": lst.HUMAN_FILE, "mean_accuracy": float(human.mean()),
                "accuracy_per_puzzle": human.tolist()},
      "runs": out_runs,
      "sigma_curves": sigma_curves(out_runs),
      "attention_cosine_matrix": _cosine_matrix(models),
      # What a map that attends to every token alike scores against the reference: the
      # floor a position-blind model reaches on each reading of the cosine.
      "uniform_baseline": None if ref is None else {
          key: float(np.mean([metric(np.full_like(r, 1.0 / r.shape[-1]), r)
                              for r, k in zip(ref.maps, ref.keep) if k]))
          for key, metric in (("attention_cosine", attention_cosine),
                              ("attention_cosine_puzzle_mean", attention_cosine_puzzle_mean),
                              ("attention_js", attention_js))},
      "methods": {
          "attention": "maps [layers, 108 puzzles, 16, 16], heads averaged; cosine of the "
                       "flattened maps, Jensen-Shannon divergence (base 2) per query row "
                       "averaged; per model the mean over the reference models "
                       f"(pairing={pairing}), a model not with itself; "
                       "attention_cosine_puzzle_mean: the cosine of the maps averaged over "
                       "the puzzles first; uniform_baseline: a uniform map's values",
          "procrustes_distance": "||P R - P_2d||_F, R = scipy.linalg.orthogonal_procrustes"
                                 "(P, P_2d), per block, mean over blocks",
          "procrustes_disparity": "scipy.spatial.procrustes(P_2d, P) disparity (centred, "
                                  "unit norm, rotated and scaled), per block, mean over blocks",
          "pe_cosine": "cosine of each block's position term with the 2d-fixed matrix",
          "noise": "N(0, SD^2) added to the token embeddings (embedding layer output)",
          "human": "cosine and scipy.stats.spearmanr of per-puzzle accuracies, composite "
                   "their mean; model accuracy per puzzle = mean over kept seeds",
          "sd": "ddof 1 over the models whose loss stayed finite"},
  }
  return result, models


def sigma_curves(runs: dict) -> dict:
  """Per optimizer setting with learn-σ runs: the σ levels, their mean validation
  accuracy, attention cosine and Procrustes values, and Spearman's rho over the levels."""
  curves = {}
  for label, r in runs.items():
    if r["encoding"] == "learn":
      curves.setdefault(r["protocol"], []).append((r["sigma"], label))
  out = {}
  for protocol, levels in sorted(curves.items()):
    levels.sort()
    rows = [runs[label] for _, label in levels]

    def means(key, rows=rows):
      return [None if r.get(key) is None else r[key]["mean"] for r in rows]

    accuracy = means("validation_accuracy")
    out[protocol] = {
        "sigmas": [s for s, _ in levels], "labels": [label for _, label in levels],
        "validation_accuracy": accuracy,
        "validation_sd": [r["validation_accuracy"]["sd"] for r in rows],
        "attention_cosine": means("attention_cosine"),
        "attention_cosine_puzzle_mean": means("attention_cosine_puzzle_mean"),
        "attention_js": means("attention_js"),
        "procrustes_distance": means("procrustes_distance"),
        "procrustes_disparity": means("procrustes_disparity"),
        "noise_mean_over_sds": [r["noise"]["mean_over_sds"]["mean"] for r in rows],
        "spearman_attention_cosine_vs_accuracy": spearman(means("attention_cosine"), accuracy),
        "spearman_attention_cosine_puzzle_mean_vs_accuracy": spearman(
            means("attention_cosine_puzzle_mean"), accuracy),
        "spearman_attention_js_vs_accuracy": spearman(means("attention_js"), accuracy),
        "spearman_procrustes_distance_vs_accuracy": spearman(means("procrustes_distance"),
                                                             accuracy),
        "spearman_procrustes_disparity_vs_accuracy": spearman(means("procrustes_disparity"),
                                                              accuracy),
    }
  return out


# --------------------------------------------------------------------------
# Figures and the printed summary.


def _bars(ax, labels, stats, title, baseline=None):
  means = [np.nan if s is None or s["mean"] is None else s["mean"] for s in stats]
  sds = [0.0 if s is None or s["sd"] is None else s["sd"] for s in stats]
  ax.bar(range(len(labels)), means, yerr=sds, capsize=3, color="tab:blue")
  if baseline is not None:
    ax.axhline(baseline, color="grey", linestyle="--", linewidth=1)
    ax.text(len(labels) - 0.5, baseline, "uniform map", color="grey", fontsize=7,
            ha="right", va="bottom")
  ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
  ax.set_title(title, fontsize=10)


def write_figures(result: dict, models: Sequence[Models], folder: str) -> list[str]:
  """The PNG figures of `analyse`'s result; returns their paths."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  os.makedirs(folder, exist_ok=True)
  runs = result["runs"]
  labels = list(runs)
  written = []

  def save(fig, name):
    path = os.path.join(folder, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

  width = max(6.0, 0.45 * len(labels) + 2)
  if result["reference"] is not None:
    base = result.get("uniform_baseline") or {}
    fig, axes = plt.subplots(1, 3, figsize=(3 * width, 4))
    for ax, key, title in (
        (axes[0], "attention_cosine", "attention cosine"),
        (axes[1], "attention_cosine_puzzle_mean", "attention cosine, maps averaged over puzzles"),
        (axes[2], "attention_js", "attention Jensen-Shannon divergence")):
      _bars(ax, labels, [runs[l][key] for l in labels], f"{title} to {result['reference']}",
            base.get(key))
    save(fig, "attention_similarity.png")
  matrix = result["attention_cosine_matrix"]
  if matrix["values"] is not None:
    values = np.array([[np.nan if v is None else v for v in row] for row in matrix["values"]])
    fig, ax = plt.subplots(figsize=(width, width * 0.85))
    image = ax.imshow(values, cmap="viridis")
    ax.set_xticks(range(len(matrix["labels"])), matrix["labels"], rotation=60, ha="right",
                  fontsize=8)
    ax.set_yticks(range(len(matrix["labels"])), matrix["labels"], fontsize=8)
    fig.colorbar(image, ax=ax, label="mean attention cosine")
    save(fig, "attention_cosine_matrix.png")
  layers = max(m.maps.shape[1] for m in models)
  fig, axes = plt.subplots(len(models), layers, figsize=(2.2 * layers, 2.2 * len(models)),
                           squeeze=False)
  for r, m in enumerate(models):
    mean_maps = m.maps[m.keep].mean(axis=(0, 2)) if m.keep.any() else m.maps.mean(axis=(0, 2))
    for layer in range(layers):
      ax = axes[r, layer]
      ax.set_xticks([])
      ax.set_yticks([])
      if layer < len(mean_maps):
        ax.imshow(mean_maps[layer], cmap="magma", vmin=0)
      if layer == 0:
        ax.set_ylabel(m.info.label, fontsize=8)
      if r == 0:
        ax.set_title(f"block {layer}", fontsize=9)
  save(fig, "attention_maps.png")
  with_terms = [l for l in labels if runs[l]["procrustes_distance"] is not None]
  if with_terms:
    fig, axes = plt.subplots(1, 2, figsize=(2 * max(5.0, 0.45 * len(with_terms) + 2), 4))
    _bars(axes[0], with_terms, [runs[l]["procrustes_distance"] for l in with_terms],
          "Procrustes distance to 2d-fixed (raw)")
    _bars(axes[1], with_terms, [runs[l]["procrustes_disparity"] for l in with_terms],
          "Procrustes disparity (standardised)")
    save(fig, "procrustes.png")
  fig, ax = plt.subplots(figsize=(7, 4.5))
  sds = [0.0] + list(result["noise_sds"])
  for l in labels:
    clean = runs[l]["validation_accuracy"]["mean"]
    noisy = [s["mean"] for s in runs[l]["noise"]["accuracy"]]
    ax.plot(sds, [np.nan if v is None else v for v in [clean] + noisy], marker="o", label=l)
  ax.set_xlabel("noise SD added to the token embeddings")
  ax.set_ylabel("validation accuracy")
  ax.legend(fontsize=7, ncol=2)
  save(fig, "noise.png")
  fig, ax = plt.subplots(figsize=(width, 4))
  for k, (key, name) in enumerate((("cosine", "cosine"), ("spearman", "Spearman"),
                                   ("composite", "composite"))):
    values = [np.nan if runs[l]["human"] is None or runs[l]["human"][key] is None
              else runs[l]["human"][key] for l in labels]
    ax.bar(np.arange(len(labels)) + (k - 1) * 0.27, values, width=0.27, label=name)
  ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
  ax.set_title("per-puzzle accuracy against people's (108 validation puzzles)", fontsize=10)
  ax.legend(fontsize=8)
  save(fig, "human.png")
  for protocol, curve in result["sigma_curves"].items():
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    sig = curve["sigmas"]
    acc = [np.nan if v is None else v for v in curve["validation_accuracy"]]
    sd = [0.0 if v is None else v for v in curve["validation_sd"]]
    axes[0].errorbar(sig, acc, yerr=sd, marker="o", capsize=3)
    axes[0].set_xlabel("σ")
    axes[0].set_ylabel("validation accuracy")
    cos = [np.nan if v is None else v for v in curve["attention_cosine"]]
    axes[1].plot(sig, cos, marker="o", label="attention cosine")
    proc = [np.nan if v is None else v for v in curve["procrustes_disparity"]]
    axes[1].plot(sig, proc, marker="s", label="Procrustes disparity")
    axes[1].set_xlabel("σ")
    axes[1].legend(fontsize=8)
    axes[2].scatter(cos, acc)
    rho = curve["spearman_attention_cosine_vs_accuracy"]
    axes[2].set_title("Spearman ρ = " + ("–" if rho is None else f"{rho['rho']:.3f}")
                      + " (paper 0.96)", fontsize=10)
    axes[2].set_xlabel("attention cosine to 2d-fixed")
    axes[2].set_ylabel("validation accuracy")
    fig.suptitle(f"learn-σ, {protocol}")
    save(fig, "sigma_curve_" + re.sub(r"[^A-Za-z0-9.]+", "_", protocol) + ".png")
  return written


def _cell(stats, digits=3) -> str:
  if stats is None or stats.get("mean") is None:
    return "–"
  sd = "" if stats.get("sd") is None else f" ± {stats['sd']:.{digits}f}"
  return f"{stats['mean']:.{digits}f}{sd}"


def summary_markdown(result: dict) -> str:
  """One row per run: the headline number of every analysis (mean ± SD over seeds)."""
  rows = ["| run | seeds | epoch | validation | attention cos | attention cos, puzzle mean "
          "| attention JS | Procrustes (raw) | Procrustes (std.) | noise, mean over SDs | "
          "people: cos / ρ / composite |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
  for label, r in result["runs"].items():
    h = r["human"] or {}
    people = " / ".join("–" if h.get(k) is None else f"{h[k]:.3f}"
                        for k in ("cosine", "spearman", "composite"))
    rows.append(f"| {label} | {r['validation_accuracy']['count']} | {r['epoch']:g} | "
                f"{_cell(r['validation_accuracy'])} | {_cell(r['attention_cosine'])} | "
                f"{_cell(r['attention_cosine_puzzle_mean'])} | "
                f"{_cell(r['attention_js'])} | {_cell(r['procrustes_distance'])} | "
                f"{_cell(r['procrustes_disparity'])} | {_cell(r['noise']['mean_over_sds'])} | "
                f"{people} |")
  lines = ["\n".join(rows)]
  base = result.get("uniform_baseline")
  if base:
    lines.append(f"A uniform map against the reference ({result['reference']}): attention "
                 f"cos {base['attention_cosine']:.3f}, puzzle mean "
                 f"{base['attention_cosine_puzzle_mean']:.3f}, JS {base['attention_js']:.3f}"
                 " (what a position-blind map scores).")
  for protocol, curve in result["sigma_curves"].items():
    rho = curve["spearman_attention_cosine_vs_accuracy"]
    proc = curve["spearman_procrustes_distance_vs_accuracy"]
    lines.append(f"learn-σ ({protocol}, {len(curve['sigmas'])} levels): Spearman ρ of "
                 "attention cosine vs validation accuracy "
                 + ("– (needs 3 levels)" if rho is None else f"{rho['rho']:.3f}")
                 + " (paper 0.96); of Procrustes distance vs accuracy "
                 + ("–" if proc is None else f"{proc['rho']:.3f}") + " (paper -0.977)")
  return "\n\n".join(lines)


def write_analysis(runs: Sequence[RunInfo], out_dir: str, **settings) -> dict:
  """`analyse`, then OUT_DIR/analysis.json and OUT_DIR/figures/; returns the result."""

  result, models = analyse(runs, **settings)
  os.makedirs(out_dir, exist_ok=True)
  result["figures"] = [os.path.relpath(p, out_dir)
                       for p in write_figures(result, models,
                                              os.path.join(out_dir, figures.FOLDER))]
  io_utils.write_json(os.path.join(out_dir, "analysis.json"), result)
  return result


def parse_floats(text: str, what: str) -> tuple:
  try:
    values = tuple(float(v) for v in text.split(",") if v.strip())
  except ValueError:
    raise ValueError(f"{what} must be comma-separated numbers, got {text!r}") from None
  if any(v < 0 or not math.isfinite(v) for v in values):
    raise ValueError(f"{what} must be finite and >= 0, got {text!r}")
  return values


def encoding_of(label: str) -> str:
  """The encoding a run label names: "learn-0.2 (adamw)" -> "learn", "2d_fixed" -> itself."""
  name = label.split(" (")[0].strip()
  return "learn" if re.fullmatch(r"learn-[0-9.eE+-]+", name) else name


def check_encodings(labels) -> None:
  """ValueError (one line) for a label or name of an encoding Ito's model does not have."""

  for label in labels:
    ito.get(encoding_of(label))
