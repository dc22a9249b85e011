# The two entry points of the README, and the pieces they are made of.
#   make demo   the example project end to end: web, worker, reaper, seeded todos
#   make test   lint, type check and the test suite against a real PostgreSQL
# PYTHON picks the interpreter and VENV the environment, e.g. for the Django 6 run in CI:
#   make test PYTHON=python3.12 VENV=.venv-django6

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP_CONSTRAINT ?=
# Runs a command with one database for it and its children: DATABASE_URL, else the local server,
# else an embedded PostgreSQL that is stopped and deleted when the command ends.
WITH_DATABASE = $(BIN)/python -m devtools.database run --

.PHONY: demo demo-crash test lint typecheck pytest suite django-tasks-tests bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' $(PIP_CONSTRAINT)
	touch $@ $(BIN)/.installed-example

# What the demo needs, without the test tools (make test adds them): the first demo is quicker.
$(BIN)/.installed-example: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[example,binary]' $(PIP_CONSTRAINT)
	touch $@

# DEBUG=1: the demo is local development (a throwaway key, plain HTTP, the printed password).
demo: $(BIN)/.installed-example
	DEBUG=1 $(WITH_DATABASE) $(BIN)/python manage.py demo $(DEMO_ARGS)

demo-crash: $(BIN)/.installed-example
	DEBUG=1 $(WITH_DATABASE) $(BIN)/python manage.py demo_crash $(DEMO_ARGS)

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.installed
	$(BIN)/mypy .

pytest: $(BIN)/.installed
	$(WITH_DATABASE) $(MAKE) --no-print-directory suite

suite: $(BIN)/.installed
	$(BIN)/python -m django check --settings=tests.settings
	$(BIN)/python -m django makemigrations --check --dry-run --settings=tests.settings
	$(BIN)/python -m pytest --cov --cov-report=term $(PYTEST_ARGS)

test: $(BIN)/.installed
	$(WITH_DATABASE) $(MAKE) --no-print-directory lint typecheck pytest

# Django's own tests/tasks modules against TodoBackend (Django 6; the backport ships none).
django-tasks-tests: $(BIN)/.installed
	$(WITH_DATABASE) $(BIN)/python -m devtools.django_tests

# The benchmarks use their own database on the same server (bench/setup.py); a miss of a
# target is printed, never an error. BENCH_ARGS=--smoke for the CI size.
bench: $(BIN)/.installed
	$(WITH_DATABASE) $(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-* .pytest_cache .mypy_cache .ruff_cache .coverage build *.egg-info
