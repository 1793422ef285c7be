"""Verifying a JSON Lines ledger export offline: no database, no network, the standard library.

Each line carries every field its hash covers, in the exact form the hash uses
(``docs/ledger.md``). Per dataset the lines must form one contiguous run of ``seq``, in
order; each line's ``prev_hash`` must be the previous line's ``hash`` (for ``seq`` 1, 64
zeros), and each ``hash`` must be the SHA-256 of ``prev_hash`` and the entry's canonical
form. An export filtered by dataset or by time is such a run (a segment of the chain, whose
first ``prev_hash`` is taken as given unless it starts at ``seq`` 1); one filtered by status
or consumer has gaps and does not verify.

The links show a line edited, inserted, moved or deleted between two others, but not one
deleted at the end of a dataset's run, nor at the start of a segment. The export's last
line carries ``export_signature``, a JWS whose claims say what the export holds of each
dataset (``contents``: how many entries, the last one's seq and hash) and how far each chain
went (``heads``); ``check_claims`` holds the lines to them. Whether the service signed them
is ``accountant.signing.verify``'s question, given its public keys.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

GENESIS = "0" * 64


def canonical(line: dict[str, Any]) -> bytes:
    """The bytes an exported entry's hash covers."""
    content = {
        name: line[name]
        for name in (
            "seq",
            "kind",
            "charge_id",
            "dataset",
            "consumer",
            "status",
            "mechanism",
            "release",
            "partitions",
            "params",
            "multiplicity",
        )
    }
    content["cost"] = line["cost_units"]
    content["detail"] = line["detail"] if line["detail"] is not None else {}
    content["created_at"] = line["created_at_us"]
    for name in ("noise_secret", "implementation", "hold_id"):
        if line.get(name) is not None:
            content[name] = line[name]
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Segment:
    """A dataset's lines in an export: the first and last seq, the last hash, how many."""

    first: int
    last: int
    hash: str
    entries: int


@dataclass
class FileVerification:
    ok: bool = True
    lines: int = 0
    #: dataset -> its verified lines
    segments: dict[str, Segment] = field(default_factory=dict)
    problem: str | None = None
    #: the export's signature (a JWS), from its last line; None if it carries none
    signature: str | None = None


def verify_lines(lines: Iterable[str]) -> FileVerification:
    """Check every line of an export; stop at the first bad one, naming it."""
    result = FileVerification()
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        if result.signature is not None:
            return _bad(result, f"line {number} follows the line that carries the signature")
        try:
            line = json.loads(text)
            name, seq = line["dataset"], line["seq"]
            digest = hashlib.sha256(line["prev_hash"].encode() + canonical(line)).hexdigest()
        except (ValueError, KeyError, TypeError) as error:
            return _bad(
                result,
                f"line {number} is not a ledger entry of this version "
                f"({type(error).__name__}: {error}); --file takes the JSON Lines export "
                "(GET /v1/ledger/export?format=jsonl), not the CSV one",
            )
        where = f"line {number} (dataset {name!r}, seq {seq})"
        previous = result.segments.get(name)
        if previous is None and seq == 1 and line["prev_hash"] != GENESIS:
            return _bad(result, f"{where}: the first entry must follow 64 zeros")
        if previous is not None and seq != previous.last + 1:
            return _bad(
                result,
                f"{where}: expected seq {previous.last + 1} (a line deleted, "
                "inserted or moved, or the export filtered with gaps)",
            )
        if previous is not None and line["prev_hash"] != previous.hash:
            return _bad(result, f"{where}: prev_hash is not the previous entry's hash")
        if digest != line["hash"]:
            return _bad(result, f"{where}: the entry does not match its hash (edited)")
        first, entries = (previous.first, previous.entries) if previous else (seq, 0)
        result.segments[name] = Segment(first, seq, digest, entries + 1)
        result.lines += 1
        result.signature = line.get("export_signature")
    return result


def claims_of(token: str) -> dict[str, Any]:
    """The claims of a JWS compact token, read without checking its signature."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError) as error:
        raise ValueError(f"the export's signature is not a JWS ({error})") from None
    if not isinstance(claims, dict):
        raise ValueError("the export's signature holds no claims object")
    return claims


def check_claims(result: FileVerification, claims: dict[str, Any]) -> str | None:
    """The first difference between the verified lines and what the export's signed
    ``claims`` say it holds, or None. Each dataset's run must end at the signed seq and hash
    with the signed number of entries; a dataset's run may not be missing, nor one added."""
    contents = claims.get("contents")
    if claims.get("kind") != "ledger-export" or not isinstance(contents, dict):
        return "the signature is not an export's (no kind 'ledger-export' with contents)"
    try:
        return _difference(result, contents)
    except (KeyError, TypeError):
        return "the signature's contents are not an export's (each dataset: entries, seq, hash)"


def _difference(result: FileVerification, contents: dict[str, Any]) -> str | None:
    for name, held in sorted(contents.items()):
        found = result.segments.get(name)
        if found is None:
            return (
                f"dataset {name!r}: the export has no line of it, but its signature says it "
                f"holds {held['entries']} entries up to seq {held['seq']} (lines deleted?)"
            )
        if (found.last, found.hash) != (held["seq"], held["hash"]):
            return (
                f"dataset {name!r}: the lines end at seq {found.last}, but the signature says "
                f"they end at seq {held['seq']} with hash {held['hash']} "
                + ("(truncated: lines deleted at its end)" if found.last < held["seq"] else "")
            ).rstrip()
        if found.entries != held["entries"]:
            return (
                f"dataset {name!r}: {found.entries} lines, but the signature says "
                f"{held['entries']} (lines deleted at its start?)"
            )
    added = sorted(set(result.segments) - set(contents))
    if added:
        return f"dataset {added[0]!r}: the signature says the export holds none of its lines"
    return None


def _bad(result: FileVerification, problem: str) -> FileVerification:
    result.ok, result.problem = False, problem
    return result
