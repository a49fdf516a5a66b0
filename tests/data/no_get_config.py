"""A config file without get_config (tests of the one-line errors)."""
STEPS = 1
