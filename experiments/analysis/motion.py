"""How far a learned model's unseen-length accuracy moves between the evaluations during
training, and how much of that motion the models of one job share.

The models of a job (a grid of seeds) train on the same batches (README, "Reproducing
Table 1: grids of models"), so the std over a job's seeds at its final evaluation, which
the reports' verdicts compare gains with, measures what differs between the seeds (the
initialisation, dropout, the positions drawn), not what the shared batches do to all of
them at once. The evaluations during training see both: they evaluate the same sequences
every time (`evaluation.seed`), so between two consecutive ones each seed's unseen-length
accuracy changes by d_s = c + e_s, a part c common to the job's seeds and a part e_s of
the seed's own.

`decompose` estimates, over the transitions (pairs of consecutive evaluations) of a set of
jobs at which every seed had learned its training lengths at both ends:
  trend   the mean change, in points a transition (positive: still improving);
  own     the std of a seed's own part: the square root of the mean over transitions of
          the variance of the changes across the seeds (ddof=1), whose expectation is
          var(e);
  shared  the std of the common part about the trend: the square root of the mean over
          transitions of (mean_s d - trend)^2 - var_s(d) / S, whose expectation is var(c)
          up to the trend's own error (0 where the estimate is negative).
If the deviations at successive evaluations were independent, a seed's accuracy at any one
evaluation (the final one among them) would stray from its job's course by about
own / sqrt(2) on its own and shared / sqrt(2) with its job's other seeds.
"""
from __future__ import annotations

import numpy as np


def transitions(train, unseen, trained: float) -> list[np.ndarray]:
  """The changes of unseen-length accuracy [S] between consecutive evaluations of one job
  (train and unseen: [evaluations, S] in %) at which every seed was at `trained` or more
  on its training lengths at both ends; none for a job of one seed."""
  train, unseen = np.asarray(train, np.float64), np.asarray(unseen, np.float64)
  if train.shape != unseen.shape or train.ndim != 2:
    raise ValueError(f"train and unseen must be [evaluations, seeds] arrays of one shape, "
                     f"got {train.shape} and {unseen.shape}")
  if unseen.shape[1] < 2:
    return []
  learned = train.min(axis=1) >= trained
  return [unseen[i + 1] - unseen[i] for i in range(len(unseen) - 1)
          if learned[i] and learned[i + 1]]


def decompose(changes) -> dict | None:
  """{"transitions", "trend", "own", "shared"} (points) from a list of transitions' changes
  (each an array over the seeds of one job, two or more; jobs may differ in seeds); None
  for an empty list."""
  changes = [np.asarray(d, np.float64) for d in changes]
  if not changes:
    return None
  if any(d.ndim != 1 or d.size < 2 for d in changes):
    raise ValueError("each transition needs the changes of two or more seeds")
  trend = float(np.mean(np.concatenate(changes)))
  own_var = np.array([d.var(ddof=1) for d in changes])
  common = np.array([(d.mean() - trend) ** 2 for d in changes])
  seeds = np.array([d.size for d in changes])
  shared_var = float(np.mean(common - own_var / seeds))
  return {"transitions": len(changes), "trend": trend,
          "own": float(np.sqrt(own_var.mean())), "shared": float(np.sqrt(max(shared_var, 0.0)))}
