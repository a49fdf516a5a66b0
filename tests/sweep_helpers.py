"""Job functions for the sweep tests (importable by Ray workers and spawned processes)."""
import copy
import glob
import os
import signal
import time

from experiments.storage import io_utils
from experiments.training import stopping
from experiments.training import jobs as sweep
from experiments.storage import workdir as workdir_lib


def counting_job(config_dict, workdir, companions=()):
  """run_job, then records one completion in the job folder."""
  result = sweep.run_job(config_dict, workdir, companions)
  with open(os.path.join(workdir, "completions.log"), "a") as f:
    f.write("done\n")
  return result


def _stop_halfway_once(config_dict, workdir):
  """True the first time: trains half the steps (checkpoint included) and returns."""
  marker = workdir + ".stopped"
  if os.path.exists(marker):
    return False
  half = copy.deepcopy(config_dict)
  half["training"]["steps"] //= 2
  sweep.run_job(half, workdir)
  with open(marker, "w") as f:
    f.write("stopped\n")
  return True


def interrupted_job(config_dict, workdir, companions=()):
  """The first attempt of the first task's jobs stops halfway with an error."""
  if config_dict["task"] == "parity_check" and _stop_halfway_once(config_dict, workdir):
    raise RuntimeError("stopped halfway")
  return counting_job(config_dict, workdir, companions)


def killed_job(config_dict, workdir, companions=()):
  """The first attempt of the first task's jobs kills its own worker process halfway."""
  if config_dict["task"] == "parity_check" and _stop_halfway_once(config_dict, workdir):
    os.kill(os.getpid(), signal.SIGKILL)
  return counting_job(config_dict, workdir, companions)


def waiting_job(config_dict, workdir, companions=()):
  """Holds the job's folder like a training run and waits for a stop request (which the
  training loop polls between steps); records the signal, then stops like the loop."""
  del config_dict, companions
  with workdir_lib.locked(workdir), stopping.graceful():
    io_utils.atomic_write_text(os.path.join(workdir, "worker.pid"), str(os.getpid()))
    while stopping.requested() is None:
      time.sleep(0.05)
    with open(os.path.join(workdir, "stopped"), "w") as f:
      f.write(str(stopping.requested()))
    raise stopping.Interrupted("stopped", stopping.requested())


def draining_job(config_dict, workdir, companions=()):
  """The first task's job asks its sweep driver (the worker's parent) to drain, as
  `kill -USR1 DRIVER` does, and sends the same signal to its own worker (as a signal to
  the whole process group would), then trains like counting_job."""
  if config_dict["task"] == "reverse_string":
    os.kill(os.getppid(), sweep.DRAIN_SIGNAL)
    os.kill(os.getpid(), sweep.DRAIN_SIGNAL)
  return counting_job(config_dict, workdir, companions)


def ray_draining_job(config_dict, workdir, companions=()):
  """For a Ray sweep, whatever order and concurrency Ray gives its tasks: the first job
  to start takes its folder's lock (started, to the driver), asks the driver
  (SWEEP_DRIVER_PID) to drain and its own worker too, then trains. Every other job waits
  before it takes its lock (not started) for the driver's cancel to interrupt it; it
  goes on after 60 s, so that a drain missed fails the test's counts instead of hanging
  it."""
  sweep_dir = os.path.dirname(os.path.dirname(workdir))
  try:
    os.close(os.open(os.path.join(sweep_dir, "first"), os.O_CREAT | os.O_EXCL))
  except FileExistsError:
    deadline = time.time() + 60
    while time.time() < deadline:
      time.sleep(0.05)  # Short sleeps: the cancel's KeyboardInterrupt ends the wait.
  else:
    with workdir_lib.locked(workdir):
      os.kill(int(os.environ["SWEEP_DRIVER_PID"]), sweep.DRAIN_SIGNAL)
      os.kill(os.getpid(), sweep.DRAIN_SIGNAL)
  return counting_job(config_dict, workdir, companions)
