"""The analyses and the report of Ito et al. 2024 (experiments/ito_analysis.py,
experiments/ito_report.py): each metric on a hand-computed case, the paper's numbers
against the texts they were copied from, the report on fixture runs, and the analysis
entry point end to end on tiny trained runs (one block, width 16: each compiled program
costs seconds).
"""
import json
import math
import os
import shutil

import numpy as np
import pytest

from configs import latin_square as ito_config
from experiments.analysis import ito as ia
from experiments.analysis import ito_tables as ito_report
from experiments.training import jobs as sweep
from tests import entry_points

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
SHARED = os.path.join(ROOT, "..", "shared")


def _cli(module, *args, timeout=300):
  return entry_points.run(module, args, env=ENV, timeout=timeout)


def _one_line_error(out, *fragments):
  lines = [l for l in out.stderr.splitlines() if l.strip()]
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


# --------------------------------------------------------------------------
# The metrics.


def test_attention_cosine_and_jensen_shannon_of_two_tiny_maps():
  a = np.array([[1.0, 0.0], [0.0, 1.0]])  # Two query rows, each a distribution.
  b = np.array([[0.5, 0.5], [0.0, 1.0]])
  # a.b = 1.5, |a| = sqrt(2), |b| = sqrt(1.5): cos = 1.5 / sqrt(3) = sqrt(3) / 2.
  assert ia.attention_cosine(a, b) == pytest.approx(math.sqrt(3) / 2, abs=1e-12)
  # Row 1: m = (0.75, 0.25); KL(p||m) = log2(4/3), KL(q||m) = 0.5 log2(2/3) + 0.5;
  # JSD = their mean. Row 2 is identical (0). The mean over rows:
  row1 = 0.5 * math.log2(4 / 3) + 0.5 * (0.5 * math.log2(2 / 3) + 0.5)
  assert ia.attention_js(a, b) == pytest.approx(row1 / 2, abs=1e-12)
  assert ia.attention_js(a, a) == pytest.approx(0.0, abs=1e-12)
  assert ia.attention_cosine(b, b) == pytest.approx(1.0)
  # Against a reference run: a model is not compared with itself; same_seed pairs seeds.
  maps = np.stack([a, b])
  assert ia.similarity_to_reference(maps, maps, ia.attention_cosine, same_run=True) == \
      pytest.approx([math.sqrt(3) / 2] * 2)
  other = ia.similarity_to_reference(maps, maps[::-1], ia.attention_js, same_run=False,
                                     pairing="same_seed", seeds=[1, 2],
                                     reference_seeds=[2, 1])
  assert other == pytest.approx([0.0, 0.0])


def test_puzzle_mean_cosine_ignores_which_puzzle_a_map_belongs_to():
  rng = np.random.default_rng(0)
  a, b = rng.random((2, 2, 3, 4, 4))  # [layers, puzzles, T, T]
  a /= a.sum(-1, keepdims=True)
  b /= b.sum(-1, keepdims=True)
  means = a.mean(axis=1).ravel(), b.mean(axis=1).ravel()
  oracle = means[0] @ means[1] / np.linalg.norm(means[0]) / np.linalg.norm(means[1])
  assert ia.attention_cosine_puzzle_mean(a, b) == pytest.approx(oracle, abs=1e-12)
  shuffled = a[:, [2, 0, 1]]  # The same maps given to other puzzles.
  assert ia.attention_cosine_puzzle_mean(shuffled, b) == pytest.approx(oracle, abs=1e-12)
  assert ia.attention_cosine(shuffled, b) != pytest.approx(ia.attention_cosine(a, b))
  # Maps that disagree on every puzzle but share their average: 0 flat, 1 averaged.
  first, second = np.eye(2)[[0]][None], np.eye(2)[[1]][None]  # [1 puzzle, 1 row, 2 keys]
  a, b = np.concatenate([first, second]), np.concatenate([second, first])
  assert ia.attention_cosine(a, b) == pytest.approx(0.0)
  assert ia.attention_cosine_puzzle_mean(a, b) == pytest.approx(1.0)


