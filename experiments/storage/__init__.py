"""Where a run's files live: its working folder (workdir), checkpoints, atomic writes
(io_utils) and the commit of a results folder (results_git). Imports nothing of
experiments/ outside this folder."""
