"""Reading a file as text without losing what `--fix` must write back (encoding, BOM, newlines)."""

from __future__ import annotations

import io
import re
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


# Byte-order marks of encodings Python cannot read source in (longest first: UTF-32 LE starts like UTF-16 LE).
_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32 LE", "FF FE 00 00"),
    (b"\x00\x00\xfe\xff", "UTF-32 BE", "00 00 FE FF"),
    (b"\xff\xfe", "UTF-16 LE", "FF FE"),
    (b"\xfe\xff", "UTF-16 BE", "FE FF"),
)
# Magic numbers of the binary files that end up where a script is expected.
_MAGIC = (
    (b"PK\x03\x04", "a ZIP archive (a torch.save checkpoint, a wheel or a .zip)"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\x7fELF", "an ELF executable or shared library"),
    (b"\x1f\x8b", "a gzip file"),
    (b"GGUF", "a GGUF model file"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"%PDF-", "a PDF document"),
    (b"\x93NUMPY", "a NumPy .npy array"),
)
_SAMPLE = 8192


def describe_non_text(data: bytes) -> Optional[str]:
    """What the file is, when it is not text in an encoding Python source can use (None for text)."""
    for bom, name, shown in _BOMS:
        if data.startswith(bom):
            return (f"the file is {name} text (byte-order mark {shown}); Python source must be UTF-8 or an "
                    "ASCII-compatible encoding named in a coding cookie: save it as UTF-8")
    head = data[:_SAMPLE]
    if b"\x00" not in head:
        return _not_utf8(data, head)
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"not a source file: the content is {what}, binary data where Python code was expected"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "not a source file: the content is a Python pickle (e.g. a legacy torch.save file), binary data"
    if len(head) >= 10 and head[8:10] == b'{"' and 0 < int.from_bytes(head[:8], "little") < len(data):
        return "not a source file: the content is a safetensors file (binary tensors)"
    pairs = len(head) // 2
    if pairs >= 2:
        for parity, order in ((1, "LE"), (0, "BE")):
            zeros = sum(1 for i in range(parity, 2 * pairs, 2) if head[i] == 0)
            if zeros >= 0.9 * pairs and head[1 - parity::2].count(0) < 0.1 * pairs:
                return (f"the file looks like UTF-16 {order} text without a byte-order mark (every other byte is "
                        "NUL); Python source must be UTF-8: save it as UTF-8")
    control = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13))
    try:
        head.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError as e:
        utf8 = e.start >= len(head) - 3 and len(head) == _SAMPLE  # only a character cut at the sample's end
    if not utf8 or control > 0.1 * len(head):
        share = round(100 * control / len(head))
        return (f"not a source file: binary data (NUL bytes, {share}% control bytes in the first {len(head)} bytes"
                + ("" if utf8 else ", not UTF-8") + ")")
    return None


_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+", re.M)


def _not_utf8(data: bytes, head: bytes) -> Optional[str]:
    """A file without NUL bytes that is mostly control or high bytes and not UTF-8: binary data."""
    try:
        data.decode("utf-8")
        return None
    except UnicodeDecodeError:
        pass
    if _COOKIE.search(b"\n".join(data.split(b"\n", 2)[:2])):
        return None  # an encoding is declared: decoding with it decides
    odd = sum(1 for b in head if (b < 32 and b not in (9, 10, 12, 13)) or b >= 0x80)
    if odd <= 0.3 * len(head):
        return None  # text in some other encoding: `decode` says where
    return (f"not a source file: binary data ({round(100 * odd / len(head))}% control or non-ASCII bytes in the "
            f"first {len(head)} bytes, not UTF-8)")


def _undeclared(data: bytes) -> Optional[SourceError]:
    """Text that is not UTF-8 and names no encoding: where the first byte UTF-8 cannot read is."""
    try:
        data.decode("utf-8")
        return None
    except UnicodeDecodeError as e:
        bad = e.start
    line = data.count(b"\n", 0, bad) + 1
    return SourceError(f"the file is not UTF-8 (byte 0x{data[bad]:02X} on line {line}) and declares no encoding: save "
                       "it as UTF-8, or name its encoding in a coding cookie (`# -*- coding: latin-1 -*-`) on line 1 or 2",
                       line)


def decode(data: bytes) -> SourceFile:
    what = describe_non_text(data)
    if what is not None:
        raise SourceError(what, 1)
    bom = data.startswith(b"\xef\xbb\xbf")
    body = data[3:] if bom else data
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:
        if not _COOKIE.search(b"\n".join(data.split(b"\n", 2)[:2])):
            err = _undeclared(data)
            if err is not None:
                raise err from None
        raise SourceError(f"bad encoding declaration: {e.msg if hasattr(e, 'msg') else e}", 1) from None
    if encoding == "utf-8-sig":
        encoding = "utf-8"
    try:
        text = body.decode(encoding)
    except (UnicodeDecodeError, LookupError) as e:
        row = None
        if isinstance(e, UnicodeDecodeError):
            row = body[: e.start].count(b"\n") + 1
            if encoding == "utf-8" and not _COOKIE.search(b"\n".join(data.split(b"\n", 2)[:2])):
                raise _undeclared(body) or SourceError(f"cannot decode the file as {encoding}", row) from None
        raise SourceError(f"cannot decode the file as {encoding}", row) from None
    return SourceFile(text, encoding, bom)
