"""TensorBoard event files of a run's metrics: WORKDIR/events/, a copy of metrics.jsonl.

  tensorboard --logdir runs/            # every run (and every sweep job) under runs/

The training loop hands `EventLog.sync` the list of records each time it writes
metrics.jsonl (experiments/training/loop.py), so the event files always hold exactly the records
of metrics.jsonl, each step once:
  - at the start of a run (fresh or resumed) the event file is rewritten from the
    records metrics.jsonl holds then, under a new name (written whole to a temporary
    file, the older event files removed, then renamed: a reader never sees two files);
  - during the run new records are appended;
  - when the loop drops records (a resume redoes the steps after its checkpoint, as it
    rewrites metrics.jsonl) the file is rewritten again.
So a resumed run cannot duplicate steps, whatever the reader, and a run trained before
this module existed gets its event file when it resumes. Each new file starts with
TensorBoard's "session start" marker at step 0, so a TensorBoard that supports purging
orphaned data drops what it had read from the replaced file; restart a TensorBoard left
open across a resume if it still shows the redone steps.

Tags (the x axis is the step; the wall time is the time the event was written):
  train/loss, train/accuracy, train/steps_per_second, ...   each log record's fields
  eval/mean, eval/train_range, eval/unseen                  evaluation during training
                                                            (evaluation.every_steps)
  eval/train_seconds                                        training seconds at it
  eval_length/NNN                                           its accuracy at length NNN
  eval/SPLIT/GROUP, eval/epoch                              a dataset's evaluation
                                                            (evaluation.every_epochs)
A grid (config.grid: seeds x learning rates trained together) writes one TensorBoard run
per model, WORKDIR/events/NAME/, with the same tags, so TensorBoard draws the models of
a chart together: NAME is seed{S}_lr{LR} (seed{S} alone when only seeds vary, lr{LR}
alone when only learning rates vary). Values shared by the models (steps_per_second,
train_seconds, epoch) go to each of them; missing values (an unseen score without
unseen lengths) are left out.

The writer: tensorboardX's Event and Summary protobufs and its record framing (masked
CRC-32C), written here synchronously. tensorboardX is pure Python on protobuf and
numpy (which JAX and orbax already bring); TensorFlow or tensorboard itself would add
hundreds of MB or a web server to write a few scalars, and SummaryWriter would add a
writer thread and a multiprocessing queue to the training process while we need a file
we can rewrite exactly. It is an `experiments` requirement, never one of the core
`randomized_pe`; without it a run says so once and writes no events.
"""
from __future__ import annotations

import os
import socket
import struct
import time

from experiments.storage import io_utils

FOLDER = "events"
_MARKER = "tfevents"  # TensorBoard reads the files whose name holds it.


def _tensorboardx():
  try:
    from tensorboardX import record_writer  # pylint: disable=import-outside-toplevel
    from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
    from tensorboardX.proto import summary_pb2  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return record_writer, event_pb2, summary_pb2


def member_names(members) -> list[str]:
  """The events subfolder of each grid model, from its (seed, learning rate); [""] (the
  events folder itself) for a single model."""
  members = [(int(s), float(r)) for s, r in members]
  if len(members) <= 1:
    return [""]
  seeds, rates = len({s for s, _ in members}) > 1, len({r for _, r in members}) > 1
  names = ["_".join([f"seed{s}"] * seeds + [f"lr{r:g}"] * rates) or "model"
           for s, r in members]
  if len(set(names)) < len(names):
    names = [f"model{i}_{n}" for i, n in enumerate(names)]
  return names


def _per_model(value, count: int) -> list:
  """A leaf of a record as one value per model: a grid's lists are per model, anything
  else (a single model's value, or one shared by the grid) is the same for each."""
  if count > 1 and isinstance(value, list):
    if len(value) != count:
      raise ValueError(f"a metrics value has {len(value)} entries for {count} models")
    return list(value)
  return [value] * count


def scalars(record: dict, count: int) -> list[list[tuple[str, float]]]:
  """The (tag, value) pairs of a metrics.jsonl record, per model of the grid (the module
  docstring names the tags)."""
  out = [[] for _ in range(count)]

  def add(tag, value):
    for i, v in enumerate(_per_model(value, count)):
      if v is not None:
        out[i].append((tag, float(v)))

  evaluation = record.get("evaluation")
  prefix = "train" if evaluation is None else "eval"
  for key, value in sorted(record.items()):
    if key not in ("step", "evaluation"):
      add(f"{prefix}/{key}", value)
  if evaluation is None:
    return out
  if "lengths" in evaluation:  # A generated task: accuracy per length, and scores.
    for length, value in zip(evaluation["lengths"], evaluation["accuracy"]):
      add(f"eval_length/{int(length):03d}", value)
    for key, value in sorted(evaluation.items()):
      if key not in ("lengths", "accuracy"):
        add(f"eval/{key}", value)
  else:  # A dataset: accuracy per split and group.
    for split, groups in sorted(evaluation.items()):
      for group, value in sorted(groups.items()):
        add(f"eval/{split}/{group}", value)
  return out


