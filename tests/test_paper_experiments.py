"""Issue 15 part 1: the configs of Table 3, Figure 3 and Figure 2, Table 2's times, and
their report sections."""
import csv
import json
import os

import ml_collections
import numpy as np
import pytest

from configs import figure2
from configs import figure3
from configs import table1
from configs import table3
from configs import table5
from experiments.analysis import tables as report
from experiments.training import jobs as sweep
from experiments.training import validation

CONFIGS = {"table3": table3, "figure3": figure3, "figure2": figure2}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_configs_resolve_at_both_scales_and_every_job_validates(name, tmp_path):
  module = CONFIGS[name]
  for scale in ("small", "full"):
    config = module.get_config(f"scale={scale}")
    assert config.sweep.report == name
    jobs = sweep.make_jobs(config, str(tmp_path / scale))  # Validates every job.
    for job in jobs:
      validation.validate(ml_collections.ConfigDict(job.config))
    if scale == "full":  # The paper's protocol.
      c = jobs[0].config
      assert (c["training"]["steps"], c["evaluation"]["max_length"], c["model"]["num_layers"],
              c["model"]["compat"]) == (2_000_000, 500, 5, "release")
  with pytest.raises(ValueError, match="unknown scale"):
    module.get_config("scale=huge")
  assert not os.path.exists(tmp_path / "small")  # Listing jobs writes nothing.


def test_what_each_config_varies(tmp_path):
  by_name = {j.name: j.config for j in sweep.make_jobs(table3.get_config(), str(tmp_path))}
  assert len(by_name) == 30
  for name, c in by_name.items():
    assert c["model"]["pe"] == "randomized_sin_cos"
    assert c["training"]["positions"] == ("unsorted" if name.endswith("/unsorted") else "")
  jobs = sweep.make_jobs(figure3.get_config(), str(tmp_path))
  assert sorted({j.config["model"]["max_position"] for j in jobs}) == [1024, 2048, 4096, 8192]
  assert {j.task for j in jobs} == {"reverse_string", "missing_duplicate_string"}
  assert {j.config["model"]["pe"] for j in jobs} == {"randomized_relative"}
  small = sweep.make_jobs(figure3.get_config("scale=small"), str(tmp_path))
  assert min(j.config["model"]["max_position"] for j in small) == 64
  jobs = {j.variant: j.config for j in sweep.make_jobs(figure2.get_config(), str(tmp_path))}
  assert {n: (c["model"]["pe"], c["training"]["max_length"], c["evaluation"]["min_length"])
          for n, c in jobs.items()} == {
              "randomized_relative_N40": ("randomized_relative", 40, 41),
              "relative_N500": ("relative", 500, 41)}
  assert all(c["evaluation"]["every_steps"] > 0 for c in jobs.values())


def _shrink(config, steps=1, seeds=(0,)):
  config.grid.seeds = seeds
  config.sweep.tasks = ("reverse_string",)  # One task: its data programs are shared.
  config.model.update(num_layers=1, num_heads=2, d_model=16, max_position=64)
  config.training.update(steps=steps, max_length=3, log_every=1, checkpoint_every=steps,
                         batch_size=8, max_programs=1)
  config.evaluation.update(min_length=1, max_length=5, batch_size=8, max_buckets=1)
  return config


def _small_config(name):
  """The experiment's scale=small config, shrunk to a step or two of a tiny model."""
  if name == "table3":  # Its unsorted variant (sorted is the plain randomized_sin_cos).
    c = _shrink(table3.get_config("scale=small"))
    c.sweep.variants = tuple(v for v in c.sweep.variants if v[0] == "unsorted")
  elif name == "figure3":  # One L.
    c = _shrink(figure3.get_config("scale=small"))
    c.sweep.variants = figure3.variants((64,))
  elif name == "figure2":  # Both models, two seeds each, evaluated during training.
    c = _shrink(figure2.get_config("scale=small"), steps=2, seeds=(0, 1))
    c.sweep.variants = figure2.variants(2, 3)
    c.evaluation.update(min_length=3, every_steps=1, periodic_batch_size=4)
  else:  # Table 5: geometric attention.
    c = _shrink(table5.get_config("scale=small"))
    c.sweep.encodings = ("geometric",)
  return c


