"""What a trained run attends to and where its activations go beyond the training lengths.

  python -m experiments.analyze --workdir=runs/reverse_rr [--kind=all|attention|pca] \
      [--length=N] [--beyond_length=M] [--out=FOLDER] [--num_sequences=30] [--member=0]

For a run of `python -m experiments.train` (its workdir: config.json, checkpoints/), with
the newest checkpoint, on `num_sequences` sequences of a training length N (default: the
longest) and of a length M beyond it (default: min(3 N, evaluation.max_length)), with the
positions the model gets at evaluation (its evaluation sampler). Writes into FOLDER
(default WORKDIR/analysis):
  attention.png   the paper's Figure 6: for each layer, the maximum over heads of the
                  attention weights of the first sequence, at N and at M
  pca.png         the paper's Figure 5: the embeddings and every layer's output projected
                  on a 2-D PCA fitted on the length-N activations only, the length-M
                  activations projected with the same fit
  analysis.json   the numbers behind both (docs/analyze.md): per layer and head, the
                  attention mass on the key the task says an output should read (for
                  reverse_string the anti-diagonal of the output-to-input block), entropy
                  and mean attended distance; per layer, how far the length-M activations
                  lie from the length-N cloud; the accuracy on the sequences
and prints them. The attention weights, the embeddings and every layer's output are the
model's own: the encoder returns them with its logits when asked
(`EncoderModel.apply(..., intermediates=True)`), in the forward pass the evaluator runs
(`experiments.training.evaluation.predict_padded`).

Exit codes: 0 done; 2 bad input (missing workdir, config or checkpoint, an unknown kind,
a length the run or the model cannot take, a model other than the encoder), one line on
stderr before anything is compiled or written; 1 a failure (a damaged file, an
operating-system error).
"""
import os
import sys

from experiments import cli
from experiments.analysis import attention

_FLAG_NAMES = ("workdir", "kind", "length", "beyond_length", "out", "num_sequences", "member",
               "seed")


def define_flags() -> None:
  """Defines the flags (once; the entry point and in-process callers share them)."""
  from absl import flags  # pylint: disable=import-outside-toplevel

  if "kind" in flags.FLAGS and "beyond_length" in flags.FLAGS:
    return
  flags.DEFINE_string("workdir", None, "Folder of a run of python -m experiments.train.")
  flags.DEFINE_enum("kind", "all", attention.KINDS, "Which analysis: attention maps, PCA, or both.")
  flags.DEFINE_integer("length", None, "A training length (default: the longest).")
  flags.DEFINE_integer("beyond_length", None, "A length beyond training (default: "
                       "min(3 x the longest training length, evaluation.max_length)).")
  flags.DEFINE_string("out", None, f"Output folder (default: WORKDIR/{attention.OUT_FOLDER}).")
  flags.DEFINE_integer("num_sequences", 30, "Sequences per length (the paper's Fig. 5: 30).")
  flags.DEFINE_integer("member", 0, "Which model of a grid run (index into seeds x rates).")
  flags.DEFINE_integer("seed", 0, "Seed of the sequences and their positions.")


def main(argv) -> None:
  del argv  # cli.parse_flags refuses extra arguments.
  from absl import flags  # pylint: disable=import-outside-toplevel
  from absl import logging  # pylint: disable=import-outside-toplevel

  from experiments.storage import checkpoints  # pylint: disable=import-outside-toplevel
  from experiments.training import compile_cache  # pylint: disable=import-outside-toplevel
  from experiments.storage import io_utils  # pylint: disable=import-outside-toplevel

  logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO.
  f = flags.FLAGS
  if f.workdir is None:
    cli.fail("--workdir is required: the folder of a run of python -m experiments.train")
  try:
    run = attention.prepare(f.workdir, f.kind, f.length, f.beyond_length, f.out, f.num_sequences,
                  f.member, f.seed)
  except attention.BadInput as e:
    cli.fail(cli.one_line(e))
  except io_utils.CorruptFileError as e:
    cli.fail(cli.one_line(e), cli.EXIT_FAILED)
  import jax  # pylint: disable=import-outside-toplevel
  if not jax.config.jax_compilation_cache_dir:  # Not already chosen by an embedding process.
    try:
      compile_cache.enable(run.config.get("compilation_cache", ""))
    except OSError as e:
      print(f"warning: compilation cache off: {cli.one_line(e)}", file=sys.stderr)
  print(f"analysing {run.workdir} ({run.config.task}, {run.model.label}): "
        f"{run.num_sequences} sequences of length {run.length} and {run.beyond_length}",
        flush=True)
  try:
    result = attention.run_analysis(run)
  except (io_utils.CorruptFileError, checkpoints.StorageError,
          FileNotFoundError, OSError) as e:
    cli.fail(cli.one_line(e), cli.EXIT_FAILED)
  print(attention.summary(result))
  written = [result[k]["figure"] for k in ("attention", "pca") if k in result]
  print(f"written: {', '.join(written + [os.path.join(run.out, attention.JSON_FILE)])}")


def command_line(argv) -> None:
  """The entry point's work for `argv` (argv[0] the program), in this process: flags
  parsed with one-line errors (exit 2), then `main`. Flags not in argv take their
  defaults, whatever an earlier call set."""
  from absl import flags  # pylint: disable=import-outside-toplevel

  define_flags()
  for name in _FLAG_NAMES:
    flags.FLAGS[name].unparse()
  main(cli.parse_flags(argv))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
