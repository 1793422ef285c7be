# Two entry points: `make serve` and `make test`. Everything else is the `accountant` command.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# `make serve` installs the service and the client (its own distribution in client/, which no
# extra can name by path), which the `accountant` command's HTTP commands (requests,
# populations) use; `make test` adds the test extra.
SERVE_STAMP := $(VENV)/.installed-serve
# The example third-party plugin is installed for the tests only, outside the service's venv.
TEST_PLUGINS := $(CURDIR)/.test-plugins

.PHONY: help serve test
help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' Makefile | sed 's/:.*## /\t/'

$(BIN)/pip:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(SERVE_STAMP): pyproject.toml client/pyproject.toml Makefile | $(BIN)/pip
	$(BIN)/pip install --quiet -e . -e ./client
	touch $(SERVE_STAMP)

$(STAMP): pyproject.toml client/pyproject.toml | $(BIN)/pip
	$(BIN)/pip install --quiet -e '.[test]' -e ./client
	touch $(STAMP)

$(TEST_PLUGINS): $(STAMP) tests/example_plugin/pyproject.toml tests/example_plugin/accountant_example/*.py
	rm -rf $(TEST_PLUGINS)
	$(BIN)/pip install --quiet --no-deps --target $(TEST_PLUGINS) tests/example_plugin

PORT   ?= 8000

serve: $(SERVE_STAMP)  ## install, migrate ./var/accountant.db, print a first admin key, serve on :$(PORT) (make serve PORT=9000)
	$(BIN)/accountant init
	$(BIN)/accountant serve --host 127.0.0.1 --port $(PORT) --workers 2

test: $(STAMP) $(TEST_PLUGINS)  ## lint, type-check and run the whole test suite
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/vulture
	PYTHONPATH=$(TEST_PLUGINS) $(BIN)/python -m pytest
