"""configs/scales.py: the scales of the experiment configs, defined in one place (issue 25).

The snapshot tests/data/job_configs.json.gz holds every job config of every experiment at
`full` and `small` as the commit before the `cpu` scale made them (ad5efe6); a change that
alters one of them on purpose must regenerate it and say why in its commit. Settings added
to configs/default.py since are listed in ADDED_SINCE_SNAPSHOT with the value that keeps
the earlier behaviour: a job config may hold them at that value only.
"""
import gzip
import importlib
import json
import os

import ml_collections
import pytest

import tasks
from configs import scales
from experiments.training import data
from experiments.training import jobs as sweep
from experiments.training import validation

EXPERIMENTS = ("table1", "table3", "table5", "figure2", "figure3", "su")
SNAPSHOT = os.path.join(os.path.dirname(__file__), "data", "job_configs.json.gz")
# Settings added to configs/default.py after the snapshot, at their neutral values.
ADDED_SINCE_SNAPSHOT = {"training.lr_schedule": "constant", "training.lr_warmup_steps": 0,
                        "training.lr_decay_steps": 0, "grid.layout": "vmap",
                        "training.stop_when_learned": 0.0}


def _jobs(name, scale):
  module = importlib.import_module(f"configs.{name}")
  return sweep.make_jobs(module.get_config(f"scale={scale}"), "/SWEEP")


@pytest.fixture(scope="module")
def snapshot():
  with gzip.open(SNAPSHOT, "rt") as f:
    return json.load(f)


@pytest.mark.parametrize("name", EXPERIMENTS)
@pytest.mark.parametrize("scale", ("full", "small"))
def test_full_and_small_jobs_are_identical_to_before(name, scale, snapshot):
  before = snapshot[f"{name}:{scale}"]
  now = {job.name: job.config for job in _jobs(name, scale)}
  assert sorted(now) == sorted(before)
  for job_name, config in now.items():
    flat, flat_before = _flat(config), _flat(before[job_name])
    added = {k: v for k, v in flat.items() if k not in flat_before}
    assert added == ADDED_SINCE_SNAPSHOT, job_name
    # Without them, byte for byte.
    assert (json.dumps(_without(config, added), sort_keys=True)
            == json.dumps(before[job_name], sort_keys=True)), job_name


def _flat(d, prefix=""):
  out = {}
  for key, value in d.items():
    out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict)
               else {f"{prefix}{key}": value})
  return out


def _without(d, paths, prefix=""):
  return {k: (_without(v, paths, f"{prefix}{k}.") if isinstance(v, dict) else v)
          for k, v in d.items() if f"{prefix}{k}" not in paths}


# The tasks whose steps or batch differ from the scale's 6,000 steps of batch 128, written
# out here rather than read from scales.CPU_TASK_OVERRIDES, so that a change there fails.
CPU_STEPS_AND_BATCH = {"odds_first": (12000, 128), "duplicate_string": (12000, 64)}
# Per CPU scale: (layers, d_model, heads), steps and batch of most tasks, those of the
# others, `training.stop_when_learned`.
CPU_PROTOCOLS = {
    "cpu": ((5, 64, 8), (6000, 128), CPU_STEPS_AND_BATCH, 0.0),
    "cpu_lite": ((2, 64, 8), (20000, 128),
                 {"odds_first": (30000, 128), "duplicate_string": (20000, 64)}, 0.95),
}


def _steps_and_batch(job_config):
  return job_config["training"]["steps"], job_config["training"]["batch_size"]


