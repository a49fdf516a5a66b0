"""The Latin Square Task of Ito et al. (2024): shipped data and the original splits.

A dataset of `tasks.datasets` (name "latin_square"), used from the repository root like
the rest of `tasks/` (it is not installed by setup.py):

  from tasks.latin_square import data
  lst = data.load()          # train 8,100 / test 900 / validation 108, with conditions

The files are in `tasks/latin_square/files/` (README and licence there). The model of
that paper is `randomized_pe.models.ito` (model name "ito"); docs/ito.md describes both.
"""
