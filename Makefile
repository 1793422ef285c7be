# Two entry points: `make serve` and `make test`. Everything else is the `accountant` command.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: help serve test
help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' Makefile | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml tests/example_plugin/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/pip install --quiet -e tests/example_plugin  # a third-party plugin, as users add them
	touch $(STAMP)

serve: $(STAMP)  ## install, migrate ./var/accountant.db, print a first admin key, serve on :8000
	$(BIN)/accountant init
	$(BIN)/accountant serve --host 127.0.0.1 --port 8000 --workers 2

test: $(STAMP)  ## lint, type-check and run the whole test suite
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest
