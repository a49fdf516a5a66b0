"""Runs the project's entry points (`python -m experiments.train ...`) as separate processes
for the tests, about a second of CPU cheaper each than a new interpreter.

A new Python spends about 1.0-1.5 s of CPU importing JAX, Haiku, optax and orbax before an
entry point reads its first flag, and the suite starts some 50 of them (bad input refused
with one line, runs to completion, reports). `run` forks them instead from a server
process (one per pytest worker, started on first use) that has imported those libraries
and nothing of the project: the child is a new process with the given arguments, working
folder, environment and standard streams, which runs the module as `python -m` does
(`runpy`, `__name__ == "__main__"`, sys.argv and sys.orig_argv as the command line gives
them), ends as the interpreter would (threads joined, atexit handlers, streams flushed)
but without tearing down its modules one by one (0.4 s of CPU more), with its own exit
code, and is reaped by the server. JAX's backend is never
started in the server, so every child starts its own, with the child's environment.

What a fork cannot give falls back to a new interpreter (`subprocess.run`): an
environment that differs from the server's in a variable the preloaded libraries read
when imported (JAX_*, XLA_*, TF_*, PYTHON*, LD_*, GLIBC_TUNABLES, MALLOC_*, MPL*, TMPDIR...), a
platform without fork, or RANDOMIZED_PE_TEST_FORK=0. Tests of signals and of a process's
own start (tests/test_runtime.py's restart) use subprocess themselves.
"""
import atexit
import json
import os
import runpy
import select
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from tests import mlir_contexts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Read by the preloaded libraries (or the interpreter) when they load: a child whose
# environment differs in one of these needs a new interpreter.
_IMPORT_TIME_PREFIXES = ("JAX_", "XLA_", "TF_", "PYTHON", "LD_", "GLIBC_", "MALLOC_",
                         "OMP_", "MKL_", "OPENBLAS_", "NPY_", "TMPDIR", "CUDA_", "TPU_",
                         "MPL", "SCIPY_")
_PRELOAD = ("numpy", "jax", "jax.numpy", "haiku", "optax", "orbax.checkpoint",
            "ml_collections", "absl.app", "absl.flags", "absl.logging",
            # The reports' and analyses' figures and statistics (0.4 s and 0.7 s of CPU).
            "matplotlib", "matplotlib.pyplot", "scipy.stats")
OFF_ENV = "RANDOMIZED_PE_TEST_FORK"


def _serve():
  """The server's loop: one JSON request a line on stdin, replies on stdout."""
  for module in _PRELOAD:
    __import__(module)
  if mlir_contexts.wanted():
    mlir_contexts.reuse()  # As in the pytest worker; made in each child on first use.
  # A fork copies only the forking thread; a library that started a thread on import
  # could leave a lock held in the child.
  if threading.active_count() != 1:
    raise SystemExit(f"entry_points: {threading.active_count()} threads after preloading")
  replies = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
  print(json.dumps({"ready": True}), file=replies)
  for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
      replies.close()
      _end(_child(request))
    print(json.dumps({"pid": pid}), file=replies)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=replies)


def _end(code: int):
  """Ends the child as the interpreter ends a process (its threads joined, atexit handlers
  run, streams flushed), without freeing the modules one by one: that teardown takes
  about 0.4 s of CPU with JAX loaded, in a fresh interpreter too, and frees only memory
  (the project closes or flushes every file it writes)."""
  try:
    threading._shutdown()  # pylint: disable=protected-access
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(code)  # pylint: disable=protected-access


def _child(request) -> int:
  """Runs `python -m request["module"] *request["args"]` in this forked process; returns
  its exit code."""
  try:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
      os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.stdin = open(0, "r", closefd=False)  # pylint: disable=consider-using-with
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # pylint: disable=consider-using-with
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # pylint: disable=consider-using-with
    sys.orig_argv = [sys.executable, "-m", request["module"], *request["args"]]
    sys.argv = ["-m", *request["args"]]  # runpy puts the module's file in sys.argv[0].
    sys.path[0] = request["cwd"]  # As `python -m` puts the working folder first.
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    return 0
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      return e.code or 0
    print(e.code, file=sys.stderr)
    return 1
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    return 1


