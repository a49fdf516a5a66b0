"""bucket_sort: sort tokens from a vocabulary of 5."""
import numpy as np

from tasks.base import Task


class BucketSort(Task):
  """L tokens from {0..4}; output them sorted. Example: 1 0 2 0 4 -> 0 0 1 2 4."""
  name, level, input_size, output_size, chance_accuracy = "bucket_sort", "cs", 5, 5, 20.0

  def output_length(self, length):
    return length

  def _generate(self, rng, batch_size, length):
    tokens = rng.integers(0, 5, (batch_size, length))
    return tokens, np.sort(tokens, axis=1)