# One test per experiment, so that pytest's workers share them out.
@pytest.mark.parametrize("name", ["table3", "figure3", "figure2", "table5"])
def test_each_config_runs_a_step_and_reports(tmp_path, name):
  config = _small_config(name)
  sweep_dir = str(tmp_path / name)
  progress = sweep.run_sweep(config, sweep_dir)
  assert progress.done == len(sweep.make_jobs(config, sweep_dir)) and not progress.failed
  out = report.write_report(sweep_dir)
  assert out["kind"] == name
  for job in sweep.make_jobs(config, sweep_dir):
    result = json.load(open(os.path.join(job.workdir, "eval.json")))
    assert result["train_seconds"] > 0
  if name != "figure2":
    return
  assert os.path.exists(tmp_path / "figure2" / "report" / "figure2.png")
  records = [json.loads(l) for l in open(
      tmp_path / "figure2" / "reverse_string" / "relative_N3" / "metrics.jsonl")]
  evaluations = [r for r in records if "evaluation" in r]
  assert [r["step"] for r in evaluations] == [1, 2]
  assert evaluations[0]["evaluation"]["lengths"] == [3, 4, 5]
  assert len(evaluations[0]["evaluation"]["mean"]) == 2  # One value per model.


# --------------------------------------------------------------------------
# The report sections from fixture runs, some cells missing.


def _model(seed, rate, unseen, per_length):
  return {"seed": seed, "learning_rate": rate, "accuracy": list(per_length), "diverged": False,
          "scores": {"train_range": 1.0, "unseen": unseen}}


def _job(sweep_dir, task, name, models, config=None, metrics=None, **extra):
  folder = sweep_dir / task / name
  os.makedirs(folder)
  result = {"task": task, "lengths": [1, 2, 3, 4], "training_lengths": [1, 2],
            "models": models, "step": 10, **extra}
  (folder / "eval.json").write_text(json.dumps(result))
  if config is not None:
    (folder / "config.json").write_text(json.dumps(config))
  if metrics is not None:
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))


def _evaluations(trains, unseens, every=100, seconds=None):
  """Records of evaluations during training, one every `every` steps: per model the
  training-length and unseen-length accuracy; training seconds 10 a step unless given."""
  seconds = seconds or [10 * (i + 1) for i in range(len(trains))]
  return [{"step": every * (i + 1), "train_seconds": s,
           "evaluation": {"train_range": t, "unseen": u}}
          for i, (t, u, s) in enumerate(zip(trains, unseens, seconds))]


def _table(md):
  return [[c.strip() for c in line.split("|")[1:-1]] for line in md.splitlines()
          if line.startswith("| ") and not line.startswith("|---")]


