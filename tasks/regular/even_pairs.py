"""even_pairs: is the number of unequal adjacent pairs (01 or 10) odd?"""
import numpy as np

from tasks.base import Task


class EvenPairs(Task):
  """Random bits; output 1 iff the count of unequal adjacent pairs is odd.

  Example: 0 1 1 0 -> pairs 01, 11, 10 -> two unequal -> 0.
  """
  name, level, input_size, output_size, chance_accuracy = "even_pairs", "regular", 2, 2, 50.0

  def _generate(self, rng, batch_size, length):
    bits = rng.integers(0, 2, (batch_size, length))
    unequal = np.sum(bits[:, 1:] != bits[:, :-1], axis=1)
    return bits, (unequal % 2)[:, None]
