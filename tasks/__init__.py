"""The 15 length-generalization tasks of the Chomsky-hierarchy benchmark.

`tasks.get(name)` returns a task; `tasks.names()` lists the registered ones, the paper's
15 first in its order (`tasks.NAMES`, those 15 only). Adding a task is a `Task` subclass
and one `tasks.register(MyTask())` (in this package: its file and its entry in
`_CLASSES` below; or in your own file, docs/extending.md).
Each task has `level`, `input_size`, `output_size`, `input_length(n)`,
`output_length(n)`, `chance_accuracy`, `termination_token` and
`sample_batch(key, batch_size, length)` -> {"input", "output", "mask"}.

The other names `config.task` accepts, fixed datasets such as `latin_square`
(`tasks/latin_square/`), are registered in `tasks.datasets.DATASETS`: every task name is
defined in this folder.
"""

from randomized_pe import registry
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
TASKS: registry.Registry[Task] = registry.Registry("task", "valid names")
names = TASKS.names


def register(task: Task) -> Task:
  """Adds `task` (an instance) under `task.name`; a name given twice is refused."""
  if not isinstance(task, Task) or not task.name:
    raise ValueError(f"tasks.register takes a Task instance with a name, got {task!r}")
  return TASKS.register(task.name, task)


def get(name: str) -> Task:
  """The task called `name`; an unknown name raises ValueError listing the valid ones."""
  return TASKS.get(name)


for _cls in _CLASSES:
  register(_cls())
NAMES: tuple[str, ...] = names()  # The paper's 15 tasks, in its order.