@pytest.mark.parametrize("name", EXPERIMENTS)
@pytest.mark.parametrize("scale", scales.CPU_SCALES)
def test_cpu_scales_resolve_to_their_protocol(name, scale, tmp_path):
  model, steps_and_batch, by_task, learned = CPU_PROTOCOLS[scale]
  jobs = sweep.make_jobs(
      importlib.import_module(f"configs.{name}").get_config(f"scale={scale}"), str(tmp_path))
  assert jobs and not os.listdir(tmp_path)  # Listing jobs writes nothing.
  for job in jobs:
    validation.validate(ml_collections.ConfigDict(job.config))
    c = job.config
    assert job.task in scales.CPU_TASKS
    n, m = c["training"]["max_length"], c["evaluation"]["max_length"]
    big_l = c["model"]["max_position"]
    # The protocol: N >= 12, M >= 4N, L >= 4M; the paper's model; >= 3 seeds.
    if not job.variant.startswith("relative_N"):  # Figure 2's classic model trains to M.
      assert n >= 12 and m >= 4 * n, job.name
    if name != "figure3":  # Figure 3 sweeps L itself, from just above the longest sequence.
      assert big_l >= 4 * m, job.name
    # Every sequence the run samples positions for fits below L (else it stops at start).
    assert big_l >= data.sequence_length(tasks.get(job.task), m), job.name
    assert (c["model"]["num_layers"], c["model"]["d_model"], c["model"]["num_heads"]) == model
    assert len(c["grid"]["seeds"]) >= 3 and len(set(c["grid"]["seeds"])) == len(c["grid"]["seeds"])
    # The scale's steps and batch, where a task needs others (CPU_TASK_OVERRIDES).
    assert _steps_and_batch(c) == by_task.get(job.task, steps_and_batch), job.name
    # Figure 2 follows its runs to the end, on unseen lengths only.
    assert c["training"]["stop_when_learned"] == (0.0 if name == "figure2" else learned)


def test_cpu_table1_core_is_seven_tasks_by_three_pairs():
  jobs = _jobs("table1", "cpu")
  assert {j.task for j in jobs} == set(scales.CPU_TASKS) and len(scales.CPU_TASKS) == 7
  pes = {j.pe for j in jobs}
  assert pes == {p for f in ("sin_cos", "relative", "rope") for p in (f, "randomized_" + f)}


def test_unknown_scale_is_one_line_naming_the_choices():
  for name in EXPERIMENTS:
    with pytest.raises(ValueError, match=r"unknown scale 'huge'; valid choices: full, small, cpu, cpu_lite$"):
      importlib.import_module(f"configs.{name}").get_config("scale=huge")


def test_cpu_task_overrides_reach_only_their_task():
  jobs = _jobs("table1", "cpu")
  for job in jobs:
    c = job.config
    got = (c["training"]["max_length"], c["evaluation"]["max_length"], c["model"]["max_position"])
    if job.task == "missing_duplicate_string":
      assert got == (20, 80, 512), job.name
    else:
      assert got == (scales.CPU_MAX_LENGTH, scales.CPU_TEST_LENGTH, scales.CPU_MAX_POSITION)
    assert _steps_and_batch(c) == CPU_STEPS_AND_BATCH.get(job.task, (6000, 128)), job.name


def test_task_overrides_come_before_variants_and_refuse_unknown_tasks():
  config = importlib.import_module("configs.su").get_config("scale=small")
  config.sweep.tasks = ("reverse_string", "odds_first")
  config.sweep.encodings = ("relative",)
  config.sweep.variants = (("L64", {"model.max_position": 64}),)
  config.sweep.task_overrides = (("odds_first", {"model.max_position": 100,
                                                 "training.max_length": 9}),)
  got = {j.name: (j.config["model"]["max_position"], j.config["training"]["max_length"])
         for j in sweep.make_jobs(config, "/SWEEP")}
  assert got["odds_first/relative"] == (100, 9)
  assert got["odds_first/L64"] == (64, 9)  # The variant's setting wins.
  assert got["reverse_string/relative"] == (128, 8)
  # A task the sweep leaves out keeps its overrides, unused (a scale's sweep narrowed by
  # --config.sweep.tasks), but a name that is no task, or an unknown setting, is refused.
  config.sweep.task_overrides = (("bucket_sort", {"model.max_position": 100}),)
  assert {j.name: j.config["model"]["max_position"] for j in sweep.make_jobs(
      config, "/SWEEP")} == {"reverse_string/relative": 128, "reverse_string/L64": 64,
                             "odds_first/relative": 128, "odds_first/L64": 64}
  config.sweep.task_overrides = (("bucket_srot", {"model.max_position": 100}),)
  with pytest.raises(ValueError, match=r"'bucket_srot' is no task; valid names: .*"
                                       r"bucket_sort.*latin_square"):
    sweep.make_jobs(config, "/SWEEP")
  config.sweep.task_overrides = (("bucket_sort", {"model.no_such": 1}),)
  with pytest.raises(ValueError, match=r"task 'bucket_sort' overrides 'model.no_such'"):
    sweep.make_jobs(config, "/SWEEP")
  config.sweep.task_overrides = (("odds_first", {"model.no_such": 1}),)
  with pytest.raises(ValueError, match=r"task 'odds_first' overrides 'model.no_such', but "
                                       r"the config has no setting model.no_such"):
    sweep.make_jobs(config, "/SWEEP")
