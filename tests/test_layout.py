"""Where things live (issue #30): entry points' flags, one version, names that do not clash."""
import pathlib
import subprocess
import sys

from tests import entry_points
from tests.test_training import ENV

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_report_defines_its_flags_when_run_not_on_import():
  from absl import flags  # pylint: disable=import-outside-toplevel

  # analyze has a --kind of its own, which its tests define in the process that imports
  # report for other tests: report's flags may not be defined by importing it.
  from experiments import report  # pylint: disable=import-outside-toplevel

  assert not [name for name in report.FLAG_NAMES
              if flags.FLAGS.find_module_defining_flag(name) == "experiments.report"]
  script = ("from absl import flags\n"
            "from experiments import report\n"
            "report.define_flags()\n"
            "report.define_flags()\n"  # Once: a second call defines nothing.
            "print(sorted(n for n in flags.FLAGS if flags.FLAGS.find_module_defining_flag(n)"
            " == 'experiments.report'), list(flags.FLAGS['kind'].parser.enum_values))\n")
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=120, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  names, kinds = out.stdout.strip().split("] ")
  assert names + "]" == str(sorted(report.FLAG_NAMES)) and kinds == str(list(report.KINDS))


def test_report_command_line_reads_its_flags():
  out = entry_points.run("experiments.report", ["--kind=bogus"], env=ENV, timeout=120)
  assert out.returncode == 2, out.stderr[-2000:]
  assert "--kind=bogus" in out.stderr and "auto|paper" in out.stderr
  assert "Traceback" not in out.stderr


def test_no_folder_shares_its_name_with_a_module_beside_it():
  # experiments/training/data.py once stood beside experiments/data/ (the paper's numbers).
  clashes = [str(p.relative_to(ROOT)) for folder in ("experiments", "tasks")
             for p in ROOT.joinpath(folder).rglob("*.py") if p.with_suffix("").is_dir()]
  assert not clashes, clashes


def test_the_paper_numbers_are_where_the_report_reads_them():
  from experiments.analysis import tables  # pylint: disable=import-outside-toplevel

  path = pathlib.Path(tables.PAPER_RESULTS)
  assert path.is_file() and path.parent.name == "paper_numbers"
  assert "table1_max_over_seeds_and_lrs" in tables.load_paper()


def test_every_task_name_is_defined_in_tasks():
  import tasks  # pylint: disable=import-outside-toplevel
  from experiments.training import data  # pylint: disable=import-outside-toplevel
  from tasks import datasets  # pylint: disable=import-outside-toplevel

  # experiments/training/data.py reads the registry of tasks/ and registers nothing of its own.
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


# The floors of experiments/ (issue #30): a module imports only from floors below its
# own, or from its own room (folder). Entry points import no other entry point;
# analysis/ and benchmarking/ stand side by side: neither imports the other.
FLOORS = {"storage": 1, "cli": 1, "training": 2, "analysis": 3, "benchmarking": 3}
ENTRY_POINTS = ("train", "sweep", "report", "analyze", "ito_report", "ito_analysis",
                "benchmark")
# What an entry point may define besides its flags (analyze: command_line, its app.run).
ENTRY_POINT_FUNCTIONS = {"main", "define_flags", "command_line"}


def _room(dotted: str) -> str:
  """experiments.training.loop -> training; experiments.report -> report."""
  return dotted.split(".")[1]


def _experiments_imports(path: pathlib.Path) -> set[str]:
  import ast  # pylint: disable=import-outside-toplevel

  found = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module == "experiments":
        found |= {f"experiments.{a.name}" for a in node.names}
      elif node.module.startswith("experiments."):
        found.add(node.module)
    elif isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith("experiments.")}
  return found


