"""The reports' figures: one way to open a figure of panels and to save it as PNG.

Matplotlib is imported on first use (with the Agg backend, so no display is needed), so
that importing a report module stays cheap for the tables-only paths.
"""
from __future__ import annotations

FOLDER = "figures"  # A report's figures are in OUT_DIR/figures.


def panels(width=7, height=4, ncols=1, nrows=1):
  """A figure of nrows x ncols panels, each width x height inches: (plt, fig, axes in
  reading order)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
  return plt, fig, list(axes.ravel())


def save(plt, fig, path: str, fit_outside: bool = False) -> None:
  """Writes `fig` to `path` (PNG, 110 dpi) and closes it. fit_outside: the image takes
  in what lies outside the panels (a legend beside them), so its size follows what is
  drawn; else every figure of a kind has the same size."""
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight" if fit_outside else None)
  plt.close(fig)
