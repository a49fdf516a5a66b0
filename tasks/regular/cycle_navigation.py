"""cycle_navigation: final position of a walk on a cycle of 5."""
from tasks.base import Task


class CycleNavigation(Task):
  """Actions 0, 1, 2 move by -1, 0, +1 on a cycle of 5 starting at 0.

  Example: 2 0 1 0 0 -> +1 -1 +0 -1 -1 = -2 -> 3.
  """
  name, level, input_size, output_size, chance_accuracy = "cycle_navigation", "regular", 3, 5, 20.0

  def _generate(self, rng, batch_size, length):
    actions = rng.integers(0, 3, (batch_size, length))
    return actions, ((actions - 1).sum(axis=1) % 5)[:, None]
