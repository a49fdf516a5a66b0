"""A stand-in entry point for tests/test_entry_points.py: prints what a `python -m` run sees
and exits with the code given as its first argument."""
import json
import os
import sys

if __name__ == "__main__":
  import jax  # pylint: disable=import-outside-toplevel
  print(json.dumps({"argv": sys.argv[1:], "orig_argv": sys.orig_argv[1:],
                    "argv0": os.path.basename(sys.argv[0]), "cwd": os.getcwd(),
                    "path0": sys.path[0], "probe": os.environ.get("PROBE"),
                    "stdin": sys.stdin.read(), "devices": jax.device_count()}))
  print("to stderr", file=sys.stderr)
  sys.exit(int(sys.argv[1]))
