# The two commands a newcomer runs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-django6 lint typecheck check bench bench-admin clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" "Django>=5.2,<6" "django-tasks>=0.7"
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	cd example_project && ../$(PY) manage.py hopper_demo

test: $(VENV)/.installed
	PY=$(PY) scripts/test

# Django 6.x on Python 3.12+ (skipped with a message when none is installed).
test-django6:
	scripts/test-django6

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

check: lint typecheck

bench: $(VENV)/.installed
	PY=$(PY) scripts/bench

# The admin at 1,000,000 history rows and 100,000 live jobs (PostgreSQL, its own database).
bench-admin: $(VENV)/.installed
	$(PY) -m bench.admin

clean:
	rm -rf $(VENV) .venv313 .pgdata .test-*.sqlite3* example_project/db.sqlite3*