def test_procrustes_of_a_rotation_and_of_a_known_pair():
  rng = np.random.default_rng(0)
  matrix = rng.normal(size=(16, 8))
  rotation, _ = np.linalg.qr(rng.normal(size=(8, 8)))
  assert ia.procrustes_distance(matrix @ rotation, matrix) == pytest.approx(0.0, abs=1e-9)
  # Standardised: a rotated, scaled and shifted copy is the same configuration.
  assert ia.procrustes_disparity(3 * matrix @ rotation + 1, matrix) == pytest.approx(0.0,
                                                                                     abs=1e-9)
  # Raw: diag(2, 1) onto I; the best rotation is I, ||diag(1, 0)||_F = 1 (also after
  # rotating the first matrix: the distance does not see rotations).
  assert ia.procrustes_distance(np.diag([2.0, 1.0]), np.eye(2)) == pytest.approx(1.0)
  turn = np.array([[math.cos(0.3), -math.sin(0.3)], [math.sin(0.3), math.cos(0.3)]])
  assert ia.procrustes_distance(np.diag([2.0, 1.0]) @ turn, np.eye(2)) == pytest.approx(1.0)
  # Standardised by hand: T = [[1,0],[-1,0],[0,0]], P = [[1,0],[-1,0],[0,1]]. Centred and
  # scaled, T_s^T P_s = (sqrt(3)/4) [[2, 0], [0, 0]]: singular values sqrt(3)/2 and 0,
  # disparity = 1 - (sqrt(3)/2)^2 = 1/4.
  target = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]])
  learned = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
  assert ia.procrustes_disparity(learned, target) == pytest.approx(0.25)


def test_comparison_with_people_on_four_puzzles():
  model = [1.0, 0.5, 1.0, 0.0]
  human = [0.9, 0.6, 0.8, 0.2]
  got = ia.human_similarity(model, human)
  cosine = 2.0 / (1.5 * math.sqrt(1.85))  # m.h = 2, |m| = 1.5, |h| = sqrt(1.85).
  # Ranks (3.5, 2, 3.5, 1) and (4, 2, 3, 1): covariance 4.5 / sqrt(4.5 * 5) = sqrt(0.9).
  assert got["cosine"] == pytest.approx(cosine)
  assert got["spearman"] == pytest.approx(math.sqrt(0.9))
  assert got["composite"] == pytest.approx((cosine + math.sqrt(0.9)) / 2)
  perfect = ia.human_similarity([1.0] * 4, human)  # A constant model: no rank correlation.
  assert perfect["spearman"] is None and perfect["composite"] is None
  assert perfect["cosine"] == pytest.approx(2.5 / (2 * math.sqrt(1.85)))
  assert ia.spearman([0.1, 0.2, 0.3], [0.9, 0.5, 0.4])["rho"] == pytest.approx(-1.0)
  assert ia.spearman([0.1, 0.2, None], [0.9, 0.5, 0.4]) is None  # Fewer than 3 levels.
  stats = ia.summary([0.5, 0.7, float("nan"), 0.9], keep=[True, True, True, False])
  assert (stats["mean"], stats["count"]) == (pytest.approx(0.6), 2)
  assert stats["sd"] == pytest.approx(np.std([0.5, 0.7], ddof=1))


def test_sweep_job_scores_of_either_record():
  per_length = {"scores": {"train_range": 1.0, "unseen": 0.5}, "accuracy": [1.0, 0.5]}
  per_split = {"accuracy": {"test": {"overall": 0.9, "binary": 1.0},
                            "validation": {"overall": 0.8, "binary": 0.7}}}
  assert sweep._model_scores(per_length) == {"train_range": 1.0, "unseen": 0.5}
  assert sweep._model_scores(per_split) == {"test": 0.9, "validation": 0.8}


# --------------------------------------------------------------------------
# The paper's numbers.


def _paper_name(label):
  return {"2d_fixed": "2d-fixed", "1d_fixed": "1d-fixed", "c_nope": "c-nope"}.get(label, label)


def _pair(value):
  return f"{value[0]:.3f}" + ("" if value[1] is None else f" ± {value[1]:.3f}")


