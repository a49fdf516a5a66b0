"""A trained run read back from its folder: `restore_run(workdir)`.

The one way the analyses (`experiments.analyze`, `experiments.ito_analysis`) and the tests
load a run of `python -m experiments.train` (or a job of `experiments.sweep`): its
`config.json` gives the data source, the model and the grid of models, and a checkpoint
the stacked training state. The restore target is abstract (`jax.eval_shape` of the
initial state), so nothing is compiled to read a run.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

import jax
import ml_collections
import numpy as np

from experiments.storage import checkpoints
from experiments.training import data
from experiments.training import steps
from experiments.storage import workdir as workdir_lib


@dataclasses.dataclass(frozen=True)
class TrainedRun:
  """A run's config, what it builds, and its state at one checkpoint.

  Attributes:
    workdir: the run's folder (absolute).
    config: its config (config.json).
    source: its data (`experiments.training.data.source(config)`); `task` is its task or dataset.
    model: the model (`experiments.training.steps.build_model`).
    members: (seed, learning rate) of each model of the grid (`steps.grid_members`).
    step: the checkpoint's step.
    state: the stacked `steps.TrainState` [M, ...] (M = len(members)).
  """

  workdir: str
  config: ml_collections.ConfigDict
  source: object
  model: object
  members: list
  step: int
  state: steps.TrainState

  @property
  def task(self):
    return self.source.task

  def params(self, member: int = 0):
    """The parameters of model `member` of the grid, as host arrays (indexed on the
    host: an index per parameter shape would each compile a program)."""
    return jax.tree_util.tree_map(lambda p: np.asarray(p)[member], self.state.params)

  def epoch(self) -> Optional[float]:
    """Epochs trained at `step` for a dataset read in epochs; None for generated tasks."""
    epoch = getattr(self.source, "epoch", None)
    return None if epoch is None else epoch(self.step)


def restore_run(workdir: str, step: Optional[int] = None) -> TrainedRun:
  """The run in `workdir` at its newest readable checkpoint, or at `step`.

  Damaged checkpoints are moved aside as training does (`checkpoints.Checkpoints`).

  Raises:
    FileNotFoundError: no config.json, no readable checkpoint, or none at `step`.
    io_utils.CorruptFileError: a damaged config.json.
    ValueError: a config the project cannot build (an unknown encoding, say).
    checkpoints.StorageError: the operating system refused a read.
  """
  workdir = os.path.abspath(workdir)
  stored = workdir_lib.stored_config(workdir)
  if stored is None:
    raise FileNotFoundError(f"{workdir} has no {workdir_lib.CONFIG_FILE}: not a run of "
                            "python -m experiments.train")
  config = ml_collections.ConfigDict(stored)
  source = data.source(config)
  model = steps.build_model(config, source.task)
  members = steps.grid_members(config)
  target = jax.eval_shape(lambda: steps.init_grid(model, config, members,
                                                  data.example_tokens(source.task)))
  store = checkpoints.Checkpoints(workdir)
  try:
    if step is None:
      restored = store.restore_latest(target)
      if restored is None:
        raise FileNotFoundError(f"no readable checkpoint in {store.folder}")
      step, state, _ = restored
    else:
      if step not in store.steps():
        raise FileNotFoundError(f"no checkpoint of step {step} in {store.folder} (steps: "
                                f"{store.steps()})")
      import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
      state = store.manager.restore(step, args=ocp.args.StandardRestore(target))
  finally:
    store.close()
  return TrainedRun(workdir, config, source, model, members, int(step), state)
