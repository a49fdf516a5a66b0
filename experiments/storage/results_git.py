"""Commits a finished job's small files to git as the job finishes, so that a sweep's
results travel with the code that made them and a sweep of many sessions resumes from
any fresh clone (issue 25; `experiments.sweep --commit_results`).

A job's small files: config.json, eval.json, metrics.jsonl (reused_from.json in a job
copied from another folder's) and the files its
`sweep.job_outputs` name (experiments/training/jobs.py). Checkpoints, event files and logs are
never committed (the repository's .gitignore also keeps them out of results/). The
commit holds those files only (`git commit --only`), whatever else is staged. A lock
held by another git command (someone committing in the same checkout) is waited for, a
few seconds; any other failure (no repository, a lock that stays) is one warning line and
the sweep goes on: `Committer` tries that job's files again when the next job finishes.
"""
from __future__ import annotations

import os
import subprocess
import time

# reused_from.json: in a job copied from another sweep folder's (`--reuse_from`), its source.
SMALL_FILES = ("config.json", "eval.json", "metrics.jsonl", "reused_from.json")


def job_files(workdir: str, outputs=()) -> list[str]:
  """The small files of a job folder that exist, in a fixed order."""
  return [os.path.join(workdir, name) for name in (*SMALL_FILES, *outputs)
          if os.path.isfile(os.path.join(workdir, name))]


# A lock held by another git command is waited for this long (LOCK_TRIES x LOCK_WAIT s).
LOCK_TRIES = 10
LOCK_WAIT = 1.0


def _git(args, cwd) -> subprocess.CompletedProcess:
  """git ARGS in `cwd`; while another git command holds the repository's lock (its
  index.lock), tries again for up to LOCK_TRIES x LOCK_WAIT seconds."""
  for attempt in range(LOCK_TRIES):
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=False)
    if done.returncode == 0 or ".lock" not in done.stderr or attempt == LOCK_TRIES - 1:
      return done
    time.sleep(LOCK_WAIT)
  return done


def commit_job(workdir: str, name: str, outputs=()) -> str | None:
  """Commits the job's small files, the subject naming their folder in the repository;
  returns the commit's hash, "" when there was nothing new to commit, or None when git
  failed (then one warning line on stdout)."""
  files = job_files(workdir, outputs)
  if not files:
    return ""
  top = _git(["rev-parse", "--show-toplevel"], workdir)
  if top.returncode != 0:
    print(f"[sweep] warning: not committing {name}: {workdir} is not in a git repository",
          flush=True)
    return None
  root = top.stdout.strip()

  def in_repository(path):
    return os.path.relpath(os.path.realpath(path), os.path.realpath(root))

  paths = [in_repository(f) for f in files]
  # The subject names the job's folder from the repository's top (SWEEP_DIR/TASK/VARIANT):
  # the same TASK/VARIANT recurs in several sweep folders.
  folder = in_repository(workdir)
  if not _git(["status", "--porcelain", "--", *paths], root).stdout.strip():
    return ""  # Committed already.
  for step in (["add", "--", *paths],
               ["commit", "-q", "--only", "-m", f"results: {folder} finished "
                f"({', '.join(os.path.basename(p) for p in paths)})", "--", *paths]):
    done = _git(step, root)
    if done.returncode != 0:
      why = (done.stderr or done.stdout).strip().splitlines()
      print(f"[sweep] warning: could not commit the results of {name}: git {step[0]}: "
            f"{why[-1] if why else done.returncode}; trying again when the next job "
            "finishes", flush=True)
      return None
  commit = _git(["rev-parse", "--short", "HEAD"], root).stdout.strip()
  print(f"[sweep] committed the results of {name} ({commit})", flush=True)
  return commit


class Committer:
  """Commits each finished job's small files (`commit_job`), and with every call those of
  earlier jobs whose commit failed, so that a failure is caught up by the next job."""

  def __init__(self):
    self.pending = []  # (workdir, name, outputs) of jobs whose commit failed.

  def __call__(self, workdir: str, name: str, outputs=()) -> None:
    self.pending.append((workdir, name, tuple(outputs)))
    self.pending = [job for job in self.pending if commit_job(*job) is None]
