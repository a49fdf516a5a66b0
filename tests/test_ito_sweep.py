"""configs/ito_sweep.py (issue 26): one model per job, jobs seed-major, and a tiny version
of it end to end through experiments.sweep: each job leaves the analyses' inputs, the
analysis and the report merge the jobs of one encoding (disjoint seeds) into one run,
equal to a grid run of those seeds, also once the checkpoints are gone (a committed
results folder)."""
import json
import os
import shutil

import numpy as np
import pytest

from configs import ito_sweep
from configs import latin_square
from experiments.analysis import ito as ia
from experiments.analysis import ito_tables as ito_report
from experiments.analysis import tables
from experiments.training import loop
from experiments.training import jobs as sweep

def test_jobs_are_single_models_seed_major_and_validate(tmp_path):
  jobs = sweep.make_jobs(ito_sweep.get_config(), str(tmp_path))  # Validates every job.
  names = [job.variant for job in jobs]
  first = ["learn-0.2", "learn-2.0", "learn-1.0", "2d_fixed", "randomized_2d"]  # The issue's.
  later = ["nope", "1d_fixed"]  # "If time allows": after every seed of the first tier.
  assert names == [f"{e}-s{s}" for tier in (first, later) for s in latin_square.SEEDS[:3]
                   for e in tier]
  for job in jobs:
    seed = int(job.variant.rsplit("-s", 1)[1])
    assert job.config["grid"]["seeds"] == (seed,) and job.config["seed"] == seed
    assert job.config["training"]["steps"] == 12_800  # 200 epochs of 64 steps.
    assert job.config["sweep"]["report"] == "ito"
  sigmas = {job.variant: job.config["model"]["pe_sigma"] for job in jobs
            if job.pe == "learn"}
  assert sigmas["learn-0.2-s2235"] == 0.2 and sigmas["learn-2.0-s6068"] == 2.0
  assert len(sweep.make_jobs(ito_sweep.get_config("seeds=1"), str(tmp_path))) == 7
  with pytest.raises(ValueError, match="expected seeds=N"):
    ito_sweep.get_config("epochs=3")


def _tiny_sweep(num_seeds=2, encodings=("2d_fixed", "learn-0.2")):
  config = ito_sweep.get_config(f"seeds={num_seeds}")
  config.sweep.variants = tuple(v for v in config.sweep.variants
                                if v[0].rsplit("-s", 1)[0] in encodings)
  config.model.update(num_layers=1, d_model=16, mlp_size=32)
  config.training.update(steps=2, log_every=1, checkpoint_every=2)
  config.evaluation.every_epochs = 0
  config.evaluation.final_splits = ("validation",)
  return config


