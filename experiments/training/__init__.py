"""How a run trains and is evaluated: its data (data), the training step and model
(steps), the loop, evaluation and its records (evaluation, results), the checks of a
config before anything compiles (validation, memory), the compilation cache, stopping
on a signal, event files and the process's malloc (runtime), and restore_run
(trained_run), the one reader of a trained run. Imports experiments.storage below it,
nothing above."""
