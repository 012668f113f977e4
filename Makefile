# The two commands a newcomer runs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PY313 ?= $(shell command -v python3.13 2>/dev/null || ls $$HOME/.pyenv/versions/3.13*/bin/python3 2>/dev/null | tail -1)

.PHONY: demo test test-django6 lint typecheck check bench clean

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

# Django 6.x on Python 3.13 (skipped with a message when no 3.13 is installed).
test-django6:
	@if [ -z "$(PY313)" ]; then echo "Python 3.13 not found: skipping Django 6.x"; exit 0; fi; \
	if [ ! -f .venv313/.installed ]; then \
	  $(PY313) -m venv .venv313 && .venv313/bin/python -m pip install -q --upgrade pip && \
	  .venv313/bin/python -m pip install -q -e ".[dev]" "Django>=6,<7" && touch .venv313/.installed; fi; \
	PY=.venv313/bin/python scripts/test

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

check: lint typecheck

bench: $(VENV)/.installed
	PY=$(PY) scripts/bench

clean:
	rm -rf $(VENV) .venv313 .pgdata .test-*.sqlite3* example_project/db.sqlite3*
