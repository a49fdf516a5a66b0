"""The fixed datasets `config.task` accepts beside the generated tasks of `tasks.TASKS`.

A dataset is a `Dataset`: named splits of examples read as they are (no empty token),
each example T tokens with its answer (one class) read at the last one. `DATASETS` maps a
name to a loader, `DATASETS.get(name)()` -> Dataset, loaded once per process. Adding a
dataset is one loader and one `DATASETS.register` line here (or in your own file);
`experiments.training.data.source(config)` reads it in shuffled epochs (`EpochBatches`).

  latin_square   the Latin Square Task of Ito et al. 2024 in the original splits
                 (`tasks/latin_square/`, docs/ito.md)

Shapes: N examples of a split, T tokens per example.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import numpy as np

from randomized_pe import registry


class Examples(NamedTuple):
  """The examples of one split of a dataset.

  Attributes:
    tokens: int32 [N, T].
    answers: int32 [N], a class each (read at the last token).
    groups: int32 [N], an index into the dataset's `group_names` (e.g. a condition).
  """

  tokens: np.ndarray
  answers: np.ndarray
  groups: np.ndarray


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A fixed dataset with named splits, read as it is (no empty token).

  Attributes:
    name: its name as `config.task`.
    vocab_size: input ids; the model embeds [0, vocab_size).
    output_size: answer classes.
    sequence_length: T, the tokens of every example; the answer is read at the last one.
    splits: split name -> Examples.
    train_split: the split training reads.
    group_names: groups the metrics are also given for (e.g. conditions).
    accuracy: (correct [N], groups [N]) -> {"overall": a, group name: a, ...}, exact
      means over examples.
  """

  name: str
  vocab_size: int
  output_size: int
  sequence_length: int
  splits: dict
  train_split: str
  group_names: tuple
  accuracy: Callable[[np.ndarray, np.ndarray], dict]


# name -> loader() -> Dataset (cached: loaded once per process).
DATASETS: registry.Registry[Callable[[], Dataset]] = registry.Registry("dataset")


@functools.lru_cache(maxsize=None)
def _latin_square() -> Dataset:
  """The Latin Square Task of Ito et al. 2024, the original splits (tasks/latin_square/data.py)."""
  from tasks.latin_square import data as lst  # pylint: disable=import-outside-toplevel

  loaded = lst.load()
  return Dataset(
      name="latin_square", vocab_size=lst.VOCAB_SIZE, output_size=lst.NUM_SHAPES,
      sequence_length=lst.NUM_CELLS,
      splits={name: Examples(split.tokens, split.answers, split.conditions)
              for name, split in loaded.splits().items()},
      train_split="train", group_names=lst.CONDITIONS, accuracy=lst.accuracy_by_condition)


DATASETS.register("latin_square", _latin_square)
