"""The 15 length-generalization tasks of the Chomsky-hierarchy benchmark.

`tasks.get(name)` returns a task; `tasks.NAMES` lists them in the paper's order.
Each task has `level`, `input_size`, `output_size`, `input_length(n)`,
`output_length(n)`, `chance_accuracy`, `termination_token` and
`sample_batch(key, batch_size, length)` -> {"input", "output", "mask"}.

The other names `config.task` accepts, fixed datasets such as `latin_square`
(`tasks/latin_square/`), are registered in `tasks.datasets.DATASETS`: every task name is
defined in this folder.
"""

from tasks.base import Task
from tasks.cs.binary_addition import BinaryAddition
from tasks.cs.binary_multiplication import BinaryMultiplication
from tasks.cs.bucket_sort import BucketSort
from tasks.cs.compute_sqrt import ComputeSqrt
from tasks.cs.duplicate_string import DuplicateString
from tasks.cs.missing_duplicate_string import MissingDuplicateString
from tasks.cs.odds_first import OddsFirst
from tasks.dcf.modular_arithmetic_brackets import ModularArithmeticBrackets
from tasks.dcf.reverse_string import ReverseString
from tasks.dcf.solve_equation import SolveEquation
from tasks.dcf.stack_manipulation import StackManipulation
from tasks.regular.cycle_navigation import CycleNavigation
from tasks.regular.even_pairs import EvenPairs
from tasks.regular.modular_arithmetic import ModularArithmetic
from tasks.regular.parity_check import ParityCheck

_CLASSES = (
    EvenPairs, ModularArithmetic, ParityCheck, CycleNavigation,
    StackManipulation, ReverseString, ModularArithmeticBrackets, SolveEquation,
    DuplicateString, MissingDuplicateString, OddsFirst, BinaryAddition,
    BinaryMultiplication, ComputeSqrt, BucketSort,
)
TASKS: dict[str, Task] = {cls.name: cls() for cls in _CLASSES}
NAMES: tuple[str, ...] = tuple(TASKS)


def get(name: str) -> Task:
  """The task called `name`; an unknown name raises ValueError listing the valid ones."""
  try:
    return TASKS[name]
  except KeyError:
    raise ValueError(f"unknown task {name!r}; valid names: {', '.join(NAMES)}") from None
