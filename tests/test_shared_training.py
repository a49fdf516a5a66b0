"""Runs that differ only in evaluation settings share one training (the loop's
`companions`, the sweep's `share_training`): the companion's files equal those of the
same run trained alone, resumed or not, and the sweep trains such jobs once."""
import json
import os

import pytest

from configs import default
from experiments.analysis import tables
from experiments.storage import io_utils
from experiments.training import jobs as sweep
from experiments.training import loop

# Written per run; the rest of a companion's files must equal the run trained alone.
TIMINGS = ("steps_per_second", "train_seconds", "train_cpu_seconds",
           *loop.EVALUATION_TIMES)


def tiny_config(steps=6):
  config = default.get_config()
  config.task = "reverse_string"
  config.model.pe = "randomized_relative"
  config.model.update(num_layers=1, num_heads=2, d_model=16, widening_factor=2,
                      max_position=64)
  config.training.update(steps=steps, batch_size=8, learning_rate=1e-3, max_length=3,
                         log_every=3, checkpoint_every=2, prefetch=2, max_programs=1)
  config.evaluation.update(max_length=5, batch_size=8, periodic_batch_size=8, every_steps=3)
  config.progress = False
  return config


def evenly_spaced(config):
  """Su's "+even": the same training, other test positions and evaluation seed."""
  config = config.copy_and_resolve_references()
  config.evaluation.update(positions="evenly_spaced", seed=7)
  return config


def _without_timings(value):
  if isinstance(value, dict):
    return {k: _without_timings(v) for k, v in value.items()
            if k not in TIMINGS and k != loop.SHARED_TRAINING}
  if isinstance(value, list):
    return [_without_timings(v) for v in value]
  return value


def _files(workdir):
  """(metrics.jsonl records, eval.json) without the timings."""
  records = io_utils.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  result = io_utils.read_json(os.path.join(workdir, "eval.json"))
  return _without_timings(records), _without_timings(result)


def test_companion_equals_its_run_trained_alone_and_resumes(tmp_path):
  alone = str(tmp_path / "alone")
  loop.train_and_evaluate(evenly_spaced(tiny_config()), alone)
  host, twin = str(tmp_path / "host"), str(tmp_path / "twin")
  host_result = loop.train_and_evaluate(tiny_config(), host,
                                        companions=[(evenly_spaced(tiny_config()), twin)])
  records, result = _files(twin)
  assert (records, result) == _files(alone)
  assert [(r["step"], "evaluation" in r) for r in records] == [
      (3, False), (3, True), (6, False), (6, True)]
  twin_result = io_utils.read_json(os.path.join(twin, "eval.json"))
  assert twin_result[loop.SHARED_TRAINING] == os.path.join("..", "host")
  assert twin_result["train_seconds"] == host_result["train_seconds"]
  assert not os.path.exists(os.path.join(twin, "checkpoints"))
  assert json.load(open(os.path.join(twin, "config.json")))["evaluation"]["seed"] == 7
  # The host's training records are the twin's; its evaluations (other positions and
  # seed) are its own.
  host_records = _without_timings(io_utils.read_jsonl(os.path.join(host, "metrics.jsonl")))
  assert ([r for r in host_records if "evaluation" not in r]
          == [r for r in records if "evaluation" not in r])
  assert ([r["evaluation"]["accuracy"] for r in host_records if "evaluation" in r]
          != [r["evaluation"]["accuracy"] for r in records if "evaluation" in r])

  # Stopped after the checkpoint of step 4 (inside a log interval), then resumed.
  host2, twin2 = str(tmp_path / "host2"), str(tmp_path / "twin2")
  loop.train_and_evaluate(tiny_config(4), host2, companions=[(evenly_spaced(tiny_config(4)),
                                                               twin2)])
  loop.train_and_evaluate(tiny_config(), host2, companions=[(evenly_spaced(tiny_config()),
                                                             twin2)])
  assert _files(twin2) == _files(alone)
  assert _files(host2) == _files(host)


def test_companions_that_cannot_share_are_refused_before_anything_is_written(tmp_path):
  host = str(tmp_path / "host")
  other_rate = evenly_spaced(tiny_config())
  other_rate.training.learning_rate = 3e-3
  with pytest.raises(ValueError, match="training.learning_rate"):
    loop.train_and_evaluate(tiny_config(), host, companions=[(other_rate, str(tmp_path / "a"))])
  other_schedule = evenly_spaced(tiny_config())
  other_schedule.evaluation.every_steps = 2
  with pytest.raises(ValueError, match="evaluation.every_steps"):
    loop.train_and_evaluate(tiny_config(), host,
                            companions=[(other_schedule, str(tmp_path / "b"))])
  assert not os.path.exists(host) and not os.listdir(tmp_path)
  # A host trained to step 4 on its own: a new companion missed its evaluation at 3.
  loop.train_and_evaluate(tiny_config(4), host)
  with pytest.raises(ValueError, match="not evaluated beside"):
    loop.train_and_evaluate(tiny_config(), host,
                            companions=[(evenly_spaced(tiny_config()), str(tmp_path / "c"))])
  assert sorted(os.listdir(tmp_path)) == ["host"]
  # The sweep pairs neither that one nor a folder holding another run's config.json.
  fresh = _job(tiny_config(), str(tmp_path / "fresh"), "fresh")
  twin = _job(evenly_spaced(tiny_config()), str(tmp_path / "c"), "c")
  assert sweep._can_share(fresh, twin)  # pylint: disable=protected-access
  assert not sweep._can_share(_job(tiny_config(), host, "host"), twin)  # pylint: disable=protected-access
  other = tiny_config()
  other.training.learning_rate = 3e-3
  os.makedirs(tmp_path / "c")
  io_utils.write_json(str(tmp_path / "c" / "config.json"), other.to_dict())
  assert not sweep._can_share(fresh, twin)  # pylint: disable=protected-access


