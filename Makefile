# `make demo` and `make test` work on a fresh machine with Python 3.11: they
# create the virtual environment on first use and install the project into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CLUSTER_STAMP := $(VENV)/.installed-cluster

.PHONY: install test demo benchmark clean

install: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Ray (the `cluster` extra) is only needed by the sweep's Ray executor and its test.
$(CLUSTER_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,cluster]'
	touch $(CLUSTER_STAMP)

# One pytest worker per core (pytest-xdist): most tests wait on a single-threaded compile,
# so two workers on a 2-core machine nearly halve the wall time. They share one
# compilation cache (tests/conftest.py); `make test PYTEST_WORKERS=0` runs in one process.
# The 20 slowest tests are listed at the end, so a run's log says where the time went.
PYTEST_WORKERS ?= auto
test: $(CLUSTER_STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=20 tests

# The CPU-sized main job: trains reverse_string with randomized relative encodings.
demo: $(STAMP)
	$(PY) -m experiments.train --config=configs/demo.py --workdir=runs/demo

benchmark: $(STAMP)
	$(PY) -m experiments.benchmark

clean:
	rm -rf $(VENV) .pytest_cache
