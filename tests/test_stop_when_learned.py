"""`training.stop_when_learned` (experiments/training/learned.py): a run stops at the first
evaluation during training at which the seeds of a learning rate average the threshold on
the training lengths; it is the prefix of the run without the rule, a resumed stopped run
trains no further, and the sweep counts it finished."""
import json
import os

import numpy as np
import pytest

from configs import table1
from experiments.analysis import stopping
from experiments.training import jobs as sweep
from experiments.training import learned
from experiments.training import loop
from experiments.training import validation
from tests.test_training import tiny_config

TIMING = ("steps_per_second", "train_seconds", "train_cpu_seconds",
          *loop.EVALUATION_TIMES)


def _config(steps=12, stop=0.0):
  config = tiny_config(steps=steps, log_every=2, checkpoint_every=4, stop_when_learned=stop)
  config.grid.seeds = (0, 1)
  config.evaluation.update(every_steps=2, periodic_batch_size=8)
  return config


def _read(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  with open(os.path.join(workdir, "eval.json")) as f:
    result = json.load(f)
  return records, result


def _untimed(record):
  return {k: v for k, v in record.items() if k not in TIMING}


def test_the_rule_takes_the_mean_over_the_seeds_of_the_best_learning_rate():
  members = [(0, 1e-3), (1, 1e-3), (0, 1e-2), (1, 1e-2)]
  accuracies = [0.90, 1.00, 0.96, 0.93]  # Means 0.95 (1e-3) and 0.945 (1e-2).
  assert learned.learned(accuracies, members, 0.95)
  assert not learned.learned(accuracies, members, 0.951)  # Not the mean of all: 0.9475.
  assert not learned.learned(accuracies, members, 0.96)  # Not the best model: 1.0.
  assert not learned.learned(accuracies, members, 0.0)  # 0: off.
  assert learned.learned(0.97, [(0, 1e-3)], 0.97)  # A single model's number.
  records = [{"step": 5, "loss": 1.0},
             {"step": 10, "evaluation": {"train_range": [0.9, 0.9, 0.9, 0.9]}},
             {"step": 20, "evaluation": {"train_range": accuracies}},
             {"step": 30, "evaluation": {"train_range": [1.0] * 4}}]
  assert learned.first_learned(records, members, 0.95) == 20
  assert learned.first_learned(records, members, 0.99) == 30
  assert learned.first_learned(records[:3], members, 0.99) is None
  with pytest.raises(ValueError, match="3 accuracies for a grid of 4"):
    learned.learned([1.0] * 3, members, 0.5)


@pytest.mark.parametrize("change, message", [
    (dict(stop_when_learned=1.5), r"training.stop_when_learned must be a number in \[0, 1\]"),
    (dict(stop_when_learned=0.9, every_steps=0), "set evaluation.every_steps > 0"),
    (dict(stop_when_learned=0.9, every_steps=3),
     "every_steps=3 must be a multiple of training.log_every=2"),
    (dict(stop_when_learned=0.9, min_length=4), "which the evaluation's 4..6 leaves out"),
])
def test_a_rule_the_run_cannot_apply_is_refused_in_one_line(change, message):
  config = _config()
  config.training.stop_when_learned = change.pop("stop_when_learned")
  config.evaluation.update(change)
  with pytest.raises(ValueError, match=message) as e:
    validation.validate(config)
  assert "\n" not in str(e.value)


def test_a_stopped_run_is_the_full_run_up_to_the_step_it_learned_at(tmp_path):
  full_records, full_result = _read_after(_config(), tmp_path / "full")
  assert learned.STOPPED not in full_result
  # The threshold: the best mean over the seeds before the last step, reached first at S;
  # by hand, the first evaluation at or above it is S.
  means = {r["step"]: np.mean(r["evaluation"]["train_range"]) for r in full_records
           if "evaluation" in r and r["step"] < 12}
  threshold = max(means.values())
  stop = min(step for step, mean in means.items() if mean >= threshold)
  stopped_records, stopped_result = _read_after(_config(stop=float(threshold)),
                                                tmp_path / "stopped")
  assert stopped_result["step"] == stopped_result[learned.STOPPED] == stop
  assert ([_untimed(r) for r in stopped_records]
          == [_untimed(r) for r in full_records if r["step"] <= stop])
  # Its models are those of a run of `stop` steps: the same final evaluation.
  _, short_result = _read_after(_config(steps=stop), tmp_path / "short")
  assert learned.STOPPED not in short_result
  assert ({k: v for k, v in stopped_result.items() if k not in (*TIMING, learned.STOPPED)}
          == {k: v for k, v in short_result.items() if k not in TIMING})
  # Run again (as after a stop during its final evaluation): from the checkpoint of the
  # step it stopped at, no further training, the same result.
  workdir = tmp_path / "stopped"
  os.remove(workdir / "eval.json")
  again_records, again_result = _read_after(_config(stop=float(threshold)), workdir)
  assert again_records == stopped_records
  assert _untimed(again_result) == _untimed(stopped_result)


def _read_after(config, workdir):
  loop.train_and_evaluate(config, str(workdir))
  return _read(str(workdir))


def test_the_sweep_counts_a_stopped_job_finished_within_its_steps(tmp_path):
  config = _config(steps=6, stop=1e-6)  # Any model meets it at its first evaluation.
  config.sweep = table1.get_config("scale=small").sweep
  config.sweep.tasks = ("reverse_string",)
  config.sweep.encodings = ("relative",)
  sweep_dir = str(tmp_path / "sweep")
  sweep.run_sweep(config, sweep_dir, job_fn=sweep.run_job)
  (job,) = sweep.make_jobs(config, sweep_dir)
  _, result = _read(job.workdir)
  assert result["step"] == result[learned.STOPPED] == 2
  assert sweep.job_status(job) == (True, None)
  (planned,) = sweep.plan(config, sweep_dir)
  assert planned[1:] == ("skip", "finished (learned at step 2 of 6: "
                                 "training.stop_when_learned stopped it)")
  # A higher cap stops at the same step: still finished. A lower one would not reach it.
  for steps, finished in ((10, True), (1, False)):
    config.training.steps = steps
    (job,) = sweep.make_jobs(config, sweep_dir)
    assert sweep.job_status(job)[0] is finished, steps
  assert "eval.json is for step 2, the config says 1" in sweep.job_status(job)[1]



def test_what_a_run_trained_to_the_end_would_have_given_stopped():
  """`stopping.stopped_at`: the first evaluation meeting the rule, read at the learning
  rate whose seeds met it; without one, the last evaluation at the best rate there."""
  members = [(0, 1e-3), (1, 1e-3), (0, 1e-2), (1, 1e-2)]
  records = [{"step": 50, "loss": 0.1},
             {"step": 100, "train_seconds": 10.0,
              "evaluation": {"train_range": [0.5, 0.5, 0.9, 0.9], "unseen": [0.1] * 4}},
             {"step": 200, "train_seconds": 20.0,
              "evaluation": {"train_range": [0.94, 0.95, 0.97, 0.95],
                             "unseen": [0.2, 0.3, 0.6, 0.4]}},
             {"step": 300, "train_seconds": 30.0,
              "evaluation": {"train_range": [1.0] * 4, "unseen": [0.5] * 4}}]
  got = stopping.stopped_at(records, members, 0.95)
  assert (got["step"], got["learned"], got["seconds"], got["learning_rate"]) == (
      200, True, 20.0, 1e-2)
  assert got["train"] == pytest.approx([97.0, 95.0]) and got["unseen"] == pytest.approx(
      [60.0, 40.0])
  never = stopping.stopped_at(records[:3], members, 0.99)
  assert (never["step"], never["learned"], never["learning_rate"]) == (200, False, 1e-2)
  assert stopping.stopped_at(records[:1], members, 0.95) is None
