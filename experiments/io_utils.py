"""Atomic file writes: a killed run never leaves a truncated file behind."""
from __future__ import annotations

import json
import os
import tempfile


def atomic_write_text(path: str, text: str) -> None:
  """Writes `text` to `path` via a temporary file in the same folder and a rename."""
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_" + os.path.basename(path))
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_json(path: str, data) -> None:
  atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def write_jsonl(path: str, records) -> None:
  atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def read_jsonl(path: str) -> list:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
