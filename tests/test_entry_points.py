"""tests/entry_points.py: an entry point forked from the preloaded server runs as a new
`python -m` process would (arguments, folder, environment, streams, exit code)."""
import json
import os
import subprocess
import sys
import time

from tests import entry_points
from tests.test_training import ENV, ROOT

_PROBE = "tests.data.entry_point_probe"


def _both(module, args, env, cwd=ROOT):
  forked = entry_points.run(module, args, env=env, cwd=cwd, timeout=120)
  fresh = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
  return forked, fresh


def test_a_forked_entry_point_sees_what_a_new_process_sees(tmp_path):
  (tmp_path / "tests").symlink_to(os.path.join(ROOT, "tests"))
  env = {**ENV, "PROBE": "a b"}
  forked, fresh = _both(_PROBE, ["3", "--x=1", "two words"], env, cwd=str(tmp_path))
  assert forked.returncode == fresh.returncode == 3, (forked.stderr, fresh.stderr)
  assert forked.stderr == fresh.stderr == "to stderr\n"
  seen = json.loads(forked.stdout)
  assert seen == json.loads(fresh.stdout)
  assert seen["argv"] == ["3", "--x=1", "two words"] and seen["probe"] == "a b"
  assert seen["orig_argv"] == ["-m", _PROBE, "3", "--x=1", "two words"]
  assert seen["argv0"] == "entry_point_probe.py" and seen["cwd"] == str(tmp_path)
  assert seen["path0"] == str(tmp_path) and seen["stdin"] == "" and seen["devices"] == 1
  # The server keeps no state between children: the next one exits 0, PROBE unset.
  again = entry_points.run(_PROBE, ["0"], env=ENV, timeout=120)
  assert again.returncode == 0 and json.loads(again.stdout)["probe"] is None


def test_bad_input_gives_the_same_line_and_exit_code_forked(tmp_path):
  args = [f"--workdir={tmp_path / 'run'}", "--config.training.learning_rate=-1"]
  forked, fresh = _both("experiments.train", args, ENV)
  assert forked.returncode == fresh.returncode == 2
  assert forked.stderr == fresh.stderr == "error: training.learning_rate must be > 0, got -1.0\n"
  assert not (tmp_path / "run").exists()


def test_an_environment_the_libraries_read_on_import_gets_a_new_interpreter(monkeypatch):
  calls = []
  original = subprocess.run
  monkeypatch.setattr(entry_points.subprocess, "run",
                      lambda *a, **k: calls.append(a[0]) or original(*a, **k))
  entry_points.run(_PROBE, ["0"], env=ENV, timeout=120)  # Starts or reuses the server.
  assert calls == []
  out = entry_points.run(_PROBE, ["0"], env={**ENV, "JAX_ENABLE_X64": "1"}, timeout=120)
  assert out.returncode == 0 and len(calls) == 1 and calls[0][2] == _PROBE


def test_a_reply_that_arrives_with_the_one_before_it_is_not_waited_for():
  # A quick child's pid and exit code reach the pipe together; reading the first must not
  # leave the second where select() cannot see it (the client then waited out the
  # timeout, killed a finished child, and every later reply came one request late).
  read, write = os.pipe()
  try:
    os.write(write, b'{"pid": 1}\n{"returncode": 3}\n')
    lines = entry_points._Lines(read)  # pylint: disable=protected-access
    assert lines.next(None) == b'{"pid": 1}'
    start = time.monotonic()
    assert lines.next(10) == b'{"returncode": 3}'
    assert time.monotonic() - start < 5
  finally:
    os.close(read)
    os.close(write)