def test_table3_report(tmp_path):
  sweep_dir = tmp_path / "sweep"
  config = table3.get_config("scale=small").to_dict()
  curve = lambda u: [1.0, 1.0, u, u]  # pylint: disable=unnecessary-lambda-assignment
  _job(sweep_dir, "reverse_string", "sorted", [_model(0, 1e-3, 0.8, curve(0.8)),
                                               _model(1, 1e-3, 0.9, curve(0.9))], config)
  _job(sweep_dir, "reverse_string", "unsorted", [_model(0, 1e-3, 0.5, curve(0.5)),
                                                 _model(1, 1e-3, 0.6, curve(0.6))], config)
  _job(sweep_dir, "even_pairs", "sorted", [_model(0, 1e-3, 1.0, curve(1.0))], config)
  out = report.write_report(str(sweep_dir))  # auto: the config's sweep.report.
  assert out["kind"] == "table3"
  paper = report.load_paper()
  rows = _table(out["table"])
  assert rows[0] == ["task", "sorted", "unsorted"]
  t1 = paper["table1_max_over_seeds_and_lrs"]
  t3 = paper["table3_randomized_sin_cos_unsorted"]
  assert rows[1] == ["even_pairs", f"100.0 ({t1['even_pairs']['randomized_sin_cos']:.1f})",
                     f"– ({t3['even_pairs']:.1f})"]
  assert rows[2] == ["reverse_string",
                     f"90.0 ({t1['reverse_string']['randomized_sin_cos']:.1f})",
                     f"60.0 ({t3['reverse_string']:.1f})"]
  # Only reverse_string has both cells: 90 - 60.
  assert out["gains"]["ours"] == pytest.approx(30.0)
  assert out["gains"]["paper_same_tasks"] == pytest.approx(
      t1["reverse_string"]["randomized_sin_cos"] - t3["reverse_string"])
  rows = list(csv.reader(open(os.path.join(out["out_dir"], "table3.csv"))))
  assert ["even_pairs", "unsorted", "", f"{t3['even_pairs']:.2f}"] in rows
  assert os.path.getsize(os.path.join(out["out_dir"], "figures", "reverse_string.png")) > 1000
  # Mean ± std over seeds beside the maxima, with the training lengths' accuracy.
  by_task = {r["task"]: r for r in out["sorting"]}
  assert by_task["even_pairs"]["verdict"] == "missing"
  rev = by_task["reverse_string"]
  assert rev["randomized"] == pytest.approx((85.0, 5.0)) and rev["training"] == (100.0, 100.0)
  assert rev["classic"] == pytest.approx((55.0, 5.0))
  assert rev["gain"] == pytest.approx(30.0) and rev["verdict"] == "holds"
  # The order-blind bound on the job's lengths, scored as its accuracy: training lengths
  # 1, 2 (100% and 75%), unseen 3, 4 (75% and 68.75%), estimated on sampled sequences.
  assert rev["order_blind"] == pytest.approx((87.5, 71.875), abs=1.0)
  sorting = (tmp_path / "sweep" / "report" / "sorting.md").read_text()
  assert _table(sorting)[2] == ["reverse_string", "85.0 ± 5.0 (train 100.0)",
                                "55.0 ± 5.0 (train 100.0)", "+30.0", "holds",
                                f"{rev['order_blind'][1]:.1f} (train {rev['order_blind'][0]:.1f})"]
  assert "sorting matters (holds) on 1 of 2 tasks" in sorting and sorting in out["text"]
  # The paper's unsorted cells beside the bound at its test lengths 41..500 (even_pairs:
  # order decides its output, no row); the paper's reverse_string model sits on it.
  [paper_row] = out["paper_sorting"]
  assert paper_row["task"] == "reverse_string" and paper_row["lengths"] == (41, 500)
  assert paper_row["paper_unsorted"] == t3["reverse_string"] == 52.8
  assert paper_row["bound"] == pytest.approx(52.8, abs=0.2)
  assert os.path.getsize(os.path.join(out["out_dir"], "figures", "sorting.png")) > 1000


def test_a_sweep_of_copied_jobs_is_read_by_its_own_jobs_configs(tmp_path):
  # Table 3's sorted jobs are copies of Table 1's (--reuse_from): their config.json is the
  # sweep that trained them. The report's kind, variants and unfinished jobs come from
  # this sweep's own jobs, here one started (config.json, no eval.json yet).
  sweep_dir = tmp_path / "sweep"
  curve = lambda u: [1.0, 1.0, u, u]  # pylint: disable=unnecessary-lambda-assignment
  _job(sweep_dir, "reverse_string", "sorted", [_model(0, 1e-3, 0.8, curve(0.8))],
       table1.get_config("scale=small").to_dict())
  (sweep_dir / "reverse_string" / "sorted" / sweep.REUSED_FROM).write_text(
      json.dumps({"source": "../../../table1/reverse_string/randomized_sin_cos"}))
  own = table3.get_config("scale=small")
  os.makedirs(sweep_dir / "reverse_string" / "unsorted")
  (sweep_dir / "reverse_string" / "unsorted" / "config.json").write_text(
      json.dumps(own.to_dict()))
  out = report.write_report(str(sweep_dir))
  assert out["kind"] == "table3"
  expected = {(t, v) for t in own.sweep.tasks for v in ("sorted", "unsorted")}
  assert report.unfinished_jobs(str(sweep_dir), report.load_sweep(str(sweep_dir))) == sorted(
      expected - {("reverse_string", "sorted")})


def test_sorting_verdicts():
  # Sorted and unsorted (mean, std) in %, with exact binary fractions: a gain of 6.25
  # against a std of 6.25 is within one std.
  verdict = report.sorting_verdict
  assert verdict((80.0, 2.0), (50.0, 1.0), 99.0, 99.0) == (30.0, "holds")
  assert verdict((80.0, 2.0), (50.0, 1.0), 99.0, 69.0) == (30.0, "holds, unsorted not learned")
  assert verdict((56.25, 6.25), (50.0, 1.0), 99.0, 69.0) == (6.25, "within one std")
  assert verdict((50.0, 1.0), (60.0, 2.0), 99.0, 99.0) == (-10.0, "reversed")
  assert verdict((80.0, 2.0), (50.0, 1.0), 94.0, 99.0) == (30.0, "sorted not learned")
  assert verdict((80.0, 2.0), (50.0, 1.0), None, 99.0) == (30.0, "sorted not learned")
  assert verdict(None, (50.0, 1.0), 99.0, 99.0) == (None, "missing")