class EventLog:
  """The event files of a run (one per grid model), kept equal to metrics.jsonl."""

  def __init__(self, workdir: str, members, records: list):
    """Rewrites the event files from `records` (metrics.jsonl as the run starts)."""
    self._tbx = _tensorboardx()
    self.folder = os.path.join(workdir, FOLDER)
    self._names = member_names(members)
    self._written, self._paths = None, []
    if self._tbx is None:
      print("note: tensorboardX is not installed (pip install -e .[experiments]); "
            f"no TensorBoard events in {self.folder}", flush=True)
      return
    self.sync(records)

  def sync(self, records: list) -> None:
    """Makes the event files hold `records`, the records metrics.jsonl now holds:
    appends those added since the last call, or rewrites the files if some changed."""
    if self._tbx is None:
      return
    written = self._written
    if written is not None and records[:len(written)] == written:
      self._append(records[len(written):])
    else:
      self._rewrite(records)
    self._written = list(records)

  def _folders(self) -> list[str]:
    return [os.path.join(self.folder, name) if name else self.folder for name in self._names]

  def _rewrite(self, records: list) -> None:
    per_model = self._encode(records)
    stamp = int(time.time())
    self._paths = []
    for folder, frames in zip(self._folders(), per_model):
      os.makedirs(folder, exist_ok=True)
      name = f"events.out.{_MARKER}.{stamp:010d}.{socket.gethostname()}"
      path = os.path.join(folder, name)
      header = self._frame(self._event(step=0, file_version="brain.Event:2"))
      start = self._frame(self._event(step=0, session_log=self._tbx[1].SessionLog(
          status=self._tbx[1].SessionLog.START)))
      tmp = os.path.join(folder, ".tmp_events")
      io_utils.atomic_write_bytes(tmp, header + start + b"".join(frames), durable=False)
      for old in os.listdir(folder):
        if _MARKER in old and old != name:
          os.remove(os.path.join(folder, old))
      os.replace(tmp, path)
      self._paths.append(path)

  def _append(self, records: list) -> None:
    if not records:
      return
    for path, frames in zip(self._paths, self._encode(records)):
      with open(path, "ab") as f:
        f.write(b"".join(frames))

  def _encode(self, records: list) -> list[list[bytes]]:
    """The framed events of `records`, per model."""
    summary_pb2 = self._tbx[2]
    per_model = [[] for _ in self._names]
    for record in records:
      for frames, values in zip(per_model, scalars(record, len(self._names))):
        if values:
          summary = summary_pb2.Summary(value=[
              summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in values])
          frames.append(self._frame(self._event(step=int(record["step"]), summary=summary)))
    return per_model

  def _event(self, **fields):
    return self._tbx[1].Event(wall_time=time.time(), **fields)

  def _frame(self, event) -> bytes:
    """One TFRecord: length, its masked CRC-32C, the data, its masked CRC-32C."""
    crc = self._tbx[0].masked_crc32c
    data = event.SerializeToString()
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", crc(length)) + data + struct.pack("<I", crc(data))


def read(path: str) -> list[dict]:
  """The scalar events of one event file, checking every record's checksums:
  [{"step", "wall_time", "values": {tag: value}}] in file order (tests, and a way to read
  the files without TensorBoard)."""
  record_writer, event_pb2, _ = _tensorboardx()
  crc = record_writer.masked_crc32c
  with open(path, "rb") as f:
    data = f.read()
  events, at = [], 0
  while at < len(data):
    if len(data) - at < 12:
      raise io_utils.CorruptFileError(f"{path} ends inside a record header")
    length_bytes = data[at:at + 8]
    (length,), (length_crc,) = struct.unpack("<Q", length_bytes), struct.unpack(
        "<I", data[at + 8:at + 12])
    body = data[at + 12:at + 12 + length]
    if crc(length_bytes) != length_crc or len(body) != length or len(data) < at + 16 + length:
      raise io_utils.CorruptFileError(f"{path} has a damaged record at byte {at}")
    (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
    if crc(body) != body_crc:
      raise io_utils.CorruptFileError(f"{path} has a damaged record at byte {at}")
    event = event_pb2.Event.FromString(body)
    if event.HasField("summary"):
      events.append({"step": event.step, "wall_time": event.wall_time,
                     "values": {v.tag: v.simple_value for v in event.summary.value}})
    at += 16 + length
  return events


def event_files(folder: str) -> list[str]:
  """The event files directly in `folder`, sorted by name (TensorBoard's order)."""
  if not os.path.isdir(folder):
    return []
  return sorted(os.path.join(folder, n) for n in os.listdir(folder) if _MARKER in n)
