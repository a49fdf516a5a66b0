"""duplicate_string: output the input twice."""
import numpy as np

from tasks.base import Task


class DuplicateString(Task):
  """Random bits s; output s s (length 2L). Example: 0 1 1 -> 0 1 1 0 1 1."""
  name, level, input_size, output_size, chance_accuracy = "duplicate_string", "cs", 2, 2, 50.0

  def output_length(self, length):
    return 2 * length

  def _generate(self, rng, batch_size, length):
    bits = rng.integers(0, 2, (batch_size, length))
    return bits, np.concatenate([bits, bits], axis=1)
