# `make test` and `make demo` work on a fresh machine with Python 3.11: they
# create the virtual environment on first use and install the project into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test demo benchmark clean

install: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

# The CPU-sized main job: trains reverse_string with randomized relative encodings.
demo: $(STAMP)
	$(PY) -m experiments.train --config=configs/demo.py --workdir=runs/demo

benchmark: $(STAMP)
	$(PY) -m experiments.benchmark

clean:
	rm -rf $(VENV) .pytest_cache