class _Lines:
  """Lines from a pipe's descriptor, read without a buffered reader.

  The server writes a child's pid and its exit code one right after the other when the
  child is quick; a buffered reader would take both lines at once and leave select()
  nothing to see for the second (the client then waited out the timeout, killed a
  finished child and read every later reply one request late).
  """

  def __init__(self, fd: int):
    self.fd = fd
    self._pending = b""  # Bytes read beyond the last line returned.

  def next(self, timeout):
    """The next line (without its newline), or None if none comes within `timeout`
    seconds (None: wait); raises EOFError when the writer has closed the pipe."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in self._pending:
      left = None if deadline is None else max(0.0, deadline - time.monotonic())
      ready, _, _ = select.select([self.fd], [], [], left)
      if not ready:
        return None
      chunk = os.read(self.fd, 1 << 16)
      if not chunk:
        raise EOFError
      self._pending += chunk
    line, self._pending = self._pending.split(b"\n", 1)
    return line


class _Server:
  """The forking server of this process (one per pytest worker)."""

  def __init__(self, env):
    self.env = dict(env)
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-c", "from tests import entry_points; entry_points._serve()"],
        cwd=ROOT, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    self._lines = _Lines(self.process.stdout.fileno())
    if self._reply(None) != {"ready": True}:
      raise RuntimeError("entry_points: the server did not start")

  def _reply(self, timeout):
    """The server's next reply, or None if none comes within `timeout` seconds."""
    try:
      line = self._lines.next(timeout)
    except EOFError:
      raise RuntimeError(f"entry_points: the server ended ({self.process.wait()})") from None
    return None if line is None else json.loads(line)

  def run(self, request, timeout):
    self.process.stdin.write((json.dumps(request) + "\n").encode())
    self.process.stdin.flush()
    pid = self._reply(None)["pid"]
    reply = self._reply(timeout)
    if reply is None:
      try:
        os.kill(pid, 9)
      except ProcessLookupError:
        pass  # It ended meanwhile; the server reports it as any other.
      self._reply(None)
      raise subprocess.TimeoutExpired([request["module"], *request["args"]], timeout)
    return reply["returncode"]

  def close(self):
    if self.process.poll() is None:
      self.process.stdin.close()
      self.process.wait(timeout=30)


_server = None


def _new_interpreter(command, cwd, env, timeout):
  return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=timeout, check=False)


def _forkable(env) -> bool:
  if os.environ.get(OFF_ENV, "") in ("0", "false") or not hasattr(os, "fork"):
    return False
  if _server is None:
    return True
  keys = set(env) | set(_server.env)
  return all(env.get(k) == _server.env.get(k) for k in keys
             if k.startswith(_IMPORT_TIME_PREFIXES))


def run(module, args, *, env, cwd=ROOT, timeout=300):
  """`subprocess.run([python, "-m", module, *args], cwd=cwd, env=env, capture_output=True,
  text=True, timeout=timeout)`, forked from the server when the environment allows."""
  global _server  # pylint: disable=global-statement
  command = [sys.executable, "-m", module, *args]
  # The environment the entry point runs with after runtime.maybe_reexec()'s restart (the
  # server's malloc is tuned as the restarted process's would be; results do not depend
  # on it): the child does not restart.
  from experiments.training import runtime  # pylint: disable=import-outside-toplevel
  env = runtime.tuned_environment_here(env) or dict(env)
  if not _forkable(env):
    return _new_interpreter(command, cwd, env, timeout)
  if _server is None or _server.process.poll() is not None:
    _server = _Server(env)
    atexit.register(_server.close)
  with tempfile.TemporaryDirectory(prefix="entry-point-") as folder:
    paths = {name: os.path.join(folder, name) for name in ("stdout", "stderr")}
    code = _server.run({"module": module, "args": [str(a) for a in args],
                        "cwd": str(cwd), "env": dict(env), **paths}, timeout)
    with open(paths["stdout"]) as out, open(paths["stderr"]) as err:
      return subprocess.CompletedProcess(command, code, out.read(), err.read())


def run_command(command, *, env, cwd=ROOT, timeout=300):
  """`run` for a command line as subprocess takes it: [sys.executable, "-m", module, ...]
  is forked; anything else runs as given."""
  if list(command[:2]) == [sys.executable, "-m"]:
    return run(command[2], command[3:], env=env, cwd=cwd, timeout=timeout)
  return _new_interpreter(command, cwd, env, timeout)
