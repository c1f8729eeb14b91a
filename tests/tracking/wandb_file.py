"""Read the records of a W&B run file (``run-<id>.wandb``) for the tests.

wandb 0.2x+ no longer ships a Python reader (its Go core writes the file). The file is LevelDB's
log format (32 KiB blocks; each record chunk: crc32c (4), length (2), type (1: full, 2: first,
3: middle, 4: last)) behind a 7-byte header ``":W&B"``, magic ``0xBEE1``, version 0; every record
is a ``wandb_internal_pb2.Record`` protobuf, parsed here with wandb's own message class.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32 * 1024
HEADER = 7


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    pos, buf = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:  # zero padding to the block end
            pos += left
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec
            buf = b""


def history(path: Path) -> list[dict[str, Any]]:
    """The logged rows (``run.log``), each a dict with ``_step`` and the metrics."""
    rows = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append({(it.key or "/".join(it.nested_key)): json.loads(it.value_json) for it in rec.history.item})
    return rows


def config(path: Path) -> dict[str, Any]:
    """The run's config (``wandb.init(config=...)``: in the run record, or later config records)."""
    out: dict[str, Any] = {}
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        updates = rec.run.config.update if kind == "run" else rec.config.update if kind == "config" else []
        for it in updates:
            out[it.key or "/".join(it.nested_key)] = json.loads(it.value_json)
    return out
