"""Issue 13 part 4: sweep variants, configs/su.py and the variants report."""
import copy
import csv
import json
import os

import ml_collections
import pytest

from configs import su
from configs import table1
from experiments.analysis import tables as report
from experiments.training import jobs as sweep
from experiments.training import validation


@pytest.mark.parametrize("scale", ["small", "full"])
def test_su_config_resolves_and_every_job_validates(scale, tmp_path):
  config = su.get_config(f"scale={scale}")
  jobs = sweep.make_jobs(config, str(tmp_path / "sweep"))  # Validates every job.
  assert len(jobs) == len(config.sweep.tasks) * len(su.VARIANTS) == 66
  assert set(config.sweep.tasks) >= {"reverse_string", "duplicate_string",
                                     "missing_duplicate_string", "even_pairs", "bucket_sort",
                                     "odds_first"}
  for job in jobs:
    validation.validate(ml_collections.ConfigDict(job.config))
  assert not os.path.exists(tmp_path / "sweep")  # Listing jobs writes nothing.
  if scale == "full":  # The paper's protocol.
    job = jobs[0].config
    assert (job["training"]["steps"], job["training"]["max_length"],
            job["evaluation"]["max_length"], job["model"]["max_position"],
            job["model"]["num_layers"]) == (2_000_000, 40, 500, 2048, 5)
  with pytest.raises(ValueError, match="unknown scale"):
    su.get_config("scale=huge")


def test_variants_set_their_overrides_and_folders(tmp_path):
  config = su.get_config("scale=small")
  config.sweep.tasks = ("even_pairs", "bucket_sort")
  config.sweep.encodings = ("relative",)  # Encodings and variants together.
  sweep_dir = str(tmp_path / "sweep")
  jobs = sweep.make_jobs(config, sweep_dir)
  names = ["relative"] + [name for name, _ in su.VARIANTS]
  assert [j.name for j in jobs] == [f"{t}/{n}" for t in ("even_pairs", "bucket_sort")
                                    for n in names]
  by_name = {j.name: j for j in jobs}
  for task in ("even_pairs", "bucket_sort"):
    for name in names:
      job = by_name[f"{task}/{name}"]
      assert job.workdir == os.path.join(os.path.abspath(sweep_dir), task, name)
      assert job.variant == name and job.config["task"] == task
  expected = {  # variant -> (model.pe, training.positions, evaluation.positions, log-n)
      "relative": ("relative", "", "", False),
      "rope": ("rope", "", "", False),
      "sin_cos": ("sin_cos", "", "", False),
      "rope+logn": ("rope", "", "", True),
      "randomized_rope": ("randomized_rope", "", "", False),
      "randomized_rope+even": ("randomized_rope", "", "evenly_spaced", False),
      "randomized_rope+logn": ("randomized_rope", "", "", True),
      "randomized_rope+even+logn": ("randomized_rope", "", "evenly_spaced", True),
      "rope+exp": ("rope", "equal_mean_exponential", "", False),
      "rope+exp+logn": ("rope", "equal_mean_exponential", "", True),
      "rope+beta": ("rope", "equal_mean_beta", "", False),
      "rope+beta+logn": ("rope", "equal_mean_beta", "", True),
  }
  base = config.to_dict()
  for name, (pe, train_pos, eval_pos, log_n) in expected.items():
    job = by_name[f"bucket_sort/{name}"]
    c = job.config
    assert job.pe == pe
    assert (c["model"]["pe"], c["training"]["positions"], c["evaluation"]["positions"],
            c["model"]["log_n_scaling"]) == (pe, train_pos, eval_pos, log_n), name
    # Nothing else differs from the sweep's config.
    changed = {f"{s}.{k}" for s in ("model", "training", "evaluation")
               for k in base[s] if base[s][k] != c[s][k]}
    assert changed <= {"model.pe", "training.positions", "evaluation.positions",
                       "model.log_n_scaling"}, (name, changed)
  # A mapping of nested overrides works too (a ConfigDict sorts the names).
  config.sweep = ml_collections.ConfigDict({"tasks": config.sweep.tasks, "variants": {
      "z_rope_logn": {"model": {"pe": "rope", "log_n_scaling": True}},
      "a_sin_cos": {"model": {"pe": "sin_cos"}}}})
  jobs = sweep.make_jobs(config, sweep_dir)
  assert [j.name for j in jobs] == ["even_pairs/a_sin_cos", "even_pairs/z_rope_logn",
                                    "bucket_sort/a_sin_cos", "bucket_sort/z_rope_logn"]
  assert jobs[1].config["model"]["log_n_scaling"] is True and jobs[1].pe == "rope"
  assert jobs[0].config["model"]["log_n_scaling"] is False


