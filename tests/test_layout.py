"""Where things live (issue #30): entry points' flags, one version, names that do not clash."""
import pathlib
import subprocess
import sys

from tests.test_training import ENV

ROOT = pathlib.Path(__file__).resolve().parents[1]

REPORT_FLAGS = ("sweep_dir", "run_dir", "out_dir", "kind")


def test_report_defines_its_flags_on_import_beside_the_other_entry_points():
  from absl import flags  # pylint: disable=import-outside-toplevel

  # train and benchmark define their flags at module level too: no name may clash.
  from experiments import benchmark  # pylint: disable=import-outside-toplevel,unused-import
  from experiments import report  # pylint: disable=import-outside-toplevel
  from experiments import train  # pylint: disable=import-outside-toplevel,unused-import

  for name in REPORT_FLAGS:
    assert flags.FLAGS.find_module_defining_flag(name) == "experiments.report", name
  assert list(flags.FLAGS["kind"].parser.enum_values) == list(report.KINDS)


def test_report_command_line_reads_its_flags():
  out = subprocess.run([sys.executable, "-m", "experiments.report", "--kind=bogus"], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=120, check=False)
  assert out.returncode == 2, out.stderr[-2000:]
  assert "--kind=bogus" in out.stderr and "auto|paper" in out.stderr
  assert "Traceback" not in out.stderr


def test_no_folder_shares_its_name_with_a_module_beside_it():
  # experiments/data.py once stood beside experiments/data/ (the paper's numbers).
  clashes = [str(p.relative_to(ROOT)) for folder in ("experiments", "tasks")
             for p in ROOT.joinpath(folder).rglob("*.py") if p.with_suffix("").is_dir()]
  assert not clashes, clashes


def test_the_paper_numbers_are_where_the_report_reads_them():
  from experiments import report  # pylint: disable=import-outside-toplevel

  path = pathlib.Path(report.PAPER_RESULTS)
  assert path.is_file() and path.parent.name == "paper_numbers"
  assert "table1_max_over_seeds_and_lrs" in report.load_paper()


def test_every_task_name_is_defined_in_tasks():
  import tasks  # pylint: disable=import-outside-toplevel
  from experiments import data  # pylint: disable=import-outside-toplevel
  from tasks import datasets  # pylint: disable=import-outside-toplevel

  # experiments/data.py reads the registry of tasks/ and registers nothing of its own.
  assert data.DATASETS is datasets.DATASETS and data.Dataset is datasets.Dataset
  assert "latin_square" in datasets.DATASETS.names()
  for name in datasets.DATASETS.names():
    assert datasets.DATASETS.get(name).__module__.startswith("tasks."), name
  assert not set(tasks.NAMES) & set(datasets.DATASETS.names())
  assert not ROOT.joinpath("latin_square").exists()


def test_the_tasks_cite_nothing_outside_the_repository():
  # The project must not need ../shared: what the data modules rely on is written down in
  # the repository (tasks/latin_square/files/README.md, docs/ito.md).
  cited = [str(p.relative_to(ROOT)) for p in ROOT.joinpath("tasks").rglob("*")
           if p.suffix in (".py", ".md") and "__pycache__" not in p.parts
           and any(s in p.read_text(encoding="utf-8") for s in ("../shared", "SPEC-EXTENSIONS"))]
  assert not cited, cited