def test_experiments_imports_run_down_its_floors_only():
  rooms = {p.name for p in ROOT.joinpath("experiments").iterdir()
           if p.is_dir() and p.joinpath("__init__.py").exists()}
  assert rooms == {"storage", "training", "analysis", "benchmarking"}, rooms
  modules = {p.stem for p in ROOT.joinpath("experiments").glob("*.py")} - {"__init__"}
  assert modules == {"cli", *ENTRY_POINTS}, modules  # Machinery lives in a room.
  wrong = []
  for path in ROOT.joinpath("experiments").rglob("*.py"):
    parts = path.relative_to(ROOT).with_suffix("").parts
    room = parts[1]
    floor = FLOORS.get(room, 4)
    for target in _experiments_imports(path):
      other = _room(target)
      if other == room and room in FLOORS:
        continue  # Within one room.
      if FLOORS.get(other, 4) >= floor:
        wrong.append(f"{'/'.join(parts)}.py imports {target}")
  assert not wrong, wrong


def test_entry_points_are_flags_and_main_only():
  # The benchmark's machinery once lived in experiments/benchmark.py (1,534 lines) and
  # benchmark_driver.py; it is in benchmarking/ now (issue #30 item 1), and stays there.
  import ast  # pylint: disable=import-outside-toplevel

  wrong = []
  for name in ENTRY_POINTS:
    tree = ast.parse(ROOT.joinpath("experiments", f"{name}.py").read_text(encoding="utf-8"))
    for node in tree.body:
      if isinstance(node, ast.ClassDef) or (
          isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.name not in ENTRY_POINT_FUNCTIONS):
        wrong.append(f"experiments/{name}.py defines {node.name}")
  assert not wrong, wrong


def test_rooms_read_no_flags():
  # An entry point reads its flags and passes their values; a room's functions take them
  # as arguments (absl's flags are global: a room reading them could not be called twice
  # with other values, nor from another entry point).
  wrong = []
  for path in ROOT.joinpath("experiments").glob("*/*.py"):
    text = path.read_text(encoding="utf-8")
    if "from absl import flags" in text or "import absl.flags" in text or "flags.FLAGS" in text:
      wrong.append(str(path.relative_to(ROOT)))
  assert not wrong, wrong


# Libraries that are heavy to import or optional, which a function may import when it
# needs them (plotting, checkpoint files, the Ray executor, progress bars, event files).
LAZY_LIBRARIES = {"matplotlib", "orbax", "ray", "tqdm", "tensorboardX"}
# The other imports inside functions that have a reason, each named.
LAZY_IMPORTS = {
    # Run storage falls back to the defaults of configs/default.py for settings an old
    # config.json lacks; configs import experiments' rooms, so not at import time.
    ("experiments/storage/workdir.py", "configs"),
    # The model registry's entries import their model when first built (the models
    # import the registry: a cycle at import time).
    ("randomized_pe/models/__init__.py", "randomized_pe.models"),
    # The pure core imports without Haiku: its model names load the encoder on first use.
    ("randomized_pe/__init__.py", "randomized_pe.models"),
    # tasks generate with numpy; jax only to turn a JAX key into a seed.
    ("tasks/base.py", "jax"),
    # The Latin-square files are read on first use, not whenever tasks is imported.
    ("tasks/datasets.py", "tasks.latin_square"),
}


def test_imports_inside_functions_are_of_heavy_libraries_or_named_here():
  # Issue #30 counted 161 imports inside functions outside the tests. Entry points may
  # import inside main (they set the process up first), and the benchmark's driver runs
  # against other commits' code, so it imports only what it is given; everywhere else an
  # import inside a function is a heavy or optional library or one of LAZY_IMPORTS.
  import ast  # pylint: disable=import-outside-toplevel

  exempt = {f"experiments/{name}.py" for name in ENTRY_POINTS}
  exempt.add("experiments/benchmarking/driver.py")
  wrong, seen = [], set()
  for folder in ("experiments", "randomized_pe", "tasks", "configs"):
    for path in ROOT.joinpath(folder).rglob("*.py"):
      name = str(path.relative_to(ROOT))
      if name in exempt:
        continue
      for func in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
          continue
        for node in ast.walk(func):
          if isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
          elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
          else:
            continue
          for module in modules:
            if module.split(".")[0] in LAZY_LIBRARIES:
              continue
            if (name, module) in LAZY_IMPORTS:
              seen.add((name, module))
              continue
            wrong.append(f"{name}:{node.lineno} imports {module} inside {func.name}")
  assert not wrong, wrong
  assert seen == LAZY_IMPORTS, LAZY_IMPORTS - seen  # No stale entry.