def test_figure3_report_reads_L_from_each_job(tmp_path):
  sweep_dir = tmp_path / "sweep"
  base = figure3.get_config("scale=small").to_dict()
  def config(value):
    c = json.loads(json.dumps(base))
    c["model"]["max_position"] = value
    return c
  curve = [1.0, 1.0, 0.7, 0.7]
  _job(sweep_dir, "reverse_string", "L64", [_model(0, 1e-3, 0.6, curve),
                                            _model(1, 1e-3, 0.8, curve)], config(64))
  _job(sweep_dir, "reverse_string", "L128", [_model(0, 1e-3, 0.5, curve)], config(128))
  _job(sweep_dir, "missing_duplicate_string", "L128", [_model(0, 1e-3, 0.9, curve)],
       config(128))
  out = report.write_report(str(sweep_dir))
  assert out["kind"] == "figure3" and out["values"] == [64, 128]
  rows = _table(out["table"])
  assert rows[0] == ["task", "L = 64", "L = 128"]
  assert rows[1] == ["reverse_string", "70.0 ± 10.0 (80.0) (train 100.0)",
                     "50.0 ± 0.0 (50.0) (train 100.0)"]
  assert rows[2] == ["missing_duplicate_string", "–", "90.0 ± 0.0 (90.0) (train 100.0)"]
  png = os.path.join(out["out_dir"], "figure3.png")
  assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_figure2_report_curves_thresholds_and_speedup(tmp_path):
  sweep_dir = tmp_path / "sweep"
  config = figure2.get_config("scale=small").to_dict()
  def metrics(seconds, means, steps_per_second):
    logs = [{"step": 1, "loss": [1.0, 1.0], "steps_per_second": 1.0}]  # Compiling.
    logs += [{"step": 2 + i, "loss": [1.0, 1.0], "steps_per_second": s}
             for i, s in enumerate(steps_per_second)]
    evals = [{"step": 10 * (i + 1), "train_seconds": s,
              "evaluation": {"mean": m, "lengths": [3, 4]}} for i, (s, m) in
             enumerate(zip(seconds, means))]
    return logs + evals
  models = [_model(0, 1e-3, 0.9, [1, 1, 1, 1]), _model(1, 1e-3, 0.9, [1, 1, 1, 1])]
  # Randomized: the seed mean reaches 60% at 10 s, 90% at 20 s.
  _job(sweep_dir, "missing_duplicate_string", "randomized_relative_N8", models, config,
       metrics([10, 20], [[0.6, 0.6], [0.9, 0.92]], [50.0, 60.0, 70.0]), train_seconds=25.0)
  # Classic: 60% at 40 s, never 90%.
  _job(sweep_dir, "missing_duplicate_string", "relative_N24", models, config,
       metrics([20, 40], [[0.5, 0.5], [0.7, 0.5]], [10.0]), train_seconds=45.0)
  # A job without evaluations during training is left out with a warning.
  _job(sweep_dir, "reverse_string", "relative_N24", models, config, [])
  out = report.write_report(str(sweep_dir))
  assert out["kind"] == "figure2"
  assert set(out["curves"]) == {("missing_duplicate_string", "randomized_relative_N8"),
                                ("missing_duplicate_string", "relative_N24")}
  rand = out["curves"]["missing_duplicate_string", "randomized_relative_N8"]
  assert rand["seconds"] == [10, 20] and rand["seeds"] == 2
  np.testing.assert_allclose(rand["mean"], [60.0, 91.0])
  assert rand["steps_per_second"] == 60.0  # Median of the intervals after the first.
  assert report.first_reaching(rand, 90.0) == 20 and report.first_reaching(rand, 95.0) is None
  assert out["speedups"] == {"missing_duplicate_string": {60.0: 4.0}}
  rows = _table(out["table"])
  assert rows[1][:5] == ["missing_duplicate_string", "randomized_relative_N8", "1..2", "60.0",
                         "91.0 ± 1.0"]
  assert rows[1][5:] == ["10", "20", "20", "20"]
  assert rows[2][5:] == ["40", "–", "–", "–"]
  assert "60% 4.0x sooner" in out["table"]
  assert os.path.getsize(os.path.join(out["out_dir"], "figure2.png")) > 1000


