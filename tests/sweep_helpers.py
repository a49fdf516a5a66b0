"""Job functions for the sweep tests (importable by Ray workers and spawned processes)."""
import copy
import os
import signal

from experiments import sweep


def counting_job(config_dict, workdir):
  """run_job, then records one completion in the job folder."""
  result = sweep.run_job(config_dict, workdir)
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


def interrupted_job(config_dict, workdir):
  """The first attempt of the first task's jobs stops halfway with an error."""
  if config_dict["task"] == "parity_check" and _stop_halfway_once(config_dict, workdir):
    raise RuntimeError("stopped halfway")
  return counting_job(config_dict, workdir)


def killed_job(config_dict, workdir):
  """The first attempt of the first task's jobs kills its own worker process halfway."""
  if config_dict["task"] == "parity_check" and _stop_halfway_once(config_dict, workdir):
    os.kill(os.getpid(), signal.SIGKILL)
  return counting_job(config_dict, workdir)
