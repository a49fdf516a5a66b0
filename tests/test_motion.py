"""experiments/analysis/motion.py and the study report's "How far learned models move
between evaluations": the split of a job's seeds' changes between evaluations into the part
they share and each seed's own."""
import numpy as np
import pytest

from experiments.analysis import motion
from experiments.analysis import tables as report
from tests.test_paper_experiments import _evaluations, _job, _model, _table


def test_decompose_by_hand():
  # Two transitions of two seeds: changes (2, 4) and (0, 0). Trend 1.5; own variances
  # 2 and 0, so own = 1; the seeds' means 3 and 0 lie 1.5 from the trend, so the shared
  # variance is ((2.25 - 2/2) + (2.25 - 0/2)) / 2 = 1.75.
  parts = motion.decompose([[2.0, 4.0], [0.0, 0.0]])
  assert parts == {"transitions": 2, "trend": 1.5, "own": 1.0, "shared": pytest.approx(1.75 ** 0.5)}
  # Changes that differ only between the seeds: nothing shared (a negative estimate is 0).
  assert motion.decompose([[1.0, 3.0], [-1.0, 1.0]])["shared"] == 0.0
  # Changes common to the seeds: nothing of their own.
  parts = motion.decompose([[2.0, 2.0, 2.0], [-2.0, -2.0, -2.0]])
  assert parts["own"] == 0.0 and parts["shared"] == 2.0 and parts["trend"] == 0.0
  assert motion.decompose([]) is None
  with pytest.raises(ValueError, match="two or more seeds"):
    motion.decompose([[1.0]])


def test_decompose_recovers_the_shared_and_the_own_parts_of_simulated_jobs():
  """Jobs whose seeds' accuracy at each evaluation strays from a rising course by a
  deviation common to the job (std 2) and one of each seed (std 3), independent between
  evaluations: the changes' parts have stds 2·√2 and 3·√2; a decomposition that forgot
  the own part's share of the seeds' mean (var / S) would give 3.7 for the shared one."""
  rng = np.random.default_rng(0)
  changes = []
  for seeds in [3] * 150 + [2] * 50:  # Jobs may differ in seeds.
    evaluations = 20
    course = 60 + 0.5 * np.arange(evaluations)[:, None]
    unseen = (course + rng.normal(0, 2, (evaluations, 1))
              + rng.normal(0, 3, (evaluations, seeds)))
    changes += motion.transitions(np.full_like(unseen, 99.0), unseen, 95.0)
  parts = motion.decompose(changes)
  assert parts["transitions"] == 200 * 19
  assert parts["trend"] == pytest.approx(0.5, abs=0.1)
  assert parts["own"] == pytest.approx(3 * 2 ** 0.5, rel=0.03)
  assert parts["shared"] == pytest.approx(2 * 2 ** 0.5, rel=0.06)


def test_transitions_keep_only_learned_models():
  train = np.array([[99.0, 96.0], [94.0, 99.0], [99.0, 99.0], [95.0, 100.0], [99.0, 99.0]])
  unseen = np.array([[50.0, 50.0], [90.0, 10.0], [60.0, 62.0], [61.0, 60.0], [70.0, 64.0]])
  # Only the transitions whose both ends have every seed at >= 95%: 3 -> 4 and 4 -> 5.
  got = motion.transitions(train, unseen, 95.0)
  np.testing.assert_array_equal(np.array(got), [[1.0, -2.0], [9.0, 4.0]])
  assert motion.transitions(train[:, :1], unseen[:, :1], 95.0) == []  # One seed: no split.
  with pytest.raises(ValueError, match="one shape"):
    motion.transitions(train, unseen[:, :1], 95.0)


def test_the_study_report_splits_its_jobs_changes(tmp_path):
  """study.md's section: per task the decomposition of its jobs' transitions (learned
  models only, seeds at the best learning rate) beside the final std over seeds."""
  sweep_dir = tmp_path / "sweep"
  config = {"sweep": {"report": "study"}}
  curve = [1.0, 1.0, 0.5, 0.5]

  ones = [1.0, 1.0]
  _job(sweep_dir, "reverse_string", "relative",
       [_model(0, 1e-3, 0.5, curve), _model(1, 1e-3, 0.75, curve)], config,
       metrics=_evaluations([[0.5, 0.9], ones, ones, ones],
                            [[0.1, 0.9], [0.5, 0.5], [0.52, 0.54], [0.5, 0.5]], every=1000))
  # A learning rate the final evaluation did not pick: its model is left out.
  _job(sweep_dir, "reverse_string", "randomized_relative",
       [_model(0, 1e-3, 0.6, curve), _model(0, 1e-4, 0.1, curve), _model(1, 1e-3, 0.6, curve)],
       config, metrics=_evaluations([[1.0, 1.0, 1.0]] * 2, [[0.6, 0.0, 0.6], [0.7, 1.0, 0.66]],
                                   every=1000))
  out = report.write_report(str(sweep_dir))
  assert out["kind"] == "study"
  expected = motion.decompose([[2.0, 4.0], [-2.0, -4.0], [10.0, 6.0]])
  [row] = out["motion"]
  assert row["task"] == "reverse_string" and row["jobs"] == 2 and row["interval"] == "1000"
  for key in ("transitions", "trend", "own", "shared"):
    assert row[key] == pytest.approx(expected[key], abs=1e-9), key
  assert row["final_std"] == pytest.approx(np.mean([12.5, 0.0])) and row["final_jobs"] == 2
  text = out["table"]
  section = text[text.index("### How far learned models move between evaluations"):]
  rows = _table(section)
  assert rows[0] == ["task", "jobs", "transitions", "steps apart", "trend", "own", "shared",
                     "final std over seeds (jobs)"]
  assert rows[1] == ["reverse_string", "2", "3", "1000", f"{expected['trend']:+.1f}",
                     f"{expected['own']:.1f}", f"{expected['shared']:.1f}", "6.2 (2)"]