def test_tiny_sweep_end_to_end_merged_runs_and_committed_folder(tmp_path, monkeypatch):
  sweep_dir = tmp_path / "ito"
  config = _tiny_sweep()
  progress = sweep.run_sweep(config, str(sweep_dir))
  assert not progress.failed and progress.done == 4
  jobs = sweep.make_jobs(config, str(sweep_dir))
  for job in jobs:
    assert sweep.job_status(job) == (True, None)
    assert os.path.getsize(os.path.join(job.workdir, ia.JOB_INPUTS)) < 200_000
  runs = ia.find_runs(str(sweep_dir))
  assert [(r.label, r.seeds) for r in runs] == [("2d_fixed", (2235, 6312)),
                                                ("learn-0.2", (2235, 6312))]
  assert [os.path.basename(w) for w in runs[1].workdirs] == ["learn-0.2-s2235",
                                                            "learn-0.2-s6312"]
  # A one-job sweep of this sweep's first job, checkpoints included (the job's config is
  # the same): _missing_inputs_file_is_written_from_checkpoints_without_training's.
  shutil.copytree(sweep_dir / "latin_square" / "learn-0.2-s2235",
                  tmp_path / "ito1" / "latin_square" / "learn-0.2-s2235")
  _missing_inputs_file_is_written_from_checkpoints_without_training(tmp_path / "ito1")

  # The same seeds as one grid (one program): the merged run's models equal it.
  grid = latin_square.get_config("encoding=learn,sigma=0.2,scale=small,seeds=2")
  grid.model.update(num_layers=1, d_model=16, mlp_size=32)
  grid.training.update(steps=2, log_every=1, checkpoint_every=2)
  grid.evaluation.update(every_epochs=0, final_splits=("validation",))
  grid.progress = False
  loop.train_and_evaluate(grid, str(tmp_path / "grid"))
  merged = ia.evaluate_models(runs[1])
  alone = ia.evaluate_models(ia.run_info(str(tmp_path / "grid")))
  assert merged.info.seeds == alone.info.seeds == (2235, 6312)
  np.testing.assert_allclose(merged.maps, alone.maps, atol=1e-4)
  np.testing.assert_allclose(merged.terms, alone.terms, atol=1e-5)
  assert (merged.predictions == alone.predictions).mean() > 0.97
  assert np.abs(merged.noise - alone.noise).max() <= 0.03  # The same noise per seed.

  # The analysis and the report of the sweep folder (experiments.report dispatches), in
  # this process: their command lines are tests/test_ito_analysis.py's (ito_analysis, also
  # --recompute) and tests/test_reliability2.py's (report --sweep_dir).
  ia.write_analysis(ia.find_runs(str(sweep_dir)), str(sweep_dir / "ito_analysis"),
                    recompute=True)
  analysis_path = sweep_dir / "ito_analysis" / "analysis.json"
  with_checkpoints = json.loads(analysis_path.read_text())
  record = with_checkpoints["runs"]["learn-0.2"]
  assert record["seeds"] == [2235, 6312] and record["validation_accuracy"]["count"] == 2
  assert len(record["workdirs"]) == 2 and record["attention_cosine"]["count"] == 2
  finals = [json.loads((sweep_dir / "latin_square" / f"learn-0.2-s{s}" / "eval.json")
                       .read_text())["models"][0]["accuracy"]["validation"]["overall"]
            for s in (2235, 6312)]
  assert record["validation_accuracy"]["per_seed"] == finals
  report = tables.write_report(str(sweep_dir))
  assert report["kind"] == "ito"
  text = (sweep_dir / "report" / "report.md").read_text()
  mean, sd = np.mean(finals), np.std(finals, ddof=1)
  epoch = 2 / 64
  assert f"ours at epoch {epoch:g}" in text
  assert f"| learn-0.2 | {mean:.3f} ± {sd:.3f} (2) |" in text  # Table 1, merged seeds.
  assert "Issue 26's targets at epoch 200" in text

  # Without --recompute the jobs' inputs files are read though checkpoints exist (they
  # were written from the newest ones): no model is restored, the same numbers.
  def no_restore(workdir):
    raise AssertionError(f"restored {workdir}")
  monkeypatch.setattr(ia.trained_run, "restore_run", no_restore)
  preferred, _ = ia.analyse(ia.find_runs(str(sweep_dir)))
  for label in ("2d_fixed", "learn-0.2"):
    for key in ("validation_accuracy", "attention_cosine", "procrustes_distance", "noise"):
      assert json.dumps(preferred["runs"][label][key], sort_keys=True) == json.dumps(
          with_checkpoints["runs"][label][key], sort_keys=True), (label, key)
  with pytest.raises(AssertionError, match="restored"):  # Other settings need them.
    ia.analyse(ia.find_runs(str(sweep_dir)), noise_sds=(0.5,))
  monkeypatch.undo()

  # A committed results folder: no checkpoints. The sweep has nothing left to do, and the
  # analysis reads each job's inputs file: the same numbers.
  for job in jobs:
    shutil.rmtree(os.path.join(job.workdir, "checkpoints"))
  progress = sweep.run_sweep(config, str(sweep_dir))
  assert progress.done == 4 and not progress.failed
  ia.write_analysis(ia.find_runs(str(sweep_dir)), str(sweep_dir / "ito_analysis"))
  without = json.loads(analysis_path.read_text())
  for label in ("2d_fixed", "learn-0.2"):
    for key in ("validation_accuracy", "attention_cosine", "attention_js",
                "procrustes_distance", "noise", "human"):
      assert json.dumps(without["runs"][label][key]) == json.dumps(
          with_checkpoints["runs"][label][key]), (label, key)
  # Other noise settings need the checkpoints.
  with pytest.raises(ValueError, match="analyse it with those"):
    ia.analyse(ia.find_runs(str(sweep_dir)), noise_sds=(0.5,))

  # A seed given twice (a job copied under another name) is refused.
  shutil.copytree(sweep_dir / "latin_square" / "learn-0.2-s2235",
                  sweep_dir / "latin_square" / "learn-0.2-copy")
  with pytest.raises(ValueError, match="both have seed 2235"):
    ia.find_runs(str(sweep_dir))


