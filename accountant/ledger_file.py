"""Verifying a JSON Lines ledger export offline: no database, no network, the standard library.

Each line carries every field its hash covers, in the exact form the hash uses
(``docs/ledger.md``). Per dataset the lines must form one contiguous run of ``seq``, in
order; each line's ``prev_hash`` must be the previous line's ``hash`` (for ``seq`` 1, 64
zeros), and each ``hash`` must be the SHA-256 of ``prev_hash`` and the entry's canonical
form. An export filtered by dataset or by time is such a run (a segment of the chain, whose
first ``prev_hash`` is taken as given unless it starts at ``seq`` 1); one filtered by status
or consumer has gaps and does not verify.
"""

from __future__ import annotations

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
    for name in ("noise_secret", "implementation"):
        if line.get(name) is not None:
            content[name] = line[name]
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class FileVerification:
    ok: bool = True
    lines: int = 0
    #: dataset -> (first seq, last seq, last hash) of its verified segment
    segments: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    problem: str | None = None


def verify_lines(lines: Iterable[str]) -> FileVerification:
    """Check every line of an export; stop at the first bad one, naming it."""
    result = FileVerification()
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            name, seq = line["dataset"], line["seq"]
            digest = hashlib.sha256(line["prev_hash"].encode() + canonical(line)).hexdigest()
        except (ValueError, KeyError, TypeError) as error:
            return _bad(
                result,
                f"line {number} is not a ledger entry of this version "
                f"({type(error).__name__}: {error})",
            )
        where = f"line {number} (dataset {name!r}, seq {seq})"
        previous = result.segments.get(name)
        if previous is None and seq == 1 and line["prev_hash"] != GENESIS:
            return _bad(result, f"{where}: the first entry must follow 64 zeros")
        if previous is not None and seq != previous[1] + 1:
            return _bad(
                result,
                f"{where}: expected seq {previous[1] + 1} (a line deleted, "
                "inserted or moved, or the export filtered with gaps)",
            )
        if previous is not None and line["prev_hash"] != previous[2]:
            return _bad(result, f"{where}: prev_hash is not the previous entry's hash")
        if digest != line["hash"]:
            return _bad(result, f"{where}: the entry does not match its hash (edited)")
        result.segments[name] = (previous[0] if previous else seq, seq, digest)
        result.lines += 1
    return result


def _bad(result: FileVerification, problem: str) -> FileVerification:
    result.ok, result.problem = False, problem
    return result
