"""odds_first: the symbols at odd indices, then those at even indices."""
import numpy as np

from tasks.base import Task


class OddsFirst(Task):
  """Random bits; output those at 0-based indices 1, 3, 5, ... then 0, 2, 4, ...

  This is what the release's code does (its docstring says the reverse).
  Example: 0 1 1 0 1 -> 1 0 0 1 1.
  """
  name, level, input_size, output_size, chance_accuracy = "odds_first", "cs", 2, 2, 50.0

  def output_length(self, length):
    return length

  def _generate(self, rng, batch_size, length):
    bits = rng.integers(0, 2, (batch_size, length))
    return bits, np.concatenate([bits[:, 1::2], bits[:, 0::2]], axis=1)
