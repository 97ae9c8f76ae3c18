"""The report format shared by the static linter, the model audit and the runtime guard."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

DOCS_URL = "https://github.com/fsdplint/fsdplint/blob/main/docs/rules/{code}.md"


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 0, "warning": 1, "info": 2}[self.value]


class Applicability(str, Enum):
    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True, order=True)
class Position:
    """1-based row, 1-based column (as ruff's json output)."""

    row: int
    column: int


@dataclass(frozen=True)
class Edit:
    """Replace the text between `start` and `end` (end exclusive) with `content`."""

    content: str
    start: Position
    end: Position

    def to_json(self) -> dict:
        return {
            "content": self.content,
            "location": {"row": self.start.row, "column": self.start.column},
            "end_location": {"row": self.end.row, "column": self.end.column},
        }


@dataclass(frozen=True)
class Fix:
    applicability: Applicability
    message: str
    edits: tuple[Edit, ...]

    def to_json(self) -> dict:
        return {
            "applicability": self.applicability.value,
            "message": self.message,
            "edits": [e.to_json() for e in self.edits],
        }


@dataclass(frozen=True)
class Related:
    """Another place a finding depends on, e.g. the wrap in another module of the project."""

    filename: str
    start: Position
    end: Position
    message: str

    def to_json(self) -> dict:
        return {"filename": self.filename, "location": {"row": self.start.row, "column": self.start.column},
                "end_location": {"row": self.end.row, "column": self.end.column}, "message": self.message}

    def text(self) -> str:
        return f"{self.filename}:{self.start.row}:{self.start.column}: {self.message}"


@dataclass
class Finding:
    code: str
    name: str
    severity: Severity
    filename: str
    start: Position
    end: Position
    message: str
    fix: Optional[Fix] = None
    # Source line text, for `full` output and baselines; filled by the engine.
    source_line: str = ""
    # Extra facts a finding depends on, e.g. {"torch": "2.6 (from pyproject.toml)"}.
    notes: dict = field(default_factory=dict)
    # The other half of a finding that spans files (SARIF relatedLocations, a second line in text output).
    related: list = field(default_factory=list)
    # A notebook's code cell (1-based, counting every cell); `start`/`end` rows are then rows of that cell.
    cell: Optional[int] = None

    @property
    def url(self) -> str:
        return DOCS_URL.format(code=self.code)

    def sort_key(self):
        return (self.filename, self.cell or 0, self.start.row, self.start.column, self.code)

    @property
    def where(self) -> str:
        """`path:row:col`, or `nb.ipynb:cell 3:row:col` in a notebook (as ruff prints them)."""
        cell = f"cell {self.cell}:" if self.cell is not None else ""
        return f"{self.filename}:{cell}{self.start.row}:{self.start.column}"

    def to_json(self) -> dict:
        out = {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "filename": self.filename,
            "location": {"row": self.start.row, "column": self.start.column},
            "end_location": {"row": self.end.row, "column": self.end.column},
            "message": self.message,
            "url": self.url,
            "fix": self.fix.to_json() if self.fix else None,
        }
        if self.cell is not None:
            out["cell"] = self.cell
        if self.related:
            out["related"] = [r.to_json() for r in self.related]
        return out


def finding_from_json(d: dict) -> Finding:
    fix = None
    if d.get("fix"):
        f = d["fix"]
        fix = Fix(
            Applicability(f["applicability"]),
            f["message"],
            tuple(
                Edit(
                    e["content"],
                    Position(e["location"]["row"], e["location"]["column"]),
                    Position(e["end_location"]["row"], e["end_location"]["column"]),
                )
                for e in f["edits"]
            ),
        )
    return Finding(
        code=d["code"],
        name=d["name"],
        severity=Severity(d["severity"]),
        filename=d["filename"],
        start=Position(d["location"]["row"], d["location"]["column"]),
        end=Position(d["end_location"]["row"], d["end_location"]["column"]),
        message=d["message"],
        fix=fix,
        related=[Related(r["filename"], Position(r["location"]["row"], r["location"]["column"]),
                         Position(r["end_location"]["row"], r["end_location"]["column"]), r["message"])
                 for r in d.get("related", ())],
        cell=d.get("cell"),  # a notebook's finding: its rows are the cell's
    )