def test_paper_numbers_match_their_sources():
  paper = ito_report.load_paper()
  # The copy of Tables 1, 2 and 6 that experiments/paper_numbers/paper_results.json already holds.
  with open(os.path.join(ROOT, "experiments", "paper_numbers", "paper_results.json")) as f:
    older = json.load(f)["latin_square_ito2024"]
  names = {"learned_init_0.2": "learn-0.2", "causal_nope": "c_nope"}
  for name, (mean, sd) in older["table1_validation_acc"].items():
    assert paper["table1"]["rows"][names.get(name, name)]["validation"] == [mean, sd]
  for sigma, mean in older["table2_learned_init_sigma_validation_acc"].items():
    assert paper["table2"]["rows"][f"learn-{sigma}"]["validation"][0] == mean
  for name, mean in older["table6_weight_decay_0.1_validation_acc"].items():
    assert paper["table6"]["rows"][names.get(name, name)]["validation"][0] == mean
  # The people of the shipped file (SPEC-EXTENSIONS B6.4).
  from tasks.latin_square import data as lst  # pylint: disable=import-outside-toplevel
  human = lst.human_accuracy()
  conditions = lst.load().validation.conditions
  facts = paper["human_file"]
  assert human.mean() == pytest.approx(facts["mean_accuracy"], abs=5e-4)
  for c, name in enumerate(lst.CONDITIONS):
    assert human[conditions == c].mean() == pytest.approx(facts[name], abs=5e-4)
  assert ia.human_similarity(np.ones(108), human)["cosine"] == pytest.approx(
      facts["perfect_model_cosine"], abs=5e-5)
  # The texts they were copied from, where this checkout has them.
  spec_path = os.path.join(SHARED, "SPEC-EXTENSIONS.md")
  paper_path = os.path.join(SHARED, "seeds", "ito2024.txt")
  if not (os.path.exists(spec_path) and os.path.exists(paper_path)):
    pytest.skip("../shared/SPEC-EXTENSIONS.md or the paper's text is not in this checkout")
  spec = open(spec_path, encoding="utf-8").read()
  text = open(paper_path, encoding="utf-8").read()
  for label, row in paper["table1"]["rows"].items():
    line = f"| {_paper_name(label)} | {_pair(row['validation'])} | {_pair(row['training'])} |"
    assert line in spec, line
  for label, row in paper["table2"]["rows"].items():  # Tables 2 and 3 share lines there.
    sigma = label.split("-")[1]
    cosine = paper["table3"]["rows"][label]["attention_cosine"]
    line = f"| {sigma} | {_pair(row['validation'])} | {_pair(cosine)} |"
    assert line in spec, line
  section = spec.split("#### B7.3a")[1].split("####")[0]
  for label, row in paper["short_training"]["rows"].items():
    name = "2dpe" if label == "2d_fixed" else label
    line = [l for l in section.splitlines() if l.startswith(f"| {name} |")][0]
    for key in paper["short_training"]["columns"]:
      assert _pair(row[key]) in line, (label, key)
  # The per-seed values (the same CSVs, epoch 200) give the rows' means and SDs.
  per_seed = paper["short_training"]["per_seed"]
  assert list(per_seed) == list(paper["short_training"]["rows"])
  for label, models in per_seed.items():
    assert models["seeds"] == [s for s in ito_config.SEEDS if s in models["seeds"]]
    assert len(models["seeds"]) == (14 if label == "learn-0.1" else 15), label
    for key in ("validation_e200", "train_e200"):
      values = models[key]
      assert len(values) == len(models["seeds"]) and all(0 <= v <= 1 for v in values)
      mean, sd = paper["short_training"]["rows"][label][key]
      assert abs(np.mean(values) - mean) <= 5e-4, (label, key)
      if sd is not None:
        assert abs(np.std(values, ddof=1) - sd) <= 5e-4, (label, key)
  for label, row in paper["table4"]["rows"].items():
    sigma = float(label.split("-")[1])
    line = (f"{sigma:.3f} {row['adam'][0]:.3f} {row['adam'][1]:.3f} "
            f"{row['sgd'][0]:.3f} {row['sgd'][1]:.3f}")
    assert line in text, line
  for label, row in paper["table5"]["rows"].items():
    sigma = float(label.split("-")[1])
    line = " ".join(f"{v:.3f}" for v in [sigma, *row["validation"], *row["training"]])
    assert line in text, line
  for label, row in paper["table6"]["rows"].items():
    line = " ".join([_paper_name(label)] + [f"{v:.3f}" for v in
                                            [*row["validation"], *row["training"]]])
    assert line in text, line


# --------------------------------------------------------------------------
# The report on fixture runs.


