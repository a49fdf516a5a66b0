"""The Latin Square Task of Ito et al. (2024): shipped data and the original splits.

Used from the repository root like `tasks/` (it is not installed by setup.py):

  from latin_square import data
  lst = data.load()          # train 8,100 / test 900 / validation 108, with conditions

The model of that paper is `randomized_pe.models.ito` (model name "ito"); docs/ito.md
describes both.
"""