def _old_make_jobs(config, sweep_dir):
  """make_jobs before variants (commit of part 3), kept to compare against."""
  jobs = []
  for task in config.sweep.tasks:
    for pe in config.sweep.encodings:
      job_config = copy.deepcopy(config)
      job_config.task = task
      job_config.model.pe = pe
      validation.validate(job_config)
      jobs.append(sweep.Job(task, pe, os.path.join(os.path.abspath(sweep_dir), task, pe),
                            job_config.to_dict()))
  return jobs


@pytest.mark.parametrize("scale", ["small", "full"])
def test_encodings_only_configs_list_the_same_jobs(scale, tmp_path):
  config = table1.get_config(f"scale={scale}")
  config.sweep.tasks = config.sweep.tasks[:2]
  assert "variants" not in config.sweep
  sweep_dir = str(tmp_path / "sweep")
  new, old = sweep.make_jobs(config, sweep_dir), _old_make_jobs(config, sweep_dir)
  assert len(new) == len(old) == 2 * len(config.sweep.encodings)
  for a, b in zip(new, old):
    assert (a.task, a.pe, a.workdir, a.name) == (b.task, b.pe, b.workdir, b.name)
    assert a.config == b.config  # The same identity: finished jobs stay finished.
    assert a.variant == a.pe


@pytest.mark.parametrize("variants, message", [
    ((("bad/name", {"model.pe": "rope"}),), "'bad/name' is not a valid folder name"),
    ((("..", {"model.pe": "rope"}),), "'..' is not a valid folder name"),
    ((("rope.replaced-1", {"model.pe": "rope"}),), "not a valid folder name"),
    ((("", {"model.pe": "rope"}),), "not a valid folder name"),
    ((("rope", {"model.pe": "rope"}), ("rope", {"model.pe": "rope"})), "given twice"),
    ((("x", {"model.no_such_setting": 1}),),
     "variant 'x' overrides 'model.no_such_setting', but the config has no setting "
     "model.no_such_setting"),
    ((("x", {"modle.pe": "rope"}),), "the config has no setting modle$"),
    ((("x", {"model": "rope"}),), "a section, not a setting"),
    ((("x", {"task": "parity_check"}),), "a variant may not set"),
    ((("x", {"model.log_n_scaling": "yes"}),), "'model.log_n_scaling' with 'yes'"),
    ((("x", {"model.pe": "no_such_pe"}),), "variant 'x' of task even_pairs"),
    ((("x", "rope"),), "must map settings to values"),
])
def test_bad_variants_fail_in_one_line_before_anything_is_written(tmp_path, variants,
                                                                  message):
  config = su.get_config("scale=small")
  config.sweep.tasks = ("even_pairs",)
  config.sweep.variants = variants
  sweep_dir = tmp_path / "sweep"
  with pytest.raises(ValueError, match=message) as error:
    sweep.run_sweep(config, str(sweep_dir), job_fn=_must_not_run)
  assert "\n" not in str(error.value)
  assert not os.path.exists(sweep_dir)


def test_an_encoding_name_clashing_with_a_variant_is_refused(tmp_path):
  config = su.get_config("scale=small")
  config.sweep.encodings = ("rope",)
  with pytest.raises(ValueError, match="'rope' is given twice"):
    sweep.make_jobs(config, str(tmp_path))


def _must_not_run(config_dict, workdir, companions):
  raise AssertionError("no job may run")


def _eval(task, accuracies_by_model, lengths=(1, 2, 3, 4), train=1.0):
  """An eval.json: accuracies_by_model {(seed, rate): (unseen, [per-length accuracy])},
  every model at accuracy `train` on the training lengths."""
  models = [{"seed": seed, "learning_rate": rate, "accuracy": list(per_length),
             "diverged": False, "scores": {"train_range": train, "unseen": unseen}}
            for (seed, rate), (unseen, per_length) in accuracies_by_model.items()]
  return {"task": task, "pe": "rope", "lengths": list(lengths), "training_lengths": [1, 2],
          "models": models, "step": 10}


