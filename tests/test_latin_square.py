"""The Latin Square Task data: the original splits, the puzzles' rule, and one-line errors."""
import hashlib
import itertools
import pathlib
import shutil

import numpy as np
import pytest

from tasks.latin_square import data

REPO = pathlib.Path(__file__).resolve().parents[1]
# SPEC-EXTENSIONS Appendix A: SHA-1 of the comma-joined sorted held-out indices.
HELDOUT_SHA1 = "cba53b03cba6bb32b6ffa4e146fe061a516cd88e"


@pytest.fixture(scope="module")
def lst():
  return data.load()


def _latin_squares() -> np.ndarray:
  """All 4x4 Latin squares over shapes 1-4, int [576, 16] row-major, by brute force."""
  rows = list(itertools.permutations(range(1, 5)))
  squares = [np.array(grid) for grid in itertools.product(rows, repeat=4)
             if all(len(set(column)) == 4 for column in zip(*grid))]
  return np.array(squares).reshape(-1, 16)


def test_data_ships_inside_the_repository():
  assert data.DATA_DIR == REPO / "tasks" / "latin_square" / "files"
  for name in [*data.GENERATED_FILES.values(), data.VALIDATION_FILE, data.HELDOUT_FILE,
               data.HUMAN_FILE, "LICENSE-LSTNN_public", "README.md"]:
    assert (data.DATA_DIR / name).is_file(), name


def test_split_sizes(lst):
  assert (len(lst.train), len(lst.test), len(lst.validation)) == (8100, 900, 108)
  for split, per_condition in [(lst.train, 2700), (lst.test, 300), (lst.validation, 36)]:
    np.testing.assert_array_equal(np.bincount(split.conditions, minlength=3), [per_condition] * 3)
    for name in data.CONDITIONS:
      assert split.condition_mask(name).sum() == per_condition


