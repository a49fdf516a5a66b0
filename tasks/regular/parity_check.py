"""parity_check: is the number of ones odd?"""

from tasks.base import Task


class ParityCheck(Task):
  """Random bits; output the number of ones mod 2. Example: 1 0 1 1 -> 1."""
  name, level, input_size, output_size, chance_accuracy = "parity_check", "regular", 2, 2, 50.0

  def _generate(self, rng, batch_size, length):
    bits = rng.integers(0, 2, (batch_size, length))
    return bits, (bits.sum(axis=1) % 2)[:, None]
