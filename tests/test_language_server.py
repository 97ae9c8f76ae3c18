"""`fsdplint server` driven over stdio by pygls' real language client, as an editor drives it."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pygls")
from lsprotocol import types as lsp  # noqa: E402
from pygls.lsp.client import BaseLanguageClient  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUGGY = textwrap.dedent(
    """\
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def main(model, policy):
        model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
        return model
    """
)
# FSDP015 has a safe fix; it needs torch >= 2.8, which the project's [tool.fsdplint] says.
FIXABLE = textwrap.dedent(
    """\
    from torch.distributed.fsdp import fully_shard
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model, reshard_after_forward=True)
    """
)


def apply(text: str, edits: list) -> str:
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    for e in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        s = offsets[e.range.start.line] + e.range.start.character
        t = offsets[e.range.end.line] + e.range.end.character
        text = text[:s] + e.new_text + text[t:]
    return text


class Editor:
    """A client that opens, edits and asks, and waits for the diagnostics the server publishes."""

    def __init__(self):
        self.client = BaseLanguageClient("test-editor", "1")
        self.published: asyncio.Queue = asyncio.Queue()

        @self.client.feature(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def _diagnostics(params):
            self.published.put_nowait(params)

    async def start(self, root: Path):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        await self.client.start_io(sys.executable, "-m", "fsdplint", "server", env=env, cwd=str(root))
        await self.client.initialize_async(lsp.InitializeParams(
            capabilities=lsp.ClientCapabilities(), root_uri=root.as_uri(),
            workspace_folders=[lsp.WorkspaceFolder(uri=root.as_uri(), name="job")]))
        self.client.initialized(lsp.InitializedParams())

    async def diagnostics(self, uri: str) -> list:
        while True:
            params = await asyncio.wait_for(self.published.get(), timeout=60)
            if params.uri == uri:
                return params.diagnostics

    async def stop(self):
        await self.client.shutdown_async(None)
        self.client.exit(None)
        await self.client.stop()


def session(tmp_path: Path, body):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "job"\n\n[tool.fsdplint]\ntarget-version = { torch = "2.8" }\n')

    async def go():
        editor = Editor()
        await editor.start(tmp_path)
        try:
            await body(editor)
        finally:
            await editor.stop()

    asyncio.run(asyncio.wait_for(go(), timeout=240))


def test_open_a_buggy_script_silence_the_finding_and_see_it_go(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(BUGGY)
    uri = path.as_uri()

    async def body(editor):
        c = editor.client
        c.text_document_did_open(lsp.DidOpenTextDocumentParams(
            text_document=lsp.TextDocumentItem(uri=uri, language_id="python", version=1, text=BUGGY)))
        diags = await editor.diagnostics(uri)
        assert [(d.code, d.range.start.line) for d in diags] == [("FSDP101", 5)]
        assert diags[0].severity == lsp.DiagnosticSeverity.Error and diags[0].source == "fsdplint"

        hover = await c.text_document_hover_async(lsp.HoverParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri), position=lsp.Position(line=5, character=12)))
        assert "FSDP101" in hover.contents.value and "lora-after-fsdp-wrap" in hover.contents.value

        actions = await c.text_document_code_action_async(lsp.CodeActionParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri), range=diags[0].range,
            context=lsp.CodeActionContext(diagnostics=diags)))
        noqa = [a for a in actions if "noqa" in a.title]
        assert len(noqa) == 1
        text = apply(BUGGY, noqa[0].edit.changes[uri])
        assert "# noqa: FSDP101" in text.splitlines()[5]
        c.text_document_did_change(lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[lsp.TextDocumentContentChangeWholeDocument(text=text)]))
        assert list(await editor.diagnostics(uri)) == []

    session(tmp_path, body)


def test_a_fix_is_a_code_action_and_settings_come_from_the_project(tmp_path):
    path = tmp_path / "shard.py"
    path.write_text(FIXABLE)
    uri = path.as_uri()

    async def body(editor):
        c = editor.client
        c.text_document_did_open(lsp.DidOpenTextDocumentParams(
            text_document=lsp.TextDocumentItem(uri=uri, language_id="python", version=1, text=FIXABLE)))
        diags = await editor.diagnostics(uri)
        assert [d.code for d in diags] == ["FSDP015"]
        actions = await c.text_document_code_action_async(lsp.CodeActionParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri), range=diags[0].range,
            context=lsp.CodeActionContext(diagnostics=diags)))
        fixes = [a for a in actions if "noqa" not in a.title]
        assert len(fixes) == 1 and "unsafe" not in fixes[0].title and fixes[0].is_preferred
        text = apply(FIXABLE, fixes[0].edit.changes[uri])
        assert text.splitlines()[3] == "fully_shard(model)"
        c.text_document_did_change(lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[lsp.TextDocumentContentChangeWholeDocument(text=text)]))
        assert list(await editor.diagnostics(uri)) == []

    session(tmp_path, body)
