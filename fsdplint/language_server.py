"""`fsdplint server`: a Language Server over stdio (pygls), for editors with a generic LSP client.

Diagnostics are published on open, change and save; each file is linted with the project view (the
workspace's other modules, launchers and configs are read from disk) and the `[tool.fsdplint]` settings
that apply to it. Code actions offer each finding's fix (an unsafe one says so) and a `# noqa` comment;
hover on a flagged line shows the rule's documentation.
"""

from __future__ import annotations

import re
from typing import Optional
from urllib.parse import unquote, urlparse

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer

from fsdplint import __version__
from fsdplint.findings import Applicability, Finding, Severity

_SEVERITY = {Severity.ERROR: lsp.DiagnosticSeverity.Error, Severity.WARNING: lsp.DiagnosticSeverity.Warning,
             Severity.INFO: lsp.DiagnosticSeverity.Information}
_NOQA = re.compile(r"#\s*noqa:\s*(?P<codes>[A-Za-z]+[0-9]+(?:\s*,\s*[A-Za-z]+[0-9]+)*)", re.I)


def _path(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


def _range(f: Finding) -> lsp.Range:
    start = lsp.Position(line=max(f.start.row - 1, 0), character=max(f.start.column - 1, 0))
    end = lsp.Position(line=max(f.end.row - 1, 0), character=max(f.end.column - 1, 0))
    if (end.line, end.character) < (start.line, start.character):
        end = start
    return lsp.Range(start=start, end=end)


class FsdplintServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("fsdplint", __version__)
        self.findings: dict[str, list[Finding]] = {}  # uri → the last run's findings

    def lint(self, uri: str) -> None:
        from fsdplint.engine import Settings, lint_file

        doc = self.workspace.get_text_document(uri)
        filename = _path(uri)
        if filename.endswith(".ipynb"):
            return  # a notebook's text here is its JSON; the editor's notebook sync is not spoken
        res = lint_file(filename, Settings(), text=doc.source)
        self.findings[uri] = res.findings
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
            uri=uri, version=doc.version,
            diagnostics=[self.diagnostic(f) for f in res.findings]))

    @staticmethod
    def diagnostic(f: Finding) -> lsp.Diagnostic:
        return lsp.Diagnostic(
            range=_range(f), message=f.message, severity=_SEVERITY[f.severity], code=f.code, source="fsdplint",
            code_description=lsp.CodeDescription(href=f.url),
            related_information=[
                lsp.DiagnosticRelatedInformation(
                    location=lsp.Location(uri=f"file://{r.filename}", range=_range(r)), message=r.message)
                for r in f.related if r.filename.startswith("/")] or None,
        )


server = FsdplintServer()


@server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
def _did_open(ls: FsdplintServer, params: lsp.DidOpenTextDocumentParams) -> None:
    ls.lint(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
def _did_change(ls: FsdplintServer, params: lsp.DidChangeTextDocumentParams) -> None:
    ls.lint(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
def _did_save(ls: FsdplintServer, params: lsp.DidSaveTextDocumentParams) -> None:
    ls.lint(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
def _did_close(ls: FsdplintServer, params: lsp.DidCloseTextDocumentParams) -> None:
    ls.findings.pop(params.text_document.uri, None)
    ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


def _overlaps(f: Finding, rng: lsp.Range) -> bool:
    return f.start.row - 1 <= rng.end.line and f.end.row - 1 >= rng.start.line


@server.feature(lsp.TEXT_DOCUMENT_CODE_ACTION,
                lsp.CodeActionOptions(code_action_kinds=[lsp.CodeActionKind.QuickFix]))
def _code_actions(ls: FsdplintServer, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
    uri = params.text_document.uri
    lines = ls.workspace.get_text_document(uri).source.splitlines()
    actions = []
    for f in ls.findings.get(uri, []):
        if not _overlaps(f, params.range):
            continue
        diag = [FsdplintServer.diagnostic(f)]
        if f.fix is not None and f.fix.edits:
            unsafe = f.fix.applicability == Applicability.UNSAFE
            edits = [lsp.TextEdit(range=lsp.Range(start=lsp.Position(line=e.start.row - 1, character=e.start.column - 1),
                                                  end=lsp.Position(line=e.end.row - 1, character=e.end.column - 1)),
                                  new_text=e.content) for e in f.fix.edits]
            actions.append(lsp.CodeAction(
                title=f"{f.code}: {f.fix.message}" + (" (unsafe: may change behaviour)" if unsafe else ""),
                kind=lsp.CodeActionKind.QuickFix, diagnostics=diag, is_preferred=not unsafe,
                edit=lsp.WorkspaceEdit(changes={uri: edits})))
        noqa = _noqa_edit(lines, f)
        if noqa is not None:
            actions.append(lsp.CodeAction(title=f"{f.code}: silence with # noqa on this line",
                                          kind=lsp.CodeActionKind.QuickFix, diagnostics=diag,
                                          edit=lsp.WorkspaceEdit(changes={uri: [noqa]})))
    return actions


def _noqa_edit(lines: list[str], f: Finding) -> Optional[lsp.TextEdit]:
    """Append `# noqa: CODE` to the finding's line, or add the code to the noqa comment already there."""
    row = f.start.row - 1
    if not 0 <= row < len(lines):
        return None
    line = lines[row]
    m = _NOQA.search(line)
    if m:
        at = lsp.Position(line=row, character=m.end("codes"))
        return lsp.TextEdit(range=lsp.Range(start=at, end=at), new_text=f", {f.code}")
    at = lsp.Position(line=row, character=len(line))
    return lsp.TextEdit(range=lsp.Range(start=at, end=at), new_text=f"  # noqa: {f.code}")


@server.feature(lsp.TEXT_DOCUMENT_HOVER)
def _hover(ls: FsdplintServer, params: lsp.HoverParams) -> Optional[lsp.Hover]:
    from fsdplint.registry import get_rule

    docs = []
    for f in ls.findings.get(params.text_document.uri, []):
        if f.start.row - 1 <= params.position.line <= f.end.row - 1:
            rule = get_rule(f.code)
            docs.append(rule.full_doc() if rule is not None else f"{f.code}: {f.message}")
    if not docs:
        return None
    return lsp.Hover(contents=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value="\n\n---\n\n".join(docs)))


def serve() -> None:
    server.start_io()
