"""Reading a file as text without losing what `--fix` must write back (encoding, BOM, newlines)."""

from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass
from typing import Optional


class SourceError(Exception):
    """The file cannot be read or decoded; `row` when known."""

    def __init__(self, message: str, row: Optional[int] = None) -> None:
        super().__init__(message)
        self.row = row


@dataclass
class SourceFile:
    text: str
    encoding: str
    bom: bool

    def encode(self, text: str) -> bytes:
        data = text.encode(self.encoding)
        return (b"\xef\xbb\xbf" + data) if self.bom else data


def decode(data: bytes) -> SourceFile:
    bom = data.startswith(b"\xef\xbb\xbf")
    body = data[3:] if bom else data
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:
        raise SourceError(f"bad encoding declaration: {e.msg if hasattr(e, 'msg') else e}", 1) from None
    if encoding == "utf-8-sig":
        encoding = "utf-8"
    try:
        text = body.decode(encoding)
    except (UnicodeDecodeError, LookupError) as e:
        row = None
        if isinstance(e, UnicodeDecodeError):
            row = body[: e.start].count(b"\n") + 1
        raise SourceError(f"cannot decode the file as {encoding}", row) from None
    return SourceFile(text, encoding, bom)
