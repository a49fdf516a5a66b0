"""The Latin Square Task (Ito et al. 2024) as arrays: the original splits, from the shipped CSVs.

A puzzle is a 4x4 grid read row-major into 16 tokens (cell t = 4 * row + col):
0 blank, 1-4 the four shapes, 5 the probe "?". The answer is the shape at the probe,
stored as a class 0-3 (shape - 1). Every puzzle carries its condition (relational
complexity): binary, ternary or quaternary (1-, 2-, 3-vector).

Splits, exactly as the original training script (`scripts/run_transformer.py` with
`get_curriculum('All')` of `lstnn/curricula.py` in ljhearne/LSTNN_public; how the held-out
rows were computed: `tasks/latin_square/files/README.md`):
  train       the 9,000 generated puzzles (binary, ternary, quaternary files concatenated
              in that order, rows 0-8999) minus the 900 held-out rows: 8,100
  test        the 900 held-out generated puzzles (300 per condition), in row order
  validation  the 108 puzzles people solved (`puzzle_data_original.csv`): the paper's
              "validation accuracy"
The split is fixed (it does not depend on any seed).

Shapes: N puzzles, T = 16 cells. Nothing here needs JAX; arrays are numpy.
The files live in `tasks/latin_square/files/` (README and licence there); every reader
raises a one-line FileNotFoundError or ValueError that names the file when a file is
missing or malformed.
"""

from __future__ import annotations

import csv
import dataclasses
import pathlib
from typing import Mapping, Optional, Sequence, Union

import numpy as np

DATA_DIR = pathlib.Path(__file__).resolve().parent / "files"

CONDITIONS = ("binary", "ternary", "quaternary")
GENERATED_FILES = {c: f"generated_puzzle_data_{c}_dist80.csv" for c in CONDITIONS}
VALIDATION_FILE = "puzzle_data_original.csv"
HELDOUT_FILE = "heldout_indices.txt"
HUMAN_FILE = "human_behaviour.csv"

GRID_SIZE = 4
NUM_CELLS = GRID_SIZE * GRID_SIZE
BLANK, PROBE = 0, 5
NUM_SHAPES = 4
VOCAB_SIZE = 6  # blank, four shapes, the probe.

# Sizes the original split relies on: the held-out indices address rows of the
# concatenated generated files, so a file of another length would shift every index.
GENERATED_ROWS_PER_CONDITION = 3000
VALIDATION_ROWS = 108
HELDOUT_ROWS = 900

_PUZZLE_COLUMNS = ["ID", "LST_num", "condition", "puzzles", "solutions"]
_HUMAN_COLUMNS = ("trial_type", "LST_id", "accuracy")

PathLike = Union[str, pathlib.Path]


@dataclasses.dataclass(frozen=True)
class Split:
  """One split of the task.

  Attributes:
    name: "train", "test" or "validation".
    puzzles: the 16-character texts as in the files (leading zeros kept), N of them.
    tokens: int32 [N, 16], cell values 0-5.
    answers: int32 [N], the class (shape - 1) in 0..3.
    conditions: int32 [N], an index into CONDITIONS.
    rows: int32 [N], where each puzzle comes from: its row in the concatenated generated
      files (train, test) or its ID in `puzzle_data_original.csv` (validation).
  """

  name: str
  puzzles: tuple[str, ...]
  tokens: np.ndarray
  answers: np.ndarray
  conditions: np.ndarray
  rows: np.ndarray

  def __len__(self) -> int:
    return len(self.puzzles)

  def condition_mask(self, condition: str) -> np.ndarray:
    """bool [N]: the puzzles of one condition ("binary", "ternary" or "quaternary")."""
    return self.conditions == _condition_index(condition)

  @property
  def probe_cells(self) -> np.ndarray:
    """int [N]: the cell (0-15) of each puzzle's probe."""
    return np.argmax(self.tokens == PROBE, axis=1)


@dataclasses.dataclass(frozen=True)
class LatinSquare:
  """The three splits of the original protocol."""

  train: Split
  test: Split
  validation: Split

  def splits(self) -> dict[str, Split]:
    return {"train": self.train, "test": self.test, "validation": self.validation}


def _condition_index(condition: str) -> int:
  try:
    return CONDITIONS.index(condition.lower())
  except ValueError:
    raise ValueError(f"unknown condition {condition!r}; valid conditions: "
                     f"{', '.join(CONDITIONS)}") from None


def _open(path: pathlib.Path):
  if not path.is_file():
    raise FileNotFoundError(f"Latin square data file not found: {path}")
  return open(path, newline="", encoding="ascii")


def _read_rows(path: pathlib.Path) -> tuple[list[str], list[list[str]]]:
  """(header, rows) of a CSV file; any decoding or CSV error becomes one ValueError."""
  try:
    with _open(path) as f:
      rows = list(csv.reader(f))
  except (UnicodeDecodeError, csv.Error) as e:
    raise ValueError(f"{path}: not a readable ASCII CSV file ({type(e).__name__})") from None
  if not rows:
    raise ValueError(f"{path}: empty file, expected a CSV header")
  return rows[0], rows[1:]