def _missing_inputs_file_is_written_from_checkpoints_without_training(sweep_dir):
  """sweep_dir: the finished one-job sweep of _tiny_sweep(1, ("learn-0.2",)), checkpoints
  included (the end-to-end test above trains it as a job of its own sweep)."""
  config = _tiny_sweep(num_seeds=1, encodings=("learn-0.2",))
  (job,) = sweep.make_jobs(config, str(sweep_dir))
  assert sweep.job_status(job) == (True, None)
  metrics = (sweep_dir / "latin_square" / "learn-0.2-s2235" / "metrics.jsonl")
  before = metrics.read_text()
  os.remove(os.path.join(job.workdir, ia.JOB_INPUTS))
  finished, why = sweep.job_status(job)
  assert not finished and "missing" in why
  ((_, action, detail),) = sweep.plan(config, str(sweep_dir))
  assert action == "outputs" and ia.JOB_INPUTS in detail, detail
  progress = sweep.run_sweep(config, str(sweep_dir))
  assert progress.done == 1 and os.path.exists(os.path.join(job.workdir, ia.JOB_INPUTS))
  assert metrics.read_text() == before  # Not trained again.
  with pytest.raises(ValueError, match="sweep.job_outputs: unknown 'nothing'"):
    config.sweep.job_outputs = ("nothing",)
    sweep.make_jobs(config, str(sweep_dir))


def test_report_epoch_is_the_runs_final_epoch(tmp_path):
  # Runs merged by label in the report, and Tables 1-6 at their common final epoch.
  def run(name, seed, validation):
    folder = tmp_path / "s" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "task": "latin_square", "seed": seed, "grid": {"seeds": [seed]},
        "model": {"name": "ito", "pe": "learn", "pe_sigma": 0.2},
        "training": {"optimizer": "adam", "learning_rate": 1e-4, "weight_decay": 0.0,
                     "batch_size": 128}}))
    (folder / "metrics.jsonl").write_text(json.dumps(
        {"step": 12800, "epoch": 200.0, "evaluation": {"validation": {
            "overall": [validation]}}}) + "\n")
    (folder / "eval.json").write_text(json.dumps({"epoch": 200.0, "splits": ["validation"],
        "models": [{"seed": seed, "accuracy": {"validation": {"overall": validation}}}]}))
  run("learn-0.2-s2235", 2235, 0.9)
  run("learn-0.2-s6312", 6312, 1.0)
  dispatched = ito_report.report_kind(str(tmp_path / "s"), {}, str(tmp_path / "out"))
  assert "ours at epoch 200," in dispatched["text"]
  assert "| learn-0.2 | 0.950 ± 0.071 (2) | 0.994" not in dispatched["text"]
  assert "| learn-0.2 | 0.950 ± 0.071 (2) |" in dispatched["text"]
  # Targets: learn-0.2 within 2 SDs (|0.95 - 0.954| / 0.041), the ordering unknown.
  assert "| learn-0.2 | 0.950 ± 0.071 (2) | 0.954 ± 0.041 | 0.10 | yes |" in dispatched["text"]
  assert "a learn-σ run at epoch 200 is missing" in dispatched["text"]
