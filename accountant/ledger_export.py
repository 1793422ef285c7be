"""The ledger as the API and the dashboard serve it: the filter their query strings
state (``parse_filter``) and the export streamed as CSV or as signed JSON Lines
(``stream_export``; ``ledger_file`` verifies such a file offline)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from flask import Response, stream_with_context

from accountant.errors import field_error
from accountant.ledger_readable import terms_of
from accountant.services import ledger, ledger_reads
from accountant.signing import sign
from accountant.web import db, runtime

_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _moment(args: Mapping[str, str], name: str) -> int | None:
    """An RFC 3339 time parameter in microseconds, None when absent; anything else is a 400."""
    raw = args.get(name)
    if raw is None:
        return None
    text = raw.upper()
    try:
        if not _RFC3339.match(text):
            raise ValueError(text)
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise field_error(name, "must be an RFC 3339 time, e.g. 2026-11-21T00:00:00Z") from None
    return int(moment.timestamp() * 1_000_000)


def parse_filter(
    args: Mapping[str, str], default_limit: int = 100, max_limit: int = 1000
) -> ledger.LedgerFilter:
    """The filter a query string states: dataset (a dataset's or a population's chain, by
    name: one namespace, or the admins' chain) and consumer by name, status, since and
    until (RFC 3339), limit and cursor; anything else in one is a 400 naming it."""
    chain = ledger.Chain("all", None, None)
    if (name := args.get("dataset")) is not None:
        chain = ledger_reads.named_chain(db(), name)
    _, consumer_id = ledger_reads.ids_of(db(), None, args.get("consumer"))
    status = args.get("status")
    if status not in (None, "granted", "denied"):
        raise field_error("status", "must be granted or denied")
    limit_raw = args.get("limit", str(default_limit))
    cursor_raw = args.get("cursor", "0")
    # ASCII digits only: "²" and "٣" pass str.isdigit but not int(); 19 digits bound int().
    if not _digits(limit_raw) or not 1 <= int(limit_raw) <= max_limit:
        raise field_error("limit", f"must be an integer from 1 to {max_limit}")
    if not _digits(cursor_raw) or len(cursor_raw) > 18:
        raise field_error("cursor", "must be a next_cursor from an earlier page")
    return ledger.LedgerFilter(
        dataset_id=chain.dataset_id,
        population_id=chain.population_id,
        admin_chain_id=chain.admin_chain_id,
        consumer_id=consumer_id,
        status=status,
        since=_moment(args, "since"),
        until=_moment(args, "until"),
        after_id=int(cursor_raw),
        limit=int(limit_raw),
    )


def _digits(raw: str) -> bool:
    return raw.isascii() and raw.isdigit() and len(raw) <= 19


EXPORT_FIELDS = [
    "id",
    "seq",
    "kind",
    "charge_id",
    "dataset",
    "consumer",
    "status",
    "mechanism",
    "release",
    "partitions",
    "cost",
    "detail",
    "created_at",
    "noise_secret",
    "implementation",
    "prev_hash",
    "hash",
    "params",
    "multiplicity",
    "cost_units",
    "created_at_us",
    "charged",
    "loss_after",
    "reason",
    "hold_id",
    "population",
    "batch_id",
    "group",
]


#: What a spreadsheet reads as the start of a formula (OWASP, "CSV Injection").
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """A CSV cell that a spreadsheet shows as text: a leading formula character is escaped
    with a quote (a partition key or a reason may start with "=")."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def stream_export(args: Mapping[str, str]) -> Response:
    kind = args.get("format", "jsonl")
    if kind not in ("csv", "jsonl"):
        raise field_error("format", "must be csv or jsonl")
    filters = parse_filter(args, default_limit=2**62, max_limit=2**62)
    through, heads = ledger_reads.export_end(db(), filters)
    filters = replace(filters, through_id=through)
    claims = {
        "kind": "ledger-export",
        "through_id": through,
        "heads": heads,
        "filters": {k: v for k, v in args.items() if k not in ("format", "cursor")},
        "iat": runtime().clock.now_us() // 1_000_000,
    }

    def rows() -> Iterator[dict[str, Any]]:
        return ledger_reads.export_rows(db(), filters, heads)

    def lines() -> Iterator[str]:
        if kind == "jsonl":
            yield from _signed_lines(rows(), claims)
            return
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=EXPORT_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows():
            writer.writerow(
                {
                    # JSON's spelling for objects, lists and booleans ("population": true)
                    k: _cell(
                        json.dumps(v, default=float) if isinstance(v, dict | list | bool) else v
                    )
                    for k, v in row.items()
                }
            )
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
        yield buffer.getvalue()

    mimetype = "text/csv" if kind == "csv" else "application/x-ndjson"
    response = Response(stream_with_context(lines()), mimetype=mimetype)
    response.headers["Content-Disposition"] = f"attachment; filename=ledger.{kind}"
    # the chain heads at the export's last entry, signed with the receipt key (docs/ledger.md)
    response.headers["Accountant-Export-Signature"] = header_signature(claims)
    return response


#: The longest ``Accountant-Export-Signature`` that names every head: proxies and clients
#: refuse a response whose headers outgrow a buffer (nginx's proxy_buffer_size, 4 or 8 KiB
#: by default, 16 KiB in deploy/nginx.conf; httpx 100 KiB), and each chain adds about 120
#: bytes.
HEADER_LIMIT = 8 * 1024


def header_signature(claims: dict[str, Any]) -> str:
    """The export's claims signed for its header: with ``heads`` as they are while the
    header stays within ``HEADER_LIMIT``, else with ``heads_sha256`` in their place, the
    SHA-256 of ``heads`` as JSON with sorted keys and no spaces (docs/ledger.md, "A signed
    export"). The JSON Lines' last line names every head, however many."""
    signed = sign(runtime().signer, claims)
    if len(signed) <= HEADER_LIMIT:
        return signed
    heads = json.dumps(claims["heads"], sort_keys=True, separators=(",", ":"))
    compact = {k: v for k, v in claims.items() if k != "heads"}
    compact["heads_sha256"] = hashlib.sha256(heads.encode()).hexdigest()
    return sign(runtime().signer, compact)


def _signed_lines(rows: Iterator[dict[str, Any]], claims: dict[str, Any]) -> Iterator[str]:
    """The JSON Lines of ``rows``; the last one also carries ``export_signature``, the claims
    signed with what the export holds of each chain, a dataset's or a population's, by its
    name (``contents``: how many entries, and the last one's seq and hash), so that a copy
    of the file alone shows a line deleted at its end (``accountant ledger verify
    --file``)."""
    contents: dict[str, dict[str, Any]] = {}
    held = None
    for row in rows:
        if held is not None:
            yield json.dumps(held, default=float, separators=(",", ":")) + "\n"
        counted = contents.setdefault(row["dataset"], {"entries": 0})
        counted.update(entries=counted["entries"] + 1, seq=row["seq"], hash=row["hash"])
        held = row
    if held is not None:
        owners = ledger_reads.Owners(db())
        for group in (owners.datasets, owners.populations, owners.admin_chains):
            for owner in group.values():
                if owner.name in contents:
                    delta = owner.limit_delta or 0
                    contents[owner.name]["terms"] = terms_of(owner.mode, delta)
        held["export_signature"] = sign(runtime().signer, {**claims, "contents": contents})
        yield json.dumps(held, default=float, separators=(",", ":")) + "\n"