def test_split_is_the_originals(lst):
  # Rows 0-2999 binary, 3000-5999 ternary, 6000-8999 quaternary (the concatenation order).
  for split in (lst.train, lst.test):
    np.testing.assert_array_equal(split.conditions, split.rows // 3000)
  joined = ",".join(str(i) for i in sorted(lst.test.rows))
  assert hashlib.sha1(joined.encode()).hexdigest() == HELDOUT_SHA1
  np.testing.assert_array_equal(lst.validation.rows, np.arange(108))
  # IDs 0-35 Binary, 36-71 Ternary, 72-107 Quaternary.
  np.testing.assert_array_equal(lst.validation.conditions, np.arange(108) // 36)


def test_heldout_is_disjoint_from_training(lst):
  assert not set(lst.train.rows) & set(lst.test.rows)
  assert sorted([*lst.train.rows, *lst.test.rows]) == list(range(9000))
  # No puzzle of the training set reappears in the test or validation sets.
  assert not set(lst.train.puzzles) & set(lst.test.puzzles)
  assert not set(lst.train.puzzles) & set(lst.validation.puzzles)


def test_puzzles_are_16_tokens_with_one_probe(lst):
  for split in lst.splits().values():
    assert split.tokens.shape == (len(split), 16) and split.tokens.dtype == np.int32
    assert split.tokens.min() >= 0 and split.tokens.max() <= 5
    np.testing.assert_array_equal((split.tokens == data.PROBE).sum(axis=1), 1)
    assert all(len(p) == 16 for p in split.puzzles)
    text = np.array([[int(c) for c in p] for p in split.puzzles])
    np.testing.assert_array_equal(text, split.tokens)
    assert split.answers.min() >= 0 and split.answers.max() <= 3


def test_leading_zeros_are_kept(lst):
  assert lst.validation.puzzles[0] == "0040405210200030"
  np.testing.assert_array_equal(lst.validation.tokens[0, :3], [0, 0, 4])
  assert lst.validation.answers[0] == 0  # Shape 1.


def test_every_answer_follows_the_latin_square_rule(lst):
  squares = _latin_squares()
  assert squares.shape == (576, 16)
  for split in lst.splits().values():
    tokens = split.tokens
    probe = split.probe_cells
    for start in range(0, len(tokens), 500):
      chunk = tokens[start:start + 500]
      given = (chunk >= 1) & (chunk <= 4)  # [n, 16] the shapes on the grid
      fits = np.all(~given[:, None] | (chunk[:, None] == squares[None]), axis=-1)  # [n, 576]
      assert fits.any(axis=1).all(), "a puzzle fits no Latin square"
      at_probe = squares[:, probe[start:start + 500]].T  # [n, 576] probe value per square
      for i in range(len(chunk)):
        values = set(at_probe[i][fits[i]])
        # The probe's shape is the same in every completion, and it is the answer.
        assert values == {split.answers[start + i] + 1}, (split.name, start + i, values)


def test_answer_completes_its_row_and_column_without_repeats(lst):
  for split in lst.splits().values():
    grids = split.tokens.copy()
    grids[np.arange(len(grids)), split.probe_cells] = split.answers + 1
    grids = grids.reshape(-1, 4, 4)
    for lines in (grids, grids.transpose(0, 2, 1)):  # Rows, then columns.
      for shape in range(1, 5):
        assert ((lines == shape).sum(axis=2) <= 1).all()


def test_human_accuracy():
  human = data.human_accuracy()
  assert human.shape == (108,)
  # SPEC-EXTENSIONS B6.4, measured on the 40-person file.
  assert human.mean() == pytest.approx(0.833, abs=5e-4)
  by_condition = data.accuracy_by_condition(human, np.arange(108) // 36)
  assert by_condition["binary"] == pytest.approx(0.967, abs=5e-4)
  assert by_condition["ternary"] == pytest.approx(0.870, abs=5e-4)
  assert by_condition["quaternary"] == pytest.approx(0.6625, abs=5e-4)


def test_accuracy_by_condition_hand_case():
  got = data.accuracy_by_condition([1, 0, 1, 1, 0], np.array([0, 0, 1, 2, 2]))
  assert got == {"overall": 0.6, "binary": 0.5, "ternary": 1.0, "quaternary": 0.5}
  assert np.isnan(data.accuracy_by_condition([1], np.array([0]))["ternary"])


def _replace_line(path, line, text):
  lines = path.read_text().splitlines(keepends=True)
  lines[line] = text
  path.write_text("".join(lines))


BINARY, VALIDATION = data.GENERATED_FILES["binary"], data.VALIDATION_FILE
BAD_FILES = [
    # (file, how it is broken, exception, words the message must hold)
    (BINARY, "missing", FileNotFoundError, "not found"),
    (data.HELDOUT_FILE, "missing", FileNotFoundError, "not found"),
    (BINARY, lambda p: _replace_line(p, 2, "1,,Binary,100035410000000,2\n"), ValueError, "line 3"),
    (BINARY, lambda p: _replace_line(p, 1, "0,,Binary,2000500234001005,4\n"), ValueError, "probe"),
    (BINARY, lambda p: _replace_line(p, 1, "0,,Binary,2000500234001000,7\n"), ValueError, "1-4"),
    (BINARY, lambda p: _replace_line(p, 1, "0,,Ternary,2000500234001000,4\n"), ValueError,
     "condition"),
    (VALIDATION, lambda p: _replace_line(p, 0, "ID,condition,puzzles,solutions\n"), ValueError,
     "header"),
    (VALIDATION, lambda p: p.write_bytes(p.read_bytes()[:-60]), ValueError, "expected 108"),
    (data.HELDOUT_FILE, lambda p: _replace_line(p, 0, "9000\n"), ValueError, "outside"),
    (data.HELDOUT_FILE, lambda p: _replace_line(p, 0, "abc\n"), ValueError, "line 1"),
    (data.HUMAN_FILE, lambda p: p.write_bytes(b"\xff\xfe garbage"), ValueError, "ASCII"),
]


@pytest.mark.parametrize("name,breakage,error,words", BAD_FILES)
def test_bad_or_missing_file_gives_one_line_error(tmp_path, name, breakage, error, words):
  for source in data.DATA_DIR.iterdir():
    shutil.copy(source, tmp_path / source.name)
  if breakage == "missing":
    (tmp_path / name).unlink()
  else:
    breakage(tmp_path / name)
  with pytest.raises(error) as info:
    if name == data.HUMAN_FILE:
      data.human_accuracy(tmp_path)
    else:
      data.load(tmp_path)
  message = str(info.value)
  assert "\n" not in message and name in message and words in message, message


def test_intact_copy_loads(tmp_path):
  for source in data.DATA_DIR.iterdir():
    shutil.copy(source, tmp_path / source.name)
  copy = data.load(tmp_path)
  np.testing.assert_array_equal(copy.test.tokens, data.load().test.tokens)
