"""Base class of the length-generalization tasks.

A task turns (key, batch_size, length) into integer tokens:
  {"input": int32[B, n], "output": int32[B, output_length(length)], "mask": bool[B, O]}
where n = input_length(length) (equal to `length` except for modular_arithmetic,
which needs an odd length), and the mask marks the output positions that count
for accuracy. Generation runs in numpy on the host, vectorised over the batch,
from a numpy Generator seeded by the JAX key: the batch is a function of
(key, batch_size, length) only, with no global random state.
"""

from __future__ import annotations

import numpy as np


def numpy_rng(key) -> np.random.Generator:
  """A numpy Generator seeded by a JAX key (typed or raw uint32) or an int."""
  if isinstance(key, (int, np.integer)):
    return np.random.default_rng(int(key))
  import jax  # pylint: disable=import-outside-toplevel

  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return np.random.default_rng(np.asarray(key, dtype=np.uint32).ravel())


class Task:
  """A task of the benchmark. Subclasses set the attributes and `_generate`."""

  name: str = ""
  level: str = ""  # "regular", "dcf" or "cs".
  input_size: int = 0  # Token ids are in [0, input_size).
  output_size: int = 0  # Output classes are in [0, output_size).
  chance_accuracy: float = 0.0  # In percent, as the paper reports it.
  # Output positions after this token do not count for accuracy (None: all count).
  termination_token: int | None = None

  def input_length(self, length: int) -> int:
    """Number of input tokens of a sample asked for with `length`."""
    return length

  def output_length(self, length: int) -> int:
    """Number of output tokens of a sample asked for with `length`."""
    del length
    return 1

  def sample_batch(self, key, batch_size: int, length: int) -> dict[str, np.ndarray]:
    """Returns {"input", "output", "mask"} for `batch_size` samples of `length`."""
    for arg, value in (("batch_size", batch_size), ("length", length)):
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{self.name}: {arg} must be an int >= 1, got {value!r}")
    inputs, outputs = self._generate(numpy_rng(key), int(batch_size), int(length))
    if self.termination_token is None:
      mask = np.ones(outputs.shape, bool)
    else:
      # Everything up to and including the first termination token counts.
      stop = np.argmax(outputs == self.termination_token, axis=1)
      mask = np.arange(outputs.shape[1])[None, :] <= stop[:, None]
    return {
        "input": np.ascontiguousarray(inputs, np.int32),
        "output": np.ascontiguousarray(outputs, np.int32),
        "mask": mask,
    }

  def _generate(self, rng: np.random.Generator, batch_size: int, length: int):
    raise NotImplementedError

  def __repr__(self):
    return f"<task {self.name} ({self.level})>"