def _fixture_run(folder, pe, seeds, sigma=1.0, optimizer="adam", rate=1e-4, decay=0.0,
                 records=(), final=None):
  os.makedirs(folder)
  config = {"task": "latin_square", "seed": seeds[0], "grid": {"seeds": list(seeds)},
            "model": {"name": "ito", "pe": pe, "pe_sigma": sigma},
            "training": {"optimizer": optimizer, "learning_rate": rate,
                         "weight_decay": decay, "batch_size": 128}}
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  if final is not None:
    with open(os.path.join(folder, "eval.json"), "w") as f:
      json.dump(final, f)


def _final(epoch, accuracies, diverged=None):
  models = []
  for m in range(len(accuracies["validation"])):
    models.append({"seed": m, "diverged": bool(diverged and diverged[m]),
                   "accuracy": {split: {"overall": values[m]}
                                for split, values in accuracies.items()}})
  return {"epoch": epoch, "splits": list(accuracies), "models": models}


def test_find_runs_leaves_out_unfinished_runs_only_when_asked(tmp_path):
  sweep_dir = tmp_path / "sweep"
  for name, pe, step in (("done", "2d_fixed", 10), ("stopped", "nope", None),
                         ("early", "learn", 4)):
    _fixture_run(str(sweep_dir / name), pe, (1,), sigma=0.2,
                 final=None if step is None else {"step": step})
    config = json.loads((sweep_dir / name / "config.json").read_text())
    config["training"]["steps"] = 10
    (sweep_dir / name / "config.json").write_text(json.dumps(config))
  assert ia.is_finished(str(sweep_dir / "done"))
  assert not ia.is_finished(str(sweep_dir / "stopped"))
  assert not ia.is_finished(str(sweep_dir / "early"))  # eval.json of another step count.
  skipped = []
  assert [r.label for r in ia.find_runs(str(sweep_dir), skipped=skipped)] == ["2d_fixed"]
  assert sorted(os.path.basename(f) for f in skipped) == ["early", "stopped"]
  assert len(ia.find_runs(str(sweep_dir))) == 3  # The report shows unfinished runs too.
  assert len(ia.find_runs(workdirs=[str(sweep_dir / "stopped")], skipped=[])) == 1


