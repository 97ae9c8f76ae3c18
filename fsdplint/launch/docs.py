"""The shell commands a project documents: fenced blocks of Markdown and code blocks of reStructuredText.

Most projects write the launch command in README.md or docs/ (`accelerate launch --config_file
recipes/fsdp.yaml scripts/run_sft.py recipes/config_qlora.yaml`) rather than in a run.sh. The text kept
is the blocks' shell lines in place and every other line blanked, so a launch read from it keeps the
line of the document it sits on. Kept free of imports: the launcher search uses it.
"""

from __future__ import annotations

import re

# Info strings of blocks that hold shell commands (console blocks hold `$ ` prompts and their output).
_SHELL_TAGS = {"bash", "sh", "shell", "zsh", "console", "shell-session", "shellsession", "terminal", "text", ""}
_PROMPTED_TAGS = {"console", "shell-session", "shellsession", "terminal"}
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*\{?\.?([A-Za-z0-9_+-]*)")
_RST_BLOCK = re.compile(r"^(\s*)\.\.\s+(?:code-block|code|sourcecode|prompt)::\s*([A-Za-z0-9_+-]*)")
_PROMPT = re.compile(r"^\s*(?:\([^)\s]*\)\s*)?[$%]\s+(.*)$")
# An untagged block counts only when it holds a launcher command.
_LAUNCHER = re.compile(r"(?:^|[\s;&|(])(?:accelerate(?:\s+launch|-launch)|torchrun|python[0-9.]*\s+(?:-m\s+\S+|\S+\.py))")
DOC_SUFFIXES = (".md", ".markdown", ".rst", ".mdx")
JOB_SUFFIXES = (".yaml", ".yml")
# A job file whose top-level `run:` key is a block of shell text (SkyPilot's task YAML, and the like).
_RUN_KEY = re.compile(r"^run:\s*[|>][-+0-9]*\s*$")


def _block_lines(body: list[str], tag: str) -> list[str]:
    prompted = tag in _PROMPTED_TAGS or any(_PROMPT.match(l) for l in body)
    out = []
    for line in body:
        m = _PROMPT.match(line)
        if m:
            out.append(m.group(1))
        elif prompted:
            # Output of a console session, unless it continues the command above (`\` at its end).
            out.append(line if out and out[-1].rstrip().endswith("\\") else "")
        else:
            out.append(line)
    return out


def shell_text(text: str, rst: bool = False) -> str:
    """The documented shell commands of a Markdown or reStructuredText text, every other line blank."""
    lines = text.splitlines()
    out = [""] * len(lines)
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line) if not rst else None
        block = _RST_BLOCK.match(line) if rst else None
        if fence:
            mark, tag = fence.group(2), fence.group(3).lower()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(mark[0] * len(mark)):
                j += 1
            body = lines[i + 1:j]
            if tag in _SHELL_TAGS and (tag or any(_LAUNCHER.search(l) for l in body)):
                out[i + 1:j] = _block_lines(body, tag)
            i = j + 1
            continue
        if block or (rst and line.rstrip().endswith("::") and not line.lstrip().startswith("..")):
            tag = block.group(2).lower() if block else ""
            indent = len(line) - len(line.lstrip())
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j].strip().startswith(":")
                                      and len(lines[j]) - len(lines[j].lstrip()) > indent):
                j += 1  # blank lines and the directive's options
            start = j
            while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
                j += 1
            body = [l.strip() for l in lines[start:j]]
            if tag in _SHELL_TAGS and (tag or any(_LAUNCHER.search(l) for l in body)):
                out[start:j] = _block_lines(body, tag)
            i = max(j, i + 1)
            continue
        i += 1
    return "\n".join(out) + ("\n" if out else "")


def job_run_text(text: str) -> str:
    """The shell text of a job YAML's top-level `run: |` block in place (dedented), every other line blank;
    empty when the file has no such block that runs a launcher."""
    lines = text.splitlines()
    out = [""] * len(lines)
    found = False
    i = 0
    while i < len(lines):
        if _RUN_KEY.match(lines[i]):
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j][:1] in (" ", "\t")):
                j += 1
            body = lines[i + 1:j]
            if any(_LAUNCHER.search(l) for l in body):
                indent = min((len(l) - len(l.lstrip()) for l in body if l.strip()), default=0)
                out[i + 1:j] = [l[indent:] for l in body]
                found = True
            i = j
            continue
        i += 1
    return "\n".join(out) + "\n" if found else ""


def is_job_file(text: str) -> bool:
    return any(_RUN_KEY.match(l) for l in text.splitlines()) and bool(job_run_text(text))
