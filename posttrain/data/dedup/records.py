"""Records in and out for dedup: raw JSONL line batches (parsed in the workers), Parquet record
batches, and the text to deduplicate on for plain, chat and preference records.

Text keys (``--key``), chosen through :data:`TEXT_KEYS`:

- ``text``          the ``--text-field`` string (default ``text``)
- ``prompt``        chat: all messages before the last assistant turn; preference/completion: ``prompt``
- ``response``      chat: the last assistant turn; ``completion``; preference: ``chosen`` + ``rejected``
- ``conversation``  everything: all messages, or prompt + completion / chosen + rejected
- ``auto``          ``text`` if the field is there, else ``conversation``

A ``prompt`` may itself be a list of messages (TRL's conversational format). Messages are rendered
as ``role: content`` lines, so the same words said by a different role do not match.

Not handled: nested multimodal content parts other than ``{"type": "text", "text": ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from posttrain.errors import ConfigError, DataError
from posttrain.text import printable


def _content(c: Any) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # content parts
        return "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in c)
    if c is None:
        return ""
    raise ValueError(f"message content of type {type(c).__name__}")


def _render(x: Any) -> str:
    """A string, or a list of {role, content} messages rendered as 'role: content' lines."""
    if isinstance(x, str):
        return x
    if isinstance(x, list):
        out = []
        for m in x:
            if not isinstance(m, dict) or "content" not in m:
                raise ValueError("messages must be objects with 'role' and 'content'")
            out.append(f"{m.get('role', '')}: {_content(m['content'])}")
        return "\n".join(out)
    if isinstance(x, dict) and "content" in x:
        return _render([x])
    raise ValueError(f"expected a string or a list of messages, got {type(x).__name__}")


def _split_chat(msgs: list) -> tuple[list, list]:
    last = max((i for i, m in enumerate(msgs) if isinstance(m, dict) and m.get("role") == "assistant"), default=None)
    if last is None:
        return msgs, []
    return msgs[:last], msgs[last:]


def _fields_of(rec: dict) -> str:
    names = [repr(printable(k, 40)) for k in list(rec)[:6]]
    return (", ".join(names) + (", ..." if len(rec) > 6 else "")) if names else "none"


def _key_text(rec: dict, key: str, text_field: str) -> str:
    auto = key == "auto"
    if auto:
        key = "text" if text_field in rec else "conversation"
    if key == "text":
        if text_field not in rec:
            raise ValueError(f"missing field {text_field!r} (--text-field); the record has fields {_fields_of(rec)}")
        v = rec[text_field]
        if not isinstance(v, str):
            raise ValueError(f"field {text_field!r} is {type(v).__name__}, expected a string")
        return v
    if "messages" in rec:
        msgs = rec["messages"]
        if not isinstance(msgs, list):
            raise ValueError("'messages' must be a list")
        prompt, response = _split_chat(msgs)
        parts = {"prompt": prompt, "response": response, "conversation": msgs}[key]
        return _render(parts)
    if "prompt" in rec and ("chosen" in rec or "rejected" in rec):
        resp = "\n".join(_render(rec[k]) for k in ("chosen", "rejected") if k in rec)
    elif "prompt" in rec and "completion" in rec:
        resp = _render(rec["completion"])
    elif auto:
        raise ValueError(
            f"no text field {text_field!r} (--text-field) and no chat/preference fields ('messages', "
            f"'prompt'+'completion' or 'prompt'+'chosen'/'rejected'); the record has fields "
            f"{_fields_of(rec)}: pass --text-field NAME to deduplicate on one of them"
        )
    else:
        raise ValueError(
            f"--key {key} needs 'messages', 'prompt'+'completion' or 'prompt'+'chosen'/'rejected'; the "
            f"record has fields {_fields_of(rec)} (--key text --text-field NAME reads a plain text field)"
        )
    prompt = _render(rec["prompt"])
    return {"prompt": prompt, "response": resp, "conversation": prompt + "\n" + resp}[key]


TEXT_KEYS = ("auto", "text", "prompt", "response", "conversation")


def record_text(rec: dict, key: str = "auto", text_field: str = "text") -> str:
    """The text to deduplicate on; raises ValueError (a bad record) when the record lacks it."""
    if key not in TEXT_KEYS:
        raise ConfigError(f"key={key!r} is not valid; choose one of: {', '.join(TEXT_KEYS)}")
    return _key_text(rec, key, text_field)


def parse_line(raw: bytes) -> tuple[dict | None, str | None]:
    """(record, None) for a JSON-object line, (None, reason) otherwise; mirrors ``io.iter_jsonl``."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not valid UTF-8 ({e.reason})"
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at column {e.colno})"
    except (ValueError, RecursionError) as e:  # an integer of > 4300 digits; nesting too deep
        return None, "not valid JSON (" + (
            "nested too deeply" if isinstance(e, RecursionError) else str(e).split(":")[0].lower()
        ) + ")"
    if not isinstance(rec, dict):
        return None, f"expected a JSON object, got {type(rec).__name__}"
    return rec, None


def file_format(path: str | Path) -> str:
    s = str(path).lower()
    if s.endswith(".parquet") or s.endswith(".pq"):
        return "parquet"
    return "jsonl"


def iter_raw_batches(path: str | Path, batch_size: int) -> Iterator[list[tuple[int, Any]]]:
    """Batches of ``(line_no, raw)`` for JSONL (raw = bytes, blank lines skipped) or
    ``(row_no, record)`` for Parquet (1-based), streamed without holding the file."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data file not found: {p}")
    if p.is_dir():
        raise DataError(f"{p} is a directory, expected a JSONL or Parquet file")
    if file_format(p) == "parquet":
        import pyarrow.parquet as pq

        row = 0
        for rb in pq.ParquetFile(p).iter_batches(batch_size=batch_size):
            recs = rb.to_pylist()
            yield [(row + i + 1, r) for i, r in enumerate(recs)]
            row += len(recs)
        return
    batch = []
    with open(p, "rb") as fh:
        for line_no, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            batch.append((line_no, raw))
            if len(batch) >= batch_size:
                yield batch
                batch = []
    if batch:
        yield batch