def test_report_renders_fixture_runs_with_missing_cells(tmp_path):
  sweep_dir = tmp_path / "sweep"
  paper = ito_report.load_paper()
  _fixture_run(sweep_dir / "2d_fixed", "2d_fixed", [2235, 6312], records=[
      {"step": 12800, "loss": [0.1, 0.05], "accuracy": [0.97, 0.99]},
      {"step": 12800, "epoch": 200.0, "evaluation": {
          "test": {"overall": [0.96, 0.97]}, "validation": {"overall": [0.90, 0.95]}}}],
      final=_final(200.0, {"validation": [0.90, 0.95]}))
  _fixture_run(sweep_dir / "learn-1.0", "learn", [1, 2, 3], records=[
      {"step": 12800, "epoch": 200.0, "evaluation": {
          "validation": {"overall": [0.80, 0.90, 0.10]}}}],
      final=_final(200.0, {"validation": [0.80, 0.90, 0.10]}, diverged=[False, False, True]))
  _fixture_run(sweep_dir / "learn-0.2-wd", "learn", [1, 2], sigma=0.2, optimizer="adamw",
               decay=0.1, final=_final(4000.0, {"train": [1.0, 0.998],
                                                "validation": [0.99, 1.0]}))
  analysis = sweep_dir / "ito_analysis"
  analysis.mkdir()
  (analysis / "analysis.json").write_text(json.dumps({"runs": {
      "learn-1.0": {"epoch": 200.0, "attention_cosine": {"mean": 0.7, "sd": 0.01, "count": 2},
                    "attention_cosine_puzzle_mean": {"mean": 0.8, "sd": 0.02, "count": 2},
                    "seeds": [2235],  # Written when one of the two seeds had finished.
                    "human": {"cosine": 0.9, "spearman": 0.3, "composite": 0.6}}},
      "sigma_curves": {"adam": {"spearman_attention_cosine_vs_accuracy": {
          "rho": 0.9, "p": 0.04, "levels": 5}}}}))
  out = _cli("experiments.ito_report", f"--sweep_dir={sweep_dir}", "--epoch=200")
  assert out.returncode == 0, out.stderr[-2000:]
  text = (sweep_dir / "ito_report" / "report.md").read_text()
  assert text in out.stdout
  # Table 1 at epoch 200: ours (two seeds) beside the paper's; runs we lack are missing.
  assert ("| 2d_fixed | 0.925 ± 0.035 (2) | 0.977 ± 0.073 | 0.980 ± 0.014 (2) | "
          "1.000 ± 0.000 |") in text
  assert "| relative | – | 0.920 ± 0.042 | – | 1.000 ± 0.000 |" in text
  # The diverged model is left out; no training record: missing.
  assert "| learn-1.0 | 0.850 ± 0.071 (2) | 0.894 ± 0.043 | – | 1.000 ± 0.000 |" in text
  # The analysis at epoch 200 fills Table 3; other numbers name their epoch.
  assert "| learn-1.0 | 0.700 ± 0.010 (2) | 0.800 ± 0.020 (2) | 0.685 ± 0.015 |" in text
  assert "The analysis predates finished runs: learn-1.0 (1 of 2 seeds)" in text
  assert "| learn-0.2 | – | – | 0.838 ± 0.016 |" in text
  assert "0.900 (5 σ levels) | 0.96 |" in text
  # B7.3a: epoch 200 filled, epoch 400 and 4000 missing.
  assert ("| 2d_fixed | 0.925 ± 0.035 (2) | 0.938 ± 0.130 | – | 0.960 ± 0.094 | – | "
          "0.977 ± 0.073 | 0.965 ± 0.007 (2) | 0.961 ± 0.058 | 0.980 ± 0.014 (2) | "
          "0.977 ± 0.031 |") in text
  # Tables 1-6 are at --epoch: the AdamW run of 4000 epochs is missing at 200...
  assert "| learn-0.2 | – | 0.994 ± 0.008 | – | 1.000 ± 0.000 |" in text
  # ...and present at 4000, its training accuracy from eval.json (marked *).
  table = ito_report.Report(ia.find_runs(str(sweep_dir)), ito_report.load_paper(),
                            None, 4000).markdown()
  assert ("| learn-0.2 | 0.995 ± 0.007 (2) | 0.994 ± 0.008 | 0.999 ± 0.001 (2)* | "
          "1.000 ± 0.000 |") in table
  assert "| 2d_fixed | – | 0.977 ± 0.073 | – | 1.000 ± 0.000 |" in table
  assert "No analysis JSON" in table
  dispatched = ito_report.report_kind(str(sweep_dir), {}, str(tmp_path / "out"))
  assert dispatched["kind"] == "ito" and "| learn-1.0 | 0.700 ± 0.010 (2) |" not in \
      dispatched["text"]  # Tables at epoch 4000: the epoch-200 analysis stays out of Table 3.
  assert (tmp_path / "out" / "report.md").read_text() == dispatched["text"]
  # The figure at epoch 200: each model that did not diverge, beside the authors' B7.3a.
  figure = sweep_dir / "ito_report" / "figures" / "validation_epoch200.png"
  assert figure.stat().st_size > 10_000
  assert text.endswith("(figures/validation_epoch200.png)\n")
  points = ito_report.Report(ia.find_runs(str(sweep_dir)), paper, None, 200).validation_points()
  rows = paper["short_training"]["rows"]
  models = paper["short_training"]["per_seed"]
  assert points == {
      "2d_fixed": {"ours": [0.90, 0.95], "paper": rows["2d_fixed"]["validation_e200"],
                   "paper_models": models["2d_fixed"]["validation_e200"]},
      "learn-1.0": {"ours": [0.80, 0.90], "paper": rows["learn-1.0"]["validation_e200"],
                    "paper_models": models["learn-1.0"]["validation_e200"]}}
  assert points["2d_fixed"]["paper"] == [0.938, 0.130]
  # At epoch 4000 no Adam run has a value: no figure, no link.
  assert "![" not in dispatched["text"]
  assert not (tmp_path / "out" / "figures" / "validation_epoch4000.png").exists()
  bad = _cli("experiments.ito_report", f"--sweep_dir={tmp_path / 'nowhere'}")
  _one_line_error(bad, "no sweep folder at")


# --------------------------------------------------------------------------
# The analysis entry point on tiny trained runs.