def _puzzle_tokens(text: str, where: str) -> np.ndarray:
  """int32 [16] from a 16-digit text with one probe; ValueError naming `where` otherwise."""
  if len(text) != NUM_CELLS or not text.isdigit() or not text.isascii():
    raise ValueError(f"{where}: puzzle {text!r} must be {NUM_CELLS} digits (leading zeros kept)")
  tokens = np.frombuffer(text.encode("ascii"), np.uint8).astype(np.int32) - ord("0")
  if tokens.max() > PROBE:
    raise ValueError(f"{where}: puzzle {text!r} has a digit above {PROBE} (0 blank, 1-4 shapes, "
                     f"5 the probe)")
  if np.count_nonzero(tokens == PROBE) != 1:
    raise ValueError(f"{where}: puzzle {text!r} must hold exactly one probe ({PROBE})")
  return tokens


def read_puzzle_file(path: PathLike, condition: Optional[str] = None,
                     expected_rows: Optional[int] = None) -> dict[str, np.ndarray]:
  """Reads one puzzle CSV (`ID, LST_num, condition, puzzles, solutions`).

  Args:
    path: the CSV file.
    condition: if given, every row must have this condition (a generated file).
    expected_rows: if given, the number of puzzles the file must hold.

  Returns:
    {"puzzles": object [N] texts, "tokens": int32 [N, 16], "answers": int32 [N] (0-3),
     "conditions": int32 [N], "ids": int32 [N] (the ID column)}.

  Raises:
    FileNotFoundError: the file is missing.
    ValueError: a bad header, row, puzzle, answer or condition (one line, naming the file
      and line).
  """
  path = pathlib.Path(path)
  header, rows = _read_rows(path)
  if header != _PUZZLE_COLUMNS:
    raise ValueError(f"{path}: header {header} is not {_PUZZLE_COLUMNS}")
  if expected_rows is not None and len(rows) != expected_rows:
    raise ValueError(f"{path}: {len(rows)} puzzles, expected {expected_rows}")
  puzzles, tokens, answers, conditions, ids = [], [], [], [], []
  for line, row in enumerate(rows, start=2):
    where = f"{path}, line {line}"
    if len(row) != len(_PUZZLE_COLUMNS):
      raise ValueError(f"{where}: {len(row)} fields, expected {len(_PUZZLE_COLUMNS)}")
    row_id, _, row_condition, text, solution = row
    cells = _puzzle_tokens(text, where)
    if solution not in ("1", "2", "3", "4"):
      raise ValueError(f"{where}: solution {solution!r} must be a shape 1-4")
    if row_condition.lower() not in CONDITIONS:
      raise ValueError(f"{where}: condition {row_condition!r} is not one of "
                       f"{', '.join(c.capitalize() for c in CONDITIONS)}")
    if condition is not None and row_condition.lower() != condition:
      raise ValueError(f"{where}: condition {row_condition!r} in the {condition} file")
    if not row_id.isdigit():
      raise ValueError(f"{where}: ID {row_id!r} must be a non-negative integer")
    puzzles.append(text)
    tokens.append(cells)
    answers.append(int(solution) - 1)
    conditions.append(CONDITIONS.index(row_condition.lower()))
    ids.append(int(row_id))
  return {"puzzles": np.array(puzzles, dtype=object),
          "tokens": np.array(tokens, np.int32).reshape(-1, NUM_CELLS),
          "answers": np.array(answers, np.int32), "conditions": np.array(conditions, np.int32),
          "ids": np.array(ids, np.int32)}


def read_heldout(path: PathLike, total: int, expected: Optional[int] = HELDOUT_ROWS) -> np.ndarray:
  """The held-out row indices (one integer a line), sorted int64 [expected].

  Raises:
    FileNotFoundError: the file is missing.
    ValueError: a non-integer line, an index outside [0, total), a repeated index, or
      (with `expected`) the wrong count.
  """
  path = pathlib.Path(path)
  try:
    with _open(path) as f:
      lines = [line.strip() for line in f]
  except UnicodeDecodeError:
    raise ValueError(f"{path}: not an ASCII text file of indices") from None
  indices = []
  for number, line in enumerate(lines, start=1):
    if not line:
      continue
    if not line.isdigit():
      raise ValueError(f"{path}, line {number}: {line!r} is not a non-negative integer index")
    indices.append(int(line))
  indices = np.array(indices, np.int64)
  if expected is not None and len(indices) != expected:
    raise ValueError(f"{path}: {len(indices)} indices, expected {expected}")
  if len(indices) and (indices.max() >= total):
    raise ValueError(f"{path}: index {indices.max()} outside the {total} generated puzzles")
  if len(np.unique(indices)) != len(indices):
    raise ValueError(f"{path}: repeated indices")
  return np.sort(indices)


