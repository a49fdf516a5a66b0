"""reverse_string: output the input reversed."""
from tasks.base import Task


class ReverseString(Task):
  """Random bits; output them reversed. Example: 0 0 1 -> 1 0 0."""
  name, level, input_size, output_size, chance_accuracy = "reverse_string", "dcf", 2, 2, 50.0

  def output_length(self, length):
    return length

  def _generate(self, rng, batch_size, length):
    bits = rng.integers(0, 2, (batch_size, length))
    return bits, bits[:, ::-1]
