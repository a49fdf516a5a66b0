"""How fast the code is: the sections of `python -m experiments.benchmark` (its flags and
`main` stay in experiments/benchmark.py, which passes their values to these functions;
nothing here reads a flag). Figures are printed and returned, never asserted.

  timing.py            the median of repeated calls, load averages, the CPU's name
  processes.py         code versions in their own processes: a temporary worktree of a
                       commit, huge-page malloc on or off, TrainWorker, compare_training
                       and compare_evaluation (alternating rounds)
  driver.py            the script those processes run (copied to a scratch folder; it
                       imports the code under test, ours or the original release's)
  throughput.py        FLOPs and throughput: the float32 matmul's, a config's compiled
                       steps (cost analysis, steps/s: step_figures), profile op shares
  task_generation.py   section tasks
  training_speed.py    section train (parts speed and limit)
  evaluation_speed.py  section eval
  model_speed.py       sections grid and attention
  buckets.py           section buckets (parts compile, cache, demo; cache_child)
  ito_speed.py         section ito
  roofline.py          section roofline (GPU-hours projected from the cost analysis)

Imports experiments.training, experiments.storage and experiments.cli below it, no entry
point and nothing of experiments/analysis/.
"""