def _split(name: str, columns: Mapping[str, np.ndarray], rows: np.ndarray) -> Split:
  return Split(name=name, puzzles=tuple(columns["puzzles"][rows]),
               tokens=columns["tokens"][rows], answers=columns["answers"][rows],
               conditions=columns["conditions"][rows], rows=rows.astype(np.int32))


def load(data_dir: Optional[PathLike] = None) -> LatinSquare:
  """The train (8,100), test (900) and validation (108) splits of the original protocol.

  Args:
    data_dir: the folder of the files (default: the shipped `tasks/latin_square/files/`).

  Raises:
    FileNotFoundError, ValueError: a missing or malformed file (one line naming it).
  """
  folder = DATA_DIR if data_dir is None else pathlib.Path(data_dir)
  parts = [read_puzzle_file(folder / GENERATED_FILES[c], condition=c,
                            expected_rows=GENERATED_ROWS_PER_CONDITION) for c in CONDITIONS]
  generated = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
  total = len(generated["answers"])  # 9,000: rows 0-2999 binary, then ternary, quaternary.
  heldout = read_heldout(folder / HELDOUT_FILE, total)
  train_rows = np.setdiff1d(np.arange(total), heldout)
  validation = read_puzzle_file(folder / VALIDATION_FILE, expected_rows=VALIDATION_ROWS)
  if not np.array_equal(validation["ids"], np.arange(VALIDATION_ROWS)):
    # human_behaviour.csv addresses validation puzzles by ID, so they must be in order.
    raise ValueError(f"{folder / VALIDATION_FILE}: IDs must run 0..{VALIDATION_ROWS - 1} in order")
  return LatinSquare(train=_split("train", generated, train_rows),
                     test=_split("test", generated, heldout),
                     validation=_split("validation", validation, np.arange(VALIDATION_ROWS)))


def human_accuracy(data_dir: Optional[PathLike] = None) -> np.ndarray:
  """Per-puzzle human accuracy on the 108 validation puzzles: float64 [108], in ID order.

  The mean of `accuracy` over the people who saw each puzzle (40 in the public file),
  with Null trials dropped; `LST_id` k is validation puzzle ID k - 1.

  Raises:
    FileNotFoundError, ValueError: a missing or malformed file, or a puzzle nobody saw.
  """
  path = (DATA_DIR if data_dir is None else pathlib.Path(data_dir)) / HUMAN_FILE
  header, rows = _read_rows(path)
  missing = [c for c in _HUMAN_COLUMNS if c not in header]
  if missing:
    raise ValueError(f"{path}: missing columns {missing}")
  kind, puzzle, accuracy = (header.index(c) for c in _HUMAN_COLUMNS)
  total, count = np.zeros(VALIDATION_ROWS), np.zeros(VALIDATION_ROWS)
  for line, row in enumerate(rows, start=2):
    if len(row) != len(header):
      raise ValueError(f"{path}, line {line}: {len(row)} fields, expected {len(header)}")
    if row[kind] == "Null":
      continue
    try:
      index, value = int(row[puzzle]) - 1, float(row[accuracy])
    except ValueError:
      raise ValueError(f"{path}, line {line}: LST_id {row[puzzle]!r} or accuracy "
                       f"{row[accuracy]!r} is not a number") from None
    if not 0 <= index < VALIDATION_ROWS or value not in (0.0, 1.0):
      raise ValueError(f"{path}, line {line}: LST_id must be 1-{VALIDATION_ROWS} and accuracy "
                       f"0 or 1, got {row[puzzle]!r}, {row[accuracy]!r}")
    total[index] += value
    count[index] += 1
  if not count.all():
    raise ValueError(f"{path}: no responses for validation IDs {np.flatnonzero(count == 0)}")
  return total / count


def accuracy_by_condition(correct: Sequence, conditions: np.ndarray) -> dict[str, float]:
  """Accuracy overall and per condition: {"overall", "binary", "ternary", "quaternary"}.

  Exact means over puzzles (a condition with no puzzles gives nan). The original
  averaged per-batch accuracies on the 900 held-out puzzles in batches of 128, which
  over-weights the last batch of 4 slightly (docs/ito.md, "The original's protocol");
  this is the plain per-puzzle mean.

  Args:
    correct: bool or 0/1 [N] per puzzle.
    conditions: int [N] indices into CONDITIONS (a Split's `conditions`).
  """
  correct = np.asarray(correct, np.float64)
  conditions = np.asarray(conditions)
  if correct.shape != conditions.shape:
    raise ValueError(f"correct {correct.shape} and conditions {conditions.shape} differ in shape")
  result = {"overall": float(correct.mean()) if correct.size else float("nan")}
  for index, name in enumerate(CONDITIONS):
    chosen = correct[conditions == index]
    result[name] = float(chosen.mean()) if chosen.size else float("nan")
  return result