def _job(config, workdir, variant):
  return sweep.Job(config.task, config.model.pe, workdir, config.to_dict(), variant)


def _sweep_config():
  config = tiny_config()
  config.sweep = {"tasks": ("reverse_string",),
                  "variants": (("plain", {}),
                               ("relative", {"model.pe": "relative"}),
                               ("plain+even", {"evaluation.positions": "evenly_spaced"}))}
  return config


def test_sweep_trains_jobs_of_one_training_once(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  planned = {job.variant: (action, detail)
             for job, action, detail in sweep.plan(_sweep_config(), sweep_dir, max_jobs=1)}
  assert planned["plain"][0] == "start"
  assert planned["plain+even"] == ("share", "evaluated on the training of reverse_string/"
                                   "plain (only evaluation settings differ)")
  assert planned["relative"][0] == "later"  # max_jobs counts trainings.

  calls = []
  progress = sweep.run_sweep(_sweep_config(), sweep_dir, job_fn=lambda c, w, companions: (
      calls.append((os.path.basename(w), [os.path.basename(cw) for _, cw in companions])),
      sweep.run_job(c, w, companions)))
  assert calls == [("plain", ["plain+even"]), ("relative", [])]
  assert (progress.done, progress.total, progress.failed) == (3, 3, [])
  jobs = sweep.make_jobs(_sweep_config(), sweep_dir)
  assert all(map(sweep.is_finished, jobs))
  twin = io_utils.read_json(os.path.join(sweep_dir, "reverse_string", "plain+even",
                                         "eval.json"))
  assert twin[loop.SHARED_TRAINING] == os.path.join("..", "plain")
  assert [a for _, a, _ in sweep.plan(_sweep_config(), sweep_dir)] == ["skip"] * 3

  # The report reads the pair seed by seed (the same models), and no other pair.
  report = tables.write_report(sweep_dir)
  host = io_utils.read_json(os.path.join(sweep_dir, "reverse_string", "plain", "eval.json"))
  [row] = report["paired"]
  assert row["family"] == "plain → plain+even"
  expected = 100 * (twin["models"][0]["scores"]["unseen"]
                    - host["models"][0]["scores"]["unseen"])
  assert row["differences"] == [pytest.approx(expected, abs=1e-9)]
  assert "## The same models under two evaluations" in open(
      os.path.join(report["out_dir"], "variants.md")).read()
  jobs_md = open(os.path.join(report["out_dir"], "jobs.md")).read()
  assert "| reverse_string | plain+even |" in jobs_md and "trained with plain |" in jobs_md


def _paired_results(before_unseen, after_unseen, train_ranges):
  """A task's two jobs on one training (the later evaluated on the earlier's), seed i's
  models at unseen accuracies before_unseen[i] / after_unseen[i] and training-length
  accuracy train_ranges[i] (the two evaluations of one model share it)."""
  def models(unseen):
    return [{"seed": i, "learning_rate": 1e-3,
             "scores": {"unseen": u, "train_range": t}}
            for i, (u, t) in enumerate(zip(unseen, train_ranges))]
  return {("t", "a"): {"models": models(before_unseen)},
          ("t", "a+even"): {"models": models(after_unseen),
                            loop.SHARED_TRAINING: os.path.join("..", "a")}}


def test_a_paired_verdict_leaves_out_the_seeds_that_did_not_learn(tmp_path):
  # Seed 0 did not learn (0.93): its -1.0 is left out; seeds 1 and 2 (+3.0, +3.6) hold.
  results = _paired_results([0.594, 0.912, 0.922], [0.584, 0.942, 0.958],
                            [0.935, 0.996, 0.996])
  [row] = tables.paired_effect_rows(str(tmp_path), results, ["t"], ["a", "a+even"])
  assert row["differences"] == pytest.approx([-1.0, 3.0, 3.6], abs=1e-9)
  assert row["learned"] == [False, True, True]
  assert (row["mean"], row["std"]) == (pytest.approx(3.3, abs=1e-9),
                                       pytest.approx(0.3, abs=1e-9))
  assert row["verdict"] == "holds"
  line = tables.paired_effect_markdown([row]).splitlines()[-1]
  assert line == "| t | a → a+even | 0, 1, 2 | -1.0†, +3.0, +3.6 | +3.3 ± 0.3 (seeds 1, 2) | ✓ |"
  # Counted over all three the mean (+1.9) is within its std (2.0): the exclusion decides.
  # One seed left is no verdict; the mean and std are then over every seed.
  results = _paired_results([0.594, 0.912, 0.922], [0.584, 0.942, 0.958],
                            [0.935, 0.90, 0.996])
  [row] = tables.paired_effect_rows(str(tmp_path), results, ["t"], ["a", "a+even"])
  assert row["verdict"] == "not learned"
  assert row["mean"] == pytest.approx((-1.0 + 3.0 + 3.6) / 3, abs=1e-9)
  assert tables.paired_effect_markdown([row]).splitlines()[-1].endswith(
      "| -1.0†, +3.0†, +3.6 | +1.9 ± 2.0 | † |")
  # Every seed learned: all count, nothing marked.
  results = _paired_results([0.5, 0.6, 0.7], [0.4, 0.6, 0.8], [0.99, 0.99, 0.99])
  [row] = tables.paired_effect_rows(str(tmp_path), results, ["t"], ["a", "a+even"])
  assert (row["learned"], row["verdict"]) == ([True] * 3, "within one std")
  assert tables.paired_effect_markdown([row]).splitlines()[-1] == (
      "| t | a → a+even | 0, 1, 2 | -10.0, +0.0, +10.0 | +0.0 ± 8.2 | ≈ |")