def _train_tiny(workdir, learning_rate):
  from configs import latin_square  # pylint: disable=import-outside-toplevel
  from experiments.training import loop  # pylint: disable=import-outside-toplevel

  config = latin_square.get_config(f"encoding=learn,sigma=0.2,seeds=2,scale=small,"
                                   f"lr={learning_rate}")
  config.model.update(num_layers=1, d_model=16, mlp_size=32)
  config.training.update(steps=2, log_every=1, checkpoint_every=2)
  config.evaluation.final_splits = ("validation",)
  config.progress = False
  return loop.train_and_evaluate(config, str(workdir))


def test_the_analysis_forward_is_the_models_and_the_evaluators():
  """The analysis reads the attention maps and the embedding noise from the model's own
  apply (intermediates, embedding_noise), through the evaluator's predict_classes: its
  classes are the evaluator's; noise of 0 changes nothing; a constant noise vector is the
  embedding layer's bias moved by it; the maps are the model's attention weights."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from experiments.training import evaluation  # pylint: disable=import-outside-toplevel
  from randomized_pe.models import ito  # pylint: disable=import-outside-toplevel

  model = ito.ItoModel(ito.ItoConfig(pe="learn", d_model=16, mlp_size=32, num_layers=2), 4)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 5, (6, 16)), jnp.int32)
  shift = jnp.linspace(-2.0, 2.0, 16)  # One vector added to every token's embedding.
  dataset = _one_split(tokens)
  key = evaluation.split_key(2, dataset, "validation")

  @jax.jit
  def run(params):
    plain = evaluation.predict_classes(model, params, key, 0, tokens)
    classes, maps = evaluation.predict_classes(model, params, key, 0, tokens,
                                               intermediates=True,
                                               embedding_noise=jnp.zeros((6, 16, 16)))
    positions = evaluation.split_positions(model, key, 16)
    noisy = model.apply(params, None, tokens, positions,
                        embedding_noise=jnp.broadcast_to(shift, (6, 16, 16)))
    moved = dict(params, **{"ito/embed": dict(params["ito/embed"],
                                              b=params["ito/embed"]["b"] + shift)})
    return (plain, classes, maps, model.attention_weights(params, None, tokens, positions),
            noisy, model.apply(moved, None, tokens, positions))

  params = model.init(jax.random.PRNGKey(0), tokens)
  plain, classes, maps, weights, noisy, moved = jax.device_get(run(params))
  np.testing.assert_array_equal(classes, plain)
  np.testing.assert_array_equal(maps, weights)  # [blocks, B, H, T, T]
  assert maps.shape == (2, 6, model.config.num_heads, 16, 16)
  np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(noisy, moved, atol=1e-5, rtol=0)
  assert np.max(np.abs(noisy - jax.device_get(model.apply(params, None, tokens)))) > 1e-3
  # The evaluator's own predictions of the split (seed 2: the key above).
  evaluator = evaluation.SplitEvaluator(model, dataset, batch_size=8)
  np.testing.assert_array_equal(evaluator.predictions(params, "validation", 2), plain)
  assert key.tolist() == jax.random.fold_in(jax.random.PRNGKey(3), 0).tolist()


def _one_split(tokens):
  """A dataset of one split ("validation") holding `tokens`."""
  from experiments.training import data  # pylint: disable=import-outside-toplevel

  examples = data.Examples(np.asarray(tokens), np.zeros(len(tokens), np.int32),
                           np.zeros(len(tokens), np.int32))
  return data.Dataset("one", 5, 4, 16, {"validation": examples}, "validation", ("all",),
                      lambda correct, groups: {"overall": float(np.mean(correct))})


def test_analysis_entry_point_end_to_end(tmp_path):
  # Two runs of learn-0.2 that differ only in the learning rate, which the programs take
  # as an argument: the second run and its analysis load every program from the
  # compilation cache (another encoding would compile its own, tens of seconds here).
  sweep_dir = tmp_path / "sweep"
  other = "learn-0.2 (adam, lr 0.0003, wd 0)"
  finals = {"learn-0.2": _train_tiny(sweep_dir / "a", 1e-4),
            other: _train_tiny(sweep_dir / "b", 3e-4)}
  (sweep_dir / "empty").mkdir()  # Not a run: ignored.
  # A stopped job (checkpoints, no eval.json): left out with a note, not read at its
  # newest checkpoint as if trained (it would also need programs of its own encoding).
  shutil.copytree(sweep_dir / "a", sweep_dir / "stopped")
  (sweep_dir / "stopped" / "eval.json").unlink()
  config = json.loads((sweep_dir / "stopped" / "config.json").read_text())
  config["model"]["pe"] = "nope"
  (sweep_dir / "stopped" / "config.json").write_text(json.dumps(config))
  # --recompute: these runs have no job inputs files, so it changes nothing here; its
  # command line is tested here (tests/test_ito_sweep.py calls the analysis in process).
  out = _cli("experiments.ito_analysis", f"--sweep_dir={sweep_dir}", "--noise_sds=0,0.5",
             "--reference=learn-0.2", "--recompute", timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "skipping 1 unfinished run(s)" in out.stderr and str(sweep_dir / "stopped") in out.stderr
  assert f"| {other} | 2 |" in out.stdout
  result = json.loads((sweep_dir / "ito_analysis" / "analysis.json").read_text())
  assert result["reference"] == "learn-0.2" and set(result["runs"]) == set(finals)
  for label, final in finals.items():
    run = result["runs"][label]
    clean = run["validation_accuracy"]["per_seed"]
    # The clean accuracy is the training loop's evaluation, and noise of SD 0 is clean.
    assert clean == [m["accuracy"]["validation"]["overall"] for m in final["models"]]
    assert run["noise"]["accuracy"][0]["per_seed"] == clean
    assert run["noise"]["sds"] == [0.0, 0.5]
    assert 0 < run["attention_cosine"]["mean"] <= 1 + 1e-9
    assert 0 < run["attention_cosine_puzzle_mean"]["mean"] <= 1 + 1e-9
    assert 0 <= run["attention_js"]["mean"] <= 1
    assert run["human"]["cosine"] > 0 and len(run["human"]["model_accuracy_per_puzzle"]) == 108
    assert run["epoch"] == pytest.approx(2 / 64) and run["seeds"] == [2235, 6312]
    assert 0 < run["procrustes_disparity"]["mean"] < 1
    # Against the 2d-fixed matrix (norm sqrt(16 * 8) for width 16) a small σ is far.
    assert run["procrustes_distance"]["mean"] == pytest.approx(math.sqrt(128), rel=0.2)
    assert len(run["procrustes_distance"]["per_layer"][0]) == 1  # One block.
  assert result["sigma_curves"]["adam"]["sigmas"] == [0.2]
  base = result["uniform_baseline"]  # A uniform map scores below 1, and its JS above 0.
  assert 0 < base["attention_cosine"] < 1 and 0 < base["attention_cosine_puzzle_mean"] <= 1
  assert 0 < base["attention_js"] < 1 and "puzzle mean" in out.stdout
  assert result["sigma_curves"]["adam"]["spearman_attention_cosine_vs_accuracy"] is None
  matrix = result["attention_cosine_matrix"]
  assert matrix["labels"] == ["learn-0.2", other]
  assert matrix["values"][0][1] == pytest.approx(matrix["values"][1][0])
  for figure in ("attention_similarity", "attention_cosine_matrix", "attention_maps",
                 "procrustes", "noise", "human", "sigma_curve_adam"):
    assert (sweep_dir / "ito_analysis" / "figures" / f"{figure}.png").stat().st_size > 1000
  # Bad input: one line, exit code 2, nothing written.
  _one_line_error(_cli("experiments.ito_analysis", f"--sweep_dir={tmp_path / 'nowhere'}"),
                  "no sweep folder at")
  config = json.loads((sweep_dir / "a" / "config.json").read_text())  # An odd encoding:
  config["model"]["pe"] = "alibi"
  (tmp_path / "odd").mkdir()
  (tmp_path / "odd" / "config.json").write_text(json.dumps(config))
  _one_line_error(_cli("experiments.ito_analysis", f"--workdirs={tmp_path / 'odd'}"),
                  "unknown Ito encoding 'alibi'")
  assert not (tmp_path / "ito_analysis").exists()
  with pytest.raises(ValueError, match="unknown Ito encoding 'alibi'"):
    ia.check_encodings(["learn-0.2 (adamw)", "2d_fixed", "alibi"])
