"""The package as a user installs it: a wheel in a fresh virtualenv, outside the checkout.

An editable install (what `make install` does) serves the checkout's folders as they are,
so it hides a subpackage the wheel leaves out (`packages=["randomized_pe"]` once dropped
`randomized_pe.models`). This test builds the wheel from a copy of the checkout (so that
no `build/` folder appears in it), installs it with `--no-deps` into a new virtualenv in a
temporary folder, and imports every module and every public name from another folder. The
new virtualenv sees this environment's packages (jax, haiku, ...) after its own, through a
.pth line: nothing is downloaded. About 15 s.
"""

import email.parser
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(".git", ".venv", "runs", "workdir*", ".pytest_cache", "build",
                              "dist", "*.egg-info", "__pycache__", "tests", "experiments",
                              "docs", "configs", "tasks")


def _run(args, cwd, env=None, timeout=180):
  result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
  assert result.returncode == 0, f"{' '.join(map(str, args))}:\n{result.stdout}\n{result.stderr}"
  return result.stdout


def _source_modules() -> set[str]:
  """Every module of the checkout's randomized_pe, dotted."""
  return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
          for p in (ROOT / "randomized_pe").rglob("*.py") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
  tmp = tmp_path_factory.mktemp("wheel")
  source = tmp / "source"
  shutil.copytree(ROOT, source, ignore=SKIP)
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
        "-q", "-w", str(tmp / "dist"), str(source)], cwd=tmp)
  wheels = list((tmp / "dist").glob("randomized_pe-*.whl"))
  assert len(wheels) == 1, wheels
  return wheels[0]


def test_wheel_holds_every_module_and_the_metadata_an_index_expects(wheel):
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
  in_wheel = {n[:-3].replace("/", ".").removesuffix(".__init__")
              for n in names if n.endswith(".py")}
  assert _source_modules() - in_wheel == set(), "modules missing from the wheel"
  assert all(n.startswith(("randomized_pe/", "randomized_pe-")) for n in names), names

  init = (ROOT / "randomized_pe" / "__init__.py").read_text()
  version = re.search(r'^__version__ = "([^"]+)"$', init, re.MULTILINE).group(1)
  assert metadata["Version"] == version
  assert metadata["Summary"] and metadata["License"] == "Apache-2.0"
  assert metadata["Description-Content-Type"] == "text/markdown"
  assert metadata.get_payload().lstrip().startswith("# randomized_pe")  # The README.
  assert metadata.get_all("Project-URL")
  requires = metadata.get_all("Requires-Dist")
  core = sorted(re.split(r"[<>=!~ ;\[]", r)[0] for r in requires if "extra ==" not in r)
  assert core == ["jax", "numpy"]
  extras = set(metadata.get_all("Provides-Extra"))
  assert {"models", "experiments", "cluster", "dev"} <= extras
  assert not (ROOT / "build").exists(), "building the wheel left build/ in the checkout"


def test_wheel_installs_in_a_fresh_virtualenv_and_imports_from_another_folder(wheel, tmp_path):
  venv = tmp_path / "venv"
  _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
  python = venv / "bin" / "python"
  _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
        "--no-index", "-q", str(wheel)], cwd=tmp_path)
  site = pathlib.Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                             "['purelib'])"], cwd=tmp_path).strip())
  # This environment's packages (jax, haiku, ...), after the wheel's own folder. Its
  # .pth files (the editable install of the checkout) are not read from a .pth line.
  (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  modules = sorted(_source_modules())
  script = f"""
import importlib, pathlib, sys
assert not any(p and pathlib.Path(p).resolve() == pathlib.Path({str(ROOT)!r})
               for p in sys.path), sys.path
import randomized_pe
assert pathlib.Path(randomized_pe.__file__).is_relative_to({str(site)!r}), randomized_pe.__file__
assert "haiku" not in sys.modules and "optax" not in sys.modules
for name in {modules!r}:
  module = importlib.import_module(name)
  assert pathlib.Path(module.__file__).is_relative_to({str(site)!r}), module.__file__
  for public in getattr(module, "__all__", ()):
    getattr(module, public)
for public in randomized_pe.__all__:
  getattr(randomized_pe, public)
config = randomized_pe.EncoderConfig(vocab_size=3, pe="randomized_rope")
print("ok", randomized_pe.__version__, len({modules!r}))
"""
  # No PYTHONPATH: only the new virtualenv and its .pth line.
  env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu"}
  out = _run([str(python), "-c", script], cwd=elsewhere, env=env)
  assert out.startswith("ok "), out
