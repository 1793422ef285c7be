"""A fork server for the mutation check: pytest runs forked from a process that imported
its plugins and the service's libraries once.

A pytest process of the suite spends about 5 of its first 6 seconds importing (hypothesis
and schemathesis, the plugins it loads at start, 4 s of them), and the mutation check starts
one for every mutation. tests/mutation_check.py starts this script (by its path: it is
never imported from the ``tests`` package, so that no child finds this tree's ``accountant``
or ``tests`` already imported), which imports what every run would (``PRELOADED``), then
reads requests, one JSON object a line on stdin: ``{"cwd", "args", "env", "log"}``. For
each it forks a child that changes to ``cwd``, puts it first on the import path, takes
``env`` as its whole environment, sends its output to the file ``log`` and runs
``pytest.main(args)``; the server answers with a line ``{"code": <the child's exit
code>}``. The mutated code itself (the copy's ``accountant``, its plugins and tests) is
imported in each child, as in a new process.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
from typing import Any, NoReturn

#: Imported once here, before any fork: pytest's plugins and the libraries the service and
#: the tests import. Never the project's own packages.
PRELOADED = (
    "pytest",
    "xdist.plugin",
    "_hypothesis_pytestplugin",
    "hypothesis",
    "hypothesis.strategies",
    "schemathesis",
    "anyio",
    "sqlalchemy",
    "sqlalchemy.dialects.postgresql",
    "sqlalchemy.dialects.sqlite",
    "alembic",
    "flask",
    "werkzeug",
    "numpy",
    "cryptography.hazmat.primitives.asymmetric.ed25519",
    "psycopg",
    "pluggy",
    "jsonschema",
    "dp_accounting",
    "click",
)
#: The packages each child imports from its copy.
_OWN = ("accountant", "accountant_plugins", "accountant_migrations", "tests")


def main() -> None:
    sys.path.pop(0)  # this script's folder: the copy's tests come from the copy
    for name in PRELOADED:
        with contextlib.suppress(ImportError):  # what is not installed is not needed
            importlib.import_module(name)
    own = [name for name in sys.modules if name.split(".")[0] in _OWN]
    if own:
        raise SystemExit(f"the fork server imported the project's own modules: {own}")
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)


def _child(request: dict[str, Any]) -> NoReturn:
    """Run pytest as the request says, and exit with its code (3 if it could not start)."""
    code = 3
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.chdir(request["cwd"])
        sys.path.insert(0, request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import pytest

        code = int(pytest.main(request["args"]))
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