def test_table2_hours_beside_the_paper(tmp_path):
  sweep_dir = tmp_path / "sweep"
  curve = [1.0, 1.0, 0.5, 0.5]
  _job(sweep_dir, "reverse_string", "relative", [_model(0, 1e-3, 0.5, curve),
                                                 _model(1, 1e-3, 0.5, curve)],
       train_seconds=1800.0, train_cpu_seconds=3600.0)
  _job(sweep_dir, "reverse_string", "randomized_relative", [_model(0, 1e-3, 0.5, curve)])
  _job(sweep_dir, "duplicate_string", "relative", [_model(0, 1e-3, 0.5, curve)],
       train_seconds=900.0, train_cpu_seconds=2700.0)
  _job(sweep_dir, "duplicate_string", "randomized_relative", [_model(0, 1e-3, 0.5, curve)],
       train_seconds=3600.0, train_cpu_seconds=1800.0, evaluation_seconds=720.0,
       evaluation_cpu_seconds=360.0)
  out = report.write_report(str(sweep_dir))  # No config.json: the paper's tables.
  assert out["kind"] == "paper"
  published = report.load_paper()["table2_running_hours_mean_std"]["hours"]["reverse_string"]
  assert published["relative"] == [2.61, 0.39]
  rows = _table(out["table2"])
  assert rows[0] == ["task", "relative", "randomized_relative"]
  assert rows[1] == ["reverse_string", "0.5 [2], 1 CPU (2.61 ± 0.39)", "– (2.75 ± 0.41)"]
  # CPU hours where the job recorded them.
  # And those of its evaluations, where the job recorded them.
  assert rows[2] == ["duplicate_string", "0.25 [1], 0.75 CPU (4.10 ± 0.54)",
                     "1 [1], 0.5 CPU + 0.1 evaluating (4.24 ± 0.54)"]
  # The column's job hours, and the CPU hours of the jobs that recorded them.
  assert rows[3] == ["total", "0.75 (2 of 2 jobs); 1.75 CPU (2 jobs)",
                     "1 (1 of 2 jobs); 0.5 CPU (1 job); 0.1 CPU evaluating (1 job)"]
  # What a job of each column cost, on average over the jobs that recorded it.
  assert rows[4] == ["a job", "0.875 CPU (2 jobs)", "0.5 CPU (1 job)"]
  rows = list(csv.reader(open(os.path.join(out["out_dir"], "table2.csv"))))
  assert rows[1] == ["reverse_string", "relative", "0.5000", "2", "2.61", "0.39", "1.0000", ""]
  assert rows[2] == ["reverse_string", "randomized_relative", "", "", "2.75", "0.41", "", ""]
  assert rows[3] == ["duplicate_string", "relative", "0.2500", "1", "4.10", "0.54", "0.7500",
                     ""]
  assert rows[4] == ["duplicate_string", "randomized_relative", "1.0000", "1", "4.24", "0.54",
                     "0.5000", "0.1000"]


def test_table5_report(tmp_path):
  sweep_dir = tmp_path / "sweep"
  curve = [1.0, 1.0, 0.5, 0.5]
  config = {"sweep": {"report": "table5"}}
  _job(sweep_dir, "even_pairs", "geometric", [_model(0, 1e-3, 0.9, curve),
                                              _model(1, 1e-3, 0.7, curve)], config)
  _job(sweep_dir, "even_pairs", "randomized_geometric", [_model(0, 1e-3, 0.6, curve)], config)
  _job(sweep_dir, "reverse_string", "randomized_geometric", [_model(0, 1e-3, 0.55, curve)],
       config)
  out = report.write_report(str(sweep_dir))
  assert out["kind"] == "table5"
  paper = report.load_paper()
  ref = paper["table5_geometric_attention"]["even_pairs"]
  rows = _table(out["table"])
  assert rows[0][:5] == ["task", "geometric max", "geometric mean ± std",
                         "randomized_geometric max", "randomized_geometric mean ± std"]
  assert rows[1][:5] == ["even_pairs", f"90.0 ({ref['max']:.1f})",
                         f"80.0 ± 10.0 ({ref['mean']:.1f} ± {ref['std']:.1f})",
                         "60.0 (–)", "60.0 ± 0.0 (–)"]
  best = max(paper["table1_max_over_seeds_and_lrs"]["even_pairs"].values())
  assert rows[1][5] == f"{best:.1f}"
  ref = paper["table5_geometric_attention"]["reverse_string"]
  assert rows[2][1:3] == [f"– ({ref['max']:.1f})",
                          f"– ({ref['mean']:.1f} ± {ref['std']:.1f})"]


