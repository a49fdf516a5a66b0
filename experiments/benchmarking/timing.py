"""How the benchmark's figures are timed and read beside the machine: the median of
repeated calls, the load averages (the machine is shared) and the CPU's name."""

import os
import platform
import statistics
import subprocess
import time


def median_ms(fn, repeats) -> float:
  """Milliseconds of `fn(i)`: the median of `repeats` calls after one warm-up call."""
  fn(0)  # Warm-up.
  times = []
  for i in range(repeats):
    start = time.perf_counter()
    fn(i + 1)
    times.append((time.perf_counter() - start) * 1000)
  return statistics.median(times)


def load() -> str:
  """The 1, 5 and 15 minute load averages (the machine is shared; read figures beside it)."""
  return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_name() -> str:
  """lscpu's model name (or platform.processor()) and the logical CPUs."""
  name = ""
  try:
    text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    name = next((l.split(":", 1)[1].strip() for l in text.splitlines()
                 if l.startswith("Model name")), "")
  except OSError:
    pass
  return f"{name or platform.processor() or 'unknown CPU'}, {os.cpu_count()} logical CPUs"
