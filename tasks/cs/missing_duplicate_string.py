"""missing_duplicate_string: recover the symbol blanked out of a duplicated string."""
import numpy as np

from tasks.base import Task

MISSING, PAD = 2, 3


class MissingDuplicateString(Task):
  """Bits s of length L//2; input s s with one uniformly chosen place set to 2.

  An odd length is padded with token 3; the output is the replaced bit. Length
  1: input 1, output 1, as in the release. Example: 0 1 1 0 0 2 1 0 -> 1.
  """
  name, level, input_size, output_size, chance_accuracy = (
      "missing_duplicate_string", "cs", 4, 2, 50.0)

  def _generate(self, rng, batch_size, length):
    if length == 1:
      return np.ones((batch_size, 1), np.int64), np.ones((batch_size, 1), np.int64)
    half = rng.integers(0, 2, (batch_size, length // 2))
    doubled = np.concatenate([half, half], axis=1)
    missing = rng.integers(0, doubled.shape[1], batch_size)
    rows = np.arange(batch_size)
    answer = doubled[rows, missing]
    doubled[rows, missing] = MISSING
    inputs = np.concatenate([doubled, np.full((batch_size, length % 2), PAD)], axis=1)
    return inputs, answer[:, None]