def test_a_task_figure_without_finished_jobs_says_so_without_warnings(tmp_path):
  import warnings  # pylint: disable=import-outside-toplevel

  import matplotlib.image  # pylint: disable=import-outside-toplevel

  result = {"models": [{"scores": {"unseen": 0.5}, "accuracy": [1.0, 0.5]}],
            "lengths": [1, 2], "training_lengths": [1, 1]}
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # matplotlib warned of an empty legend before.
    report.plot_task("reverse_string", {}, ["relative"], str(tmp_path / "empty.png"))
    report.plot_task("reverse_string", {("reverse_string", "relative"): result},
                     ["relative", "randomized_relative"], str(tmp_path / "one.png"))
  empty = matplotlib.image.imread(str(tmp_path / "empty.png"))
  one = matplotlib.image.imread(str(tmp_path / "one.png"))
  assert empty.shape == one.shape and not np.array_equal(empty, one)


def test_study_report_learning_curves_and_runs_moved_aside(tmp_path):
  """The study kind (configs/cpu_study.py): per job the final accuracies, the first
  evaluated step at >= 95% on the training lengths, the best unseen accuracy and the
  seconds, from the evaluations during training (mean over seeds); a run the sweep moved
  aside (an earlier protocol of the same job) is a row and a curve of its own."""
  sweep_dir = tmp_path / "sweep"
  config = {"sweep": {"report": "study"}}
  curve = [1.0, 1.0, 0.5, 0.5]

  _job(sweep_dir, "reverse_string", "A-relative",
       [_model(0, 1e-3, 0.6, curve), _model(1, 1e-3, 0.7, curve)], config,
       metrics=_evaluations([[0.9, 0.96], [0.97, 0.99]], [[0.5, 0.6], [0.7, 0.5]],
                            seconds=[10, 20]))
  _job(sweep_dir, "reverse_string", "A-relative.replaced-20261126-batch128",
       [_model(0, 1e-3, 0.4, curve), _model(1, 1e-3, 0.5, curve)], config,
       metrics=_evaluations([[0.5, 0.7], [0.8, 0.9], [0.95, 0.97]],
                            [[0.3, 0.3], [0.4, 0.6], [0.5, 0.5]], seconds=[30, 60, 90]))
  out = report.write_report(str(sweep_dir))
  assert out["kind"] == "study"
  rows = _table(out["table"])
  assert rows[0] == ["task", "variant", "steps", "train", "unseen", "95% at", "best unseen",
                     "seconds"]
  assert rows[1] == ["reverse_string", "A-relative", "10", "100.0", "65.0", "200", "60.0",
                     "20"]
  assert rows[2] == ["reverse_string", "A-relative.replaced-20261126-batch128", "10",
                     "100.0", "45.0", "300", "50.0", "90"]
  earlier = out["curves"]["reverse_string", "A-relative.replaced-20261126-batch128"]
  np.testing.assert_allclose(earlier["train"], [60.0, 85.0, 96.0])
  assert earlier["steps"] == [100, 200, 300] and earlier["seconds"] == [30, 60, 90]
  assert os.path.getsize(os.path.join(out["out_dir"], "figures", "reverse_string.png")) > 1000
  # The other reports leave moved-aside runs out.
  assert list(report.load_sweep(str(sweep_dir))) == [("reverse_string", "A-relative")]


