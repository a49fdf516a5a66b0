"""modular_arithmetic (the paper's "simple" modular arithmetic, no brackets)."""
import numpy as np

from tasks.base import Task

MODULUS = 5
PLUS, MINUS, TIMES = 5, 6, 7  # Token 8 (the release's blank operator) is never sampled.


class ModularArithmetic(Task):
  """Digits 0..4 at even places, operators +, *, - at odd places; value mod 5.

  Standard precedence (products first). An even length is reduced by one, as in
  the release. Example: 1 + 2 * 3 -> 7 mod 5 = 2.
  """
  name, level, input_size, output_size, chance_accuracy = "modular_arithmetic", "regular", 9, 5, 20.0

  def input_length(self, length):
    return length if length % 2 else length - 1

  def _generate(self, rng, batch_size, length):
    length = self.input_length(length)
    digits = rng.integers(0, MODULUS, (batch_size, length // 2 + 1))
    ops = np.array([PLUS, TIMES, MINUS])[rng.integers(0, 3, (batch_size, length // 2))]
    tokens = np.empty((batch_size, length), np.int64)
    tokens[:, 0::2] = digits
    tokens[:, 1::2] = ops
    # Evaluate left to right with a running (sum, product) pair, vectorised over
    # the batch: '*' extends the current product, '+'/'-' close it.
    total = np.zeros(batch_size, np.int64)
    term = digits[:, 0].copy()
    for i in range(length // 2):
      op, digit = ops[:, i], digits[:, i + 1]
      times = op == TIMES
      total = np.where(times, total, (total + term) % MODULUS)
      signed = np.where(op == MINUS, -digit, digit)
      term = np.where(times, term * digit, signed) % MODULUS
    return tokens, ((total + term) % MODULUS)[:, None]
