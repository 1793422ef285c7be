"""Request bodies of the API: JSON, bounded in size, parsed without binary floats and
validated against the API's schemas."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from accountant.api import schemas
from accountant.errors import InvalidRequest, field_error
from accountant.jsonio import JSONInputError, RefusedValue, loads


def _body_bytes() -> bytes:
    """The request body, refused with a 413 when it is over the limit, declared or not."""
    if request.content_length is not None:  # werkzeug refuses a declared length over it
        return request.get_data(cache=False)
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    raw: bytes = request.input_stream.read(limit + 1)  # chunked: read one byte past it
    if len(raw) > limit:
        raise RequestEntityTooLarge()
    return raw


def json_body(schema: dict[str, Any], *, empty_ok: bool = False) -> Any:
    """The request body parsed without binary floats and validated against ``schema``."""
    raw = _body_bytes()
    if not raw.strip():
        if not empty_ok:
            raise InvalidRequest(
                "the request needs a JSON body", errors=[{"field": "", "message": "empty body"}]
            )
        raw = b"{}"
    try:
        body = loads(raw)
    except RefusedValue as error:
        raise field_error(error.field, error.message) from None
    except JSONInputError as error:
        raise InvalidRequest(str(error), errors=[{"field": "", "message": str(error)}]) from None
    schemas.validate(schema, body)
    return body


#: A list body's own item (``items.3``), not a field named items inside one (``params.items.3``).
_ITEM_PATH = re.compile(r"(?<![\w.])items\.(\d+)")


@contextmanager
def items_named() -> Iterator[None]:
    """A list body's 400s inside the block name its items as every other error of a batch
    or plan does: ``items[3].params.epsilon``, not ``items.3.params.epsilon``."""
    try:
        yield
    except InvalidRequest as error:
        error.errors = [
            {k: _ITEM_PATH.sub(r"items[\1]", v) for k, v in e.items()} for e in error.errors or []
        ] or None
        error.detail = _ITEM_PATH.sub(r"items[\1]", error.detail)
        error.args = (error.detail,)
        raise


def int_arg(name: str, default: int, low: int, high: int) -> int:
    """The query argument ``name``: an integer from ``low`` to ``high``, ``default`` if absent."""
    raw = request.args.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19) or not low <= int(raw) <= high:
        raise field_error(name, f"must be an integer from {low} to {high}")
    return int(raw)