def test_study_report_gives_the_ordering_at_every_step_evaluated_during_training(tmp_path):
  """Classic and randomized twins evaluated at the same steps: the verdict of
  ordering.md at each (not learned, within one std, holds, reversed), in a table per
  family and a figure; a twin without evaluations gives no row."""
  sweep_dir = tmp_path / "sweep"
  config = {"sweep": {"report": "study"}}
  curve = [1.0, 1.0, 0.5, 0.5]
  models = [_model(0, 1e-3, 0.6, curve), _model(1, 1e-3, 0.7, curve)]

  ones = [1.0, 1.0]
  # Binary fractions, so that the gains and stds are exact: 6.25 against a std of 6.25
  # is within one std, not above it.
  _job(sweep_dir, "reverse_string", "relative", models, config, metrics=_evaluations(
      [[0.9, 1.0], ones, ones, ones], [[0.5, 0.5], [0.5, 0.625], [0.5, 0.5], [0.75, 0.75]]))
  _job(sweep_dir, "reverse_string", "randomized_relative", models, config,
       metrics=_evaluations([[0.9, 0.96], ones, ones, ones],
                            [[0.5, 0.5], [0.5625, 0.6875], [0.75, 0.8125], [0.5, 0.5]]))
  _job(sweep_dir, "even_pairs", "relative", models, config,
       metrics=_evaluations([ones], [[0.5, 0.5]]))
  _job(sweep_dir, "even_pairs", "randomized_relative", models, config)  # No evaluations.
  out = report.write_report(str(sweep_dir))
  assert out["kind"] == "study"
  rows = out["ordering_during_training"]
  assert [(r["task"], r["step"], r["verdict"]) for r in rows] == [
      ("reverse_string", 100, "not learned"), ("reverse_string", 200, "within one std"),
      ("reverse_string", 300, "holds"), ("reverse_string", 400, "reversed")]
  np.testing.assert_allclose([r["gain"] for r in rows], [0.0, 6.25, 28.125, -25.0])
  text = out["table"]
  section = text[text.index("### The ordering during training"):]
  assert ("relative → randomized_relative:\n\n"
          "| task | 100 | 200 | 300 | 400 | mean of the last 3 |\n"
          "|---|---:|---:|---:|---:|---:|\n"
          "| reverse_string | † +0.0 | ≈ +6.2 | ✓ +28.1 | ✗ -25.0 | ") in section
  # The last column: each seed averaged over steps 200-400, (58.3, 62.5) against (60.4,
  # 66.7): +3.125, as large as the twin's std (a tie up to rounding: either mark).
  [late] = out["ordering_late"]
  assert late["steps"] == [200, 300, 400] and late["gain"] == pytest.approx(3.125)
  assert late["verdict"] in ("within one std", "holds")
  assert "even_pairs" not in section
  figure = os.path.join(out["out_dir"], "figures", "ordering_during_training.png")
  assert os.path.getsize(figure) > 1000


def test_the_ordering_over_the_last_evaluations_averages_each_seed(tmp_path):
  """`ordering_late`: the verdict on each seed's accuracy averaged over the last three
  steps both twins were evaluated at (not over all of them, not over the seeds first): a
  last evaluation that dips reverses the step's verdict but not the average's."""
  sweep_dir = tmp_path / "sweep"
  config = {"sweep": {"report": "study"}}
  curve = [1.0, 1.0, 0.5, 0.5]
  models = [_model(0, 1e-3, 0.6, curve), _model(1, 1e-3, 0.7, curve)]

  ones, low = [1.0, 1.0], [0.5, 0.5]
  # The classic twin at 0.5 throughout; the randomized one at 0.75 (seed 0) and 0.6875
  # (seed 1) but for its last evaluation, 0.25 for both, and at 0.0 at step 100, before
  # the last three and before either twin had learned. Over steps 200-400 its seeds
  # average 58.33 and 54.17: 56.25 ± 2.08 against 50.0 ± 0, a gain of +6.25 that holds;
  # the std of all six values (22.7) would make it "within one std", and all four steps
  # would count a step whose models had not learned.
  _job(sweep_dir, "reverse_string", "relative", models, config,
       metrics=_evaluations([low, ones, ones, ones], [low, low, low, low]))
  _job(sweep_dir, "reverse_string", "randomized_relative", models, config,
       metrics=_evaluations([low, ones, ones, ones],
                            [[0.0, 0.0], [0.75, 0.6875], [0.75, 0.6875], [0.25, 0.25]]))
  out = report.write_report(str(sweep_dir))
  steps = {r["step"]: r["verdict"] for r in out["ordering_during_training"]}
  assert steps == {100: "not learned", 200: "holds", 300: "holds", 400: "reversed"}
  [late] = out["ordering_late"]
  assert late["steps"] == [200, 300, 400] and late["verdict"] == "holds"
  assert late["gain"] == pytest.approx(6.25)
  rows = [line for line in out["table"].splitlines() if line.startswith("| reverse_string |")]
  assert any(line.endswith("| ✗ -25.0 | ✓ +6.2 |") for line in rows)