def _write_job(sweep_dir, task, variant, result, config=None):
  folder = sweep_dir / task / variant
  os.makedirs(folder)
  (folder / "eval.json").write_text(json.dumps(result))
  if config is not None:
    (folder / "config.json").write_text(json.dumps(config))


def test_variant_report_mean_and_std_over_seeds(tmp_path):
  sweep_dir = tmp_path / "sweep"
  curve = lambda u: [1.0, 1.0, u, u]  # pylint: disable=unnecessary-lambda-assignment
  config = su.get_config("scale=small").to_dict()  # Names the variants and their order.
  _write_job(sweep_dir, "reverse_string", "rope+logn", _eval("reverse_string", {
      (0, 1e-3): (0.5, curve(0.5)), (1, 1e-3): (0.7, curve(0.7)),
      (2, 1e-3): (0.9, curve(0.9))}), config)
  # Two learning rates: the one with the best mean (3e-3: 0.65 > 0.6) is reported.
  _write_job(sweep_dir, "reverse_string", "rope", _eval("reverse_string", {
      (0, 1e-3): (0.6, curve(0.6)), (1, 1e-3): (0.6, curve(0.6)),
      (0, 3e-3): (0.4, curve(0.4)), (1, 3e-3): (0.9, curve(0.9))}), config)
  # A model without an unseen score is left out (1 seed remains: std 0).
  _write_job(sweep_dir, "even_pairs", "rope", _eval("even_pairs", {
      (0, 1e-3): (1.0, curve(1.0)), (1, 1e-3): (None, curve(0.0))}), config)
  # ("even_pairs", "rope+logn") is missing: an unfinished job.
  os.makedirs(sweep_dir / "even_pairs" / "rope+logn.replaced-20240101-000000")
  out = report.write_report(str(sweep_dir))  # kind=auto: config.json names variants.
  assert out["kind"] == "variants"
  lines = out["table"].splitlines()
  table = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[4:]]
  assert table[0] == ["task", "rope", "rope+logn"]  # The config's order, not sorted.
  assert table[2] == ["even_pairs", "100.0 ± 0.0 (train 100.0)", "–"]
  assert table[3] == ["reverse_string", "65.0 ± 25.0 (train 100.0)", "70.0 ± 16.3 (train 100.0)"]
  rows = list(csv.reader(open(os.path.join(out["out_dir"], "variants.csv"))))
  assert rows == [["task", "variant", "mean", "std", "seeds", "training_mean"],
                  ["even_pairs", "rope", "100.00", "0.00", "1", "100.00"],
                  ["even_pairs", "rope+logn", "", "", "", ""],
                  ["reverse_string", "rope", "65.00", "25.00", "2", "100.00"],
                  ["reverse_string", "rope+logn", "70.00", "16.33", "3", "100.00"]]
  assert open(os.path.join(out["out_dir"], "variants.md")).read().strip().endswith(
      lines[-1])
  for task in ("even_pairs", "reverse_string"):
    png = os.path.join(out["out_dir"], "figures", f"{task}.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 1000
  # The paper's tables on demand; without config.json, auto gives them too.
  assert report.write_report(str(sweep_dir), str(tmp_path / "paper"), kind="paper")[
      "kind"] == "paper"
  for path in sweep_dir.glob("*/*/config.json"):
    os.remove(path)
  assert report.write_report(str(sweep_dir), str(tmp_path / "auto"))["kind"] == "paper"
  out = report.write_report(str(sweep_dir), str(tmp_path / "forced"), kind="variants")
  assert out["variants"] == ["rope", "rope+logn"]  # Sorted without a config.
  with pytest.raises(ValueError, match="unknown report kind"):
    report.write_report(str(sweep_dir), kind="su")


def test_one_small_su_job_trains_one_step(tmp_path):
  config = su.get_config("scale=small")
  config.sweep.tasks = ("missing_duplicate_string",)
  config.sweep.variants = tuple(v for v in config.sweep.variants if v[0] == "rope+beta+logn")
  config.grid.seeds = (0, 1)
  config.model.update(num_layers=1, num_heads=2, d_model=16)
  config.training.update(steps=1, max_length=3, log_every=1, checkpoint_every=1)
  config.evaluation.update(max_length=5, batch_size=8, max_buckets=1)
  progress = sweep.run_sweep(config, str(tmp_path / "sweep"))
  assert progress.done == 1 and not progress.failed
  job, = sweep.make_jobs(config, str(tmp_path / "sweep"))
  assert job.workdir.endswith(os.path.join("missing_duplicate_string", "rope+beta+logn"))
  assert sweep.is_finished(job)
  result = json.load(open(os.path.join(job.workdir, "eval.json")))
  assert result["step"] == 1 and len(result["models"]) == 2
  stored = json.load(open(os.path.join(job.workdir, "config.json")))
  assert (stored["model"]["pe"], stored["training"]["positions"],
          stored["model"]["log_n_scaling"]) == ("rope", "equal_mean_beta", True)
  out = report.write_report(str(tmp_path / "sweep"))
  assert out["kind"] == "variants" and out["variants"] == ["rope+beta+logn"]


def test_variant_base_is_the_variant_extended_by_one_option():
  names = su.get_config("scale=cpu").sweep.variants
  names = [name for name, _ in names]
  bases = {name: report.variant_base(name, names) for name in names}
  assert bases == {
      "rope": None, "sin_cos": None, "rope+logn": "rope", "randomized_rope": "rope",
      "randomized_rope+even": "randomized_rope", "randomized_rope+logn": "randomized_rope",
      "randomized_rope+even+logn": "randomized_rope+even", "rope+exp": "rope",
      "rope+exp+logn": "rope+exp", "rope+beta": "rope", "rope+beta+logn": "rope+beta"}
  # A base missing from the sweep gives no comparison.
  assert report.variant_base("rope+logn", ["rope+logn", "sin_cos"]) is None
  assert report.variant_base("randomized_rope", ["randomized_rope"]) is None


def test_variant_report_says_what_each_option_adds(tmp_path):
  sweep_dir = tmp_path / "sweep"
  config = su.get_config("scale=small").to_dict()

  def job(task, variant, unseen, train=1.0):
    models = {(seed, 1e-3): (u, [1.0, 1.0, u, u]) for seed, u in enumerate(unseen)}
    _write_job(sweep_dir, task, variant, _eval(task, models, train=train), config)

  # reverse_string: rope 0.6 ± 0.1; log-n within one std (0.65 ± 0.05: +5 < 10),
  # randomized above by more (0.8 ± 0.1: +20 > 10), randomized+log-n below it by more.
  job("reverse_string", "rope", [0.5, 0.7])
  job("reverse_string", "rope+logn", [0.6, 0.7])
  job("reverse_string", "randomized_rope", [0.7, 0.9])
  job("reverse_string", "randomized_rope+logn", [0.5, 0.5])
  # even_pairs: randomized far above rope, but rope did not learn its training lengths.
  job("even_pairs", "rope", [0.5, 0.5], train=0.9)
  job("even_pairs", "randomized_rope", [0.9, 0.9])
  out = report.write_report(str(sweep_dir))
  rows = {(r["task"], r["family"]): r for r in out["effects"]}
  verdicts = {key: r["verdict"] for key, r in rows.items()}
  assert verdicts == {
      ("even_pairs", "rope → rope+logn"): "missing",
      ("reverse_string", "rope → rope+logn"): "within one std",
      ("even_pairs", "rope → randomized_rope"): "not learned",
      ("reverse_string", "rope → randomized_rope"): "holds",
      ("even_pairs", "randomized_rope → randomized_rope+logn"): "missing",
      ("reverse_string", "randomized_rope → randomized_rope+logn"): "reversed"}
  assert rows["reverse_string", "rope → randomized_rope"]["gain"] == pytest.approx(20.0)
  assert rows["reverse_string", "randomized_rope → randomized_rope+logn"][
      "gain"] == pytest.approx(-30.0)
  md = open(os.path.join(out["out_dir"], "variants.md")).read()
  assert "| reverse_string | 60.0 → 65.0 ≈ | 60.0 → 80.0 ✓ | 80.0 → 50.0 ✗ |" in md
  assert "| even_pairs | – | 50.0 → 90.0 † | – |" in md
  assert ("- rope → randomized_rope: lifts on 1 of 2 tasks (even_pairs +40.0 (not learned), "
          "reverse_string +20.0)") in md
  assert ("- randomized_rope → randomized_rope+logn: lifts on 0 of 1 tasks "
          "(reverse_string -30.0 (lowers))") in md
