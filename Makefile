# make demo: set up and run the card's exchange on local ranks.  make test: set up and run the tests.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints-dev.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints-dev.txt -e ".[test,plot,mpi]"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/reshard demo

test: setup
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m pytest -q

lint: setup
	$(PY) -m ruff check src tests benchmarks examples

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