def test_stopping_when_learned_reads_each_twin_where_its_seeds_learned(tmp_path):
  """`stopping_rows`: each job as `training.stop_when_learned=0.95` would have stopped it,
  the first evaluation whose seeds average 95% on the training lengths (a seed at 96%
  beside one at 93% is not yet), its seeds' accuracy there, the training seconds to it,
  and the verdict on those; a job whose seeds never average 95% runs to its end (†)."""
  sweep_dir = tmp_path / "sweep"
  config = {"sweep": {"report": "study"}}
  curve = [1.0, 1.0, 0.5, 0.5]
  models = [_model(0, 1e-3, 0.6, curve), _model(1, 1e-3, 0.7, curve)]
  ones, low, half = [1.0, 1.0], [0.5, 0.5], [0.5, 0.5]
  hour = lambda hours: [3600 * h for h in hours]  # pylint: disable=unnecessary-lambda-assignment
  _job(sweep_dir, "reverse_string", "relative", models, config, train_seconds=3600 * 4,
       metrics=_evaluations([low, ones, ones, ones], [half, half, [0.9, 0.9], half],
                            seconds=hour([0.25, 0.5, 0.75, 1.0])))
  _job(sweep_dir, "reverse_string", "randomized_relative", models, config,
       train_seconds=3600 * 8,
       metrics=_evaluations([low, [0.96, 0.93], [0.96, 0.96], ones],
                            [half, half, [0.75, 0.70], [0.2, 0.2]],
                            seconds=hour([0.5, 1.0, 1.5, 2.0])))
  _job(sweep_dir, "odds_first", "relative", models, config, train_seconds=3600,
       metrics=_evaluations([ones, ones], [half, half], seconds=hour([0.5, 1.0])))
  _job(sweep_dir, "odds_first", "randomized_relative", models, config, train_seconds=3600,
       metrics=_evaluations([low, [0.9, 0.9]], [half, [0.6, 0.6]], seconds=hour([0.5, 1.0])))
  out = report.write_report(str(sweep_dir))
  rows = {r["task"]: r for r in out["stopping"]}
  classic, twin = rows["reverse_string"]["jobs"]
  assert (classic["step"], classic["learned"], classic["seconds"]) == (200, True, 1800)
  assert (twin["step"], twin["learned"], twin["seconds"]) == (300, True, 5400)
  assert twin["unseen"].tolist() == [75.0, 70.0] and twin["train"].tolist() == [96.0, 96.0]
  assert rows["reverse_string"]["verdict"] == "holds"
  assert rows["reverse_string"]["gain"] == pytest.approx(22.5)
  classic, twin = rows["odds_first"]["jobs"]
  assert (classic["step"], twin["step"], twin["learned"]) == (100, 200, False)
  assert rows["odds_first"]["verdict"] == "not learned"
  table = _table(out["table"].split("### Stopping when learned")[1].split("###")[0])
  assert table[1] == ["reverse_string", "200 / 100.0 / 50.0 ± 0.0", "300 / 96.0 / 72.5 ± 2.5",
                      "+22.5", "✓ holds", "2.00 / 12.00"]
  assert table[2][2] == "200 († not learned) / 90.0 / 60.0 ± 0.0"
  # Sums: 2.0 + 0.5 + 1.0 hours to the stops, 12 + 2 to the ends.
  assert table[3] == ["all 2 tasks", "", "", "", "holds on 1", "3.50 / 14.00 (25%)"]


def test_the_randomized_twin_of_an_encoding_and_of_a_studys_variant():
  names = ["relative", "randomized_relative", "A-rope", "A-randomized_rope", "B-rope",
           "relative.replaced-20261126-batch128",
           "randomized_relative.replaced-20261126-batch128"]
  twins = {name: report.randomized_twin(name, names) for name in names}
  assert twins == {"relative": "randomized_relative", "randomized_relative": None,
                   "A-rope": "A-randomized_rope", "A-randomized_rope": None,
                   "B-rope": None,  # B-randomized_rope did not run.
                   "relative.replaced-20261126-batch128":
                       "randomized_relative.replaced-20261126-batch128",
                   "randomized_relative.replaced-20261126-batch128": None}
