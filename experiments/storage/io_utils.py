"""Atomic file writes (results, compiled executables) and careful reads of a run's JSON files.

A killed run never leaves a truncated file behind; results get ordinary permissions
(0666 less the umask, like any file the user creates), not the 0600 of a temporary
file; a damaged file is named in the error.
"""
from __future__ import annotations

import json
import os
import tempfile


class CorruptFileError(Exception):
  """A result file exists but cannot be read; the message names it."""


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def atomic_write_bytes(path: str, data: bytes, durable: bool = True) -> None:
  """Writes `data` to `path` via a temporary file in the same folder and a rename, so a
  reader sees the old file or the whole new one. durable: fsync before the rename (a
  crash keeps the old file or the new one); False for files that can be made again."""
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_" + os.path.basename(path))
  try:
    os.fchmod(fd, 0o666 & ~_umask())
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      if durable:
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def atomic_write_text(path: str, text: str) -> None:
  """`atomic_write_bytes` of `text` in UTF-8."""
  atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str, data) -> None:
  atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def write_jsonl(path: str, records) -> None:
  atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def read_json(path: str):
  """The JSON value in `path`; CorruptFileError naming the file if it is not valid JSON."""
  with open(path) as f:
    text = f.read()
  try:
    return json.loads(text)
  except ValueError as e:
    raise CorruptFileError(f"{path} is damaged (not valid JSON: {e})") from None


def read_jsonl(path: str) -> list:
  """The records of a JSON-lines file ([] if it does not exist), CorruptFileError naming
  the file and line if one is damaged."""
  if not os.path.exists(path):
    return []
  records = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if line.strip():
        try:
          records.append(json.loads(line))
        except ValueError as e:
          raise CorruptFileError(f"{path} line {number} is damaged (not valid JSON: {e})"
                                 ) from None
  return records
