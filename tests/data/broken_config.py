"""A config file with a syntax error (tests of the one-line errors)."""

def get_config(:
  pass
