"""Launch commands in shell scripts: which Python script runs, with which arguments and launch config.

`accelerate launch --config_file fsdp.yaml train.py --load_in_4bit`, `torchrun --nproc_per_node 8
train.py --fsdp "full_shard auto_wrap"`, `python -m pkg.train`, under `srun`/`sbatch --wrap`/`env`/
`nohup`, in a run.sh with line continuations, variables, arrays, `export` and `"$@"`.

The reader is a small POSIX-shell word reader, not a full shell: it splits commands (newlines, `;`,
`&&`, `||`, `|`, `&`), honours quoting and backslashes, joins continuation lines, expands variables
assigned earlier in the script (`${VAR:-default}`, `"${ARR[@]}"`) and marks what it cannot know
(`$(...)`, unset variables, `"$@"`) instead of guessing. Control structures are read straight through
(every branch's commands are kept; a variable assigned in a branch keeps its last assignment).
bashlex (0.18) was considered: it gives a parse tree but expands nothing, and on launch-script
constructs it raises instead (arrays `ARGS=(...)`: ParsingError; `[[ ... ]]`: ParsingError; `case`
and `$((...))`: NotImplementedError), its import alone costs more than a lint of one file, and it
would be a new dependency. The words and variables are what matter here, so they are read directly.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from fsdplint.launch.docs import DOC_SUFFIXES, JOB_SUFFIXES, is_job_file, job_run_text, shell_text
from fsdplint.roots import has_marker, linted_root

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")


@dataclass
class Word:
    text: str
    line: int
    unknown: bool = False  # holds an expansion whose value is not known
    splat: bool = False  # "$@" / "$*": any number of words the caller passes


@dataclass
class Command:
    words: list[Word]
    line: int
    # Environment variables the command runs with that the script may read: exported ones and
    # `NAME=value cmd` prefixes (None: set to a value the reader cannot know).
    env: dict[str, Optional[Word]] = field(default_factory=dict)
    # The `cd DIR` commands run before this one, in order (the working directory the command runs in).
    cds: tuple = ()


# -- lexing ----------------------------------------------------------------------------
class _Lexer:
    """Words (as parts) and command boundaries of shell text, with line numbers."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.line = 1
        self.heredocs: list[str] = []

    def commands(self):
        """Yield lists of raw words; a raw word is (parts, line); an array literal is ("array", words, line)."""
        words: list = []
        cur: Optional[list] = None
        cur_line = self.line
        s, n = self.s, len(self.s)

        def flush():
            nonlocal cur
            if cur is not None:
                words.append((cur, cur_line))
                cur = None

        def start():
            nonlocal cur, cur_line
            if cur is None:
                cur, cur_line = [], self.line

        while self.i < n:
            c = s[self.i]
            if c == "\\" and s.startswith("\n", self.i + 1):
                self.i += 2
                self.line += 1
                continue
            if c in " \t\r":
                flush()
                self.i += 1
                continue
            if c == "\n":
                flush()
                self.i += 1
                self.line += 1
                if self.heredocs:
                    self._skip_heredocs()
                if words:
                    yield words
                    words = []
                continue
            if c == "#" and cur is None:
                while self.i < n and s[self.i] != "\n":
                    self.i += 1
                continue
            if c in ";&|":
                flush()
                self.i += 2 if s[self.i:self.i + 2] in ("&&", "||", ";;", "|&", "&>") else 1
                if s[self.i - 1] == ">":  # `&>file`
                    self._skip_redirect_target()
                    continue
                if words:
                    yield words
                    words = []
                continue
            if c == "(" and cur is not None and len(cur) == 1 and cur[0][0] == "lit" and not cur[0][2] \
                    and _ASSIGN.fullmatch(cur[0][1]):
                # NAME=( a b c ): an array literal
                self.i += 1
                name = cur[0][1]
                line = cur_line
                cur = None
                elems = self._array_words()
                words.append((("array", name, elems), line))
                continue
            if c in "()":
                flush()
                self.i += 1
                if words:
                    yield words
                    words = []
                continue
            if c in "<>":
                if cur is not None and all(p[0] == "lit" and p[1].isdigit() for p in cur):
                    cur = None  # the fd number of `2>&1`
                flush()
                if s.startswith("<<", self.i) and not s.startswith("<<<", self.i):
                    self.i += 2
                    if self.i < n and s[self.i] == "-":
                        self.i += 1
                    m = re.match(r"\s*['\"]?(\w+)['\"]?", s[self.i:])
                    if m:
                        self.heredocs.append(m.group(1))
                        self.i += m.end()
                    continue
                while self.i < n and s[self.i] in "<>&":
                    self.i += 1
                self._skip_redirect_target()
                continue
            start()
            self._part(cur)
        flush()
        if words:
            yield words

    def _skip_heredocs(self) -> None:
        s = self.s
        while self.heredocs:
            end = self.heredocs.pop(0)
            while self.i < len(s):
                j = s.find("\n", self.i)
                j = len(s) if j < 0 else j
                line = s[self.i:j]
                self.i = j + 1
                self.line += 1
                if line.strip() == end:
                    break

    def _skip_redirect_target(self) -> None:
        s = self.s
        while self.i < len(s) and s[self.i] in " \t":
            self.i += 1
        junk: list = []
        while self.i < len(s) and s[self.i] not in " \t\n;&|()<>":
            self._part(junk)

    def _array_words(self) -> list:
        """Words of `( ... )` up to the closing parenthesis."""
        s = self.s
        out: list = []
        cur: Optional[list] = None
        cur_line = self.line
        while self.i < len(s):
            c = s[self.i]
            if c == "\\" and s.startswith("\n", self.i + 1):
                self.i += 2
                self.line += 1
                continue
            if c in " \t\r\n":
                if cur is not None:
                    out.append((cur, cur_line))
                    cur = None
                if c == "\n":
                    self.line += 1
                self.i += 1
                continue
            if c == "#" and cur is None:
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
                continue
            if c == ")":
                self.i += 1
                break
            if cur is None:
                cur, cur_line = [], self.line
            self._part(cur)
        if cur is not None:
            out.append((cur, cur_line))
        return out

    def _part(self, cur: list) -> None:
        """Read one piece of a word at self.i into `cur`."""
        s = self.s
        c = s[self.i]
        if c == "'":
            j = s.find("'", self.i + 1)
            j = len(s) if j < 0 else j
            text = s[self.i + 1:j]
            self.line += text.count("\n")
            cur.append(("lit", text, True))
            self.i = j + 1
        elif c == '"':
            self.i += 1
            buf = []
            while self.i < len(s) and s[self.i] != '"':
                ch = s[self.i]
                if ch == "\\" and self.i + 1 < len(s) and s[self.i + 1] in '$`"\\\n':
                    if s[self.i + 1] != "\n":
                        buf.append(s[self.i + 1])
                    else:
                        self.line += 1
                    self.i += 2
                elif ch in "$`":
                    if buf:
                        cur.append(("lit", "".join(buf), True))
                        buf = []
                    cur.append(self._expansion(quoted=True))
                else:
                    if ch == "\n":
                        self.line += 1
                    buf.append(ch)
                    self.i += 1
            if buf or not cur:
                cur.append(("lit", "".join(buf), True))
            self.i += 1
        elif c == "\\":
            cur.append(("lit", s[self.i + 1:self.i + 2], True))
            self.i += 2
        elif c in "$`":
            cur.append(self._expansion(quoted=False))
        else:
            j = self.i
            while j < len(s) and s[j] not in " \t\r\n;&|()<>'\"\\$`":
                j += 1
            j = max(j, self.i + 1)  # an operator character where a word goes (inside `( ... )`): keep it
            if cur and cur[-1][0] == "lit" and not cur[-1][2]:
                cur[-1] = ("lit", cur[-1][1] + s[self.i:j], False)
            else:
                cur.append(("lit", s[self.i:j], False))
            self.i = j

    def _balanced(self, open_: str, close: str) -> str:
        s = self.s
        depth = 0
        start = self.i
        while self.i < len(s):
            ch = s[self.i]
            if ch == "\n":
                self.line += 1
            if ch == "\\":
                self.i += 2
                continue
            if ch == open_:
                depth += 1
            elif ch == close:
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return s[start:self.i]
            self.i += 1
        return s[start:]

    def _expansion(self, quoted: bool) -> tuple:
        s = self.s
        if s[self.i] == "`":
            j = s.find("`", self.i + 1)
            self.i = len(s) if j < 0 else j + 1
            return ("unknown",)
        self.i += 1  # $
        if self.i >= len(s):
            return ("lit", "$", quoted)
        c = s[self.i]
        if c == "(":
            self._balanced("(", ")")
            return ("unknown",)
        if c == "{":
            body = self._balanced("{", "}")[1:-1]
            m = re.fullmatch(r"([A-Za-z_]\w*)\[[@*]\]", body)
            if m:
                return ("array", m.group(1), quoted)
            m = re.fullmatch(r"([A-Za-z_]\w*)(:?[-=+?])(.*)", body, re.S)
            if m:
                return ("var", m.group(1), m.group(2), m.group(3), quoted)
            if body in ("@", "*"):
                return ("splat", quoted)
            if _NAME.fullmatch(body):
                return ("var", body, "", "", quoted)
            return ("unknown",)
        if c in "@*":
            self.i += 1
            return ("splat", quoted)
        if c.isdigit() or c in "#?$!-":
            self.i += 1
            return ("unknown",)
        m = _NAME.match(s, self.i)
        if m:
            self.i = m.end()
            return ("var", m.group(0), "", "", quoted)
        return ("lit", "$", quoted)


# -- evaluation -------------------------------------------------------------------------
_KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "fi", "done", "esac",
             "time", "exec", "nohup", "command", "builtin", "eval"}
_DECLARE = {"export", "local", "declare", "readonly", "typeset"}


class ShellReader:
    """Commands of a shell text with the variables it assigns expanded in order."""

    def __init__(self, text: str, env: Optional[dict] = None) -> None:
        self.text = text
        self.vars: dict[str, object] = dict(env or {})  # str, or list[Word] for arrays
        self.exported: dict[str, int] = {}  # exported names -> the line that exported them
        self.cds: list[Word] = []  # `cd DIR` so far: where a relative script name is looked up

    def commands(self) -> list[Command]:
        out = []
        for raw in _Lexer(self.text).commands():
            cmd = self._command(raw)
            if cmd is not None:
                out.append(cmd)
        return out

    def _command(self, raw: list) -> Optional[Command]:
        while raw and _plain(raw[0]) in _KEYWORDS:
            raw = raw[1:]
        if not raw:
            return None
        first = _plain(raw[0])
        if first in ("cd", "pushd") and len(raw) > 1:
            target = self._expand(raw[1])
            if target and not target[0].text.startswith("-"):
                self.cds.append(target[0])
            return None
        if first in ("for", "case", "select", "function", "[", "[[", "test", "set", "shift", "source", ".",
                     "return", "exit", "cd", "echo", "printf", "mkdir", "unset"):
            return None
        if first in _DECLARE:
            raw = [w for w in raw[1:] if not (_plain(w) or "").startswith("-")]
            for w in raw:
                self._assign(w)
                if first == "export":
                    name = _assigned_name(w)
                    if name is not None:
                        self.exported[name] = w[1]
            return None
        i = 0
        while i < len(raw) and self._is_assignment(raw[i]):
            i += 1
        if i == len(raw):
            for w in raw:
                self._assign(w)
            return None
        env: dict[str, Optional[Word]] = {n: self._env_word(n, line) for n, line in self.exported.items()}
        for w in raw[:i]:  # `NAME=value cmd`: for this command only
            name = _assigned_name(w)
            if name is not None:
                saved = self.vars.get(name, _MISSING)
                self._assign(w)
                env[name] = self._env_word(name, w[1])
                if saved is _MISSING:
                    self.vars.pop(name, None)
                else:
                    self.vars[name] = saved
        words: list[Word] = []
        for w in raw[i:]:
            words.extend(self._expand(w))
        if not words:
            return None
        return Command(words, words[0].line, env, tuple(self.cds))

    def _env_word(self, name: str, line: int) -> Optional[Word]:
        v = self.vars.get(name)
        return Word(v, line) if isinstance(v, str) else Word("", line, unknown=True)

    @staticmethod
    def _is_assignment(w) -> bool:
        parts, _ = w
        if parts and parts[0] == "array":
            return True
        return bool(parts) and parts[0][0] == "lit" and not parts[0][2] and _ASSIGN.match(parts[0][1]) is not None

    def _assign(self, w) -> None:
        parts, line = w
        if parts and parts[0] == "array":
            name = _ASSIGN.match(parts[1]).group(1)
            elems: list[Word] = []
            for e in parts[2]:
                elems.extend(self._expand(e))
            self.vars[name] = elems
            return
        if not (parts and parts[0][0] == "lit" and not parts[0][2]):
            return
        m = _ASSIGN.match(parts[0][1])
        if m is None:
            return
        name, append = m.group(1), m.group(2)
        rest = [("lit", parts[0][1][m.end():], False)] + list(parts[1:])
        word = self._join(rest, line)
        value = word.text if not word.unknown else None
        if append and isinstance(self.vars.get(name), str) and value is not None:
            value = self.vars[name] + value
        self.vars[name] = value

    def _var(self, name: str, op: str, arg: str) -> Optional[str]:
        v = self.vars.get(name)
        if isinstance(v, list):
            v = " ".join(w.text for w in v) if not any(w.unknown for w in v) else None
        if op in (":-", ":=") and (v is None or v == "") or op in ("-", "=") and v is None and name not in self.vars:
            v = _expand_default(arg, self)
            if op.endswith("=") and v is not None:
                self.vars[name] = v
        elif op in (":+", "+"):
            v = _expand_default(arg, self) if v else ""
        elif op:
            pass
        return v

    def _join(self, parts, line) -> Word:
        """Expand parts into one word (no field splitting), as in an assignment."""
        text, unknown = [], False
        for p in parts:
            if p[0] == "lit":
                text.append(p[1])
            elif p[0] == "var":
                v = self._var(p[1], p[2], p[3])
                if v is None:
                    unknown = True
                else:
                    text.append(v)
            else:
                unknown = True
        return Word("".join(text), line, unknown)

    def _expand(self, w) -> list[Word]:
        parts, line = w
        if parts and parts[0] == "array":
            return []
        fields: list[Word] = []
        cur = Word("", line)
        started = False
        for p in parts:
            kind = p[0]
            if kind == "lit":
                cur.text += p[1]
                started = True
            elif kind == "var":
                v = self._var(p[1], p[2], p[3])
                if v is None:
                    cur.unknown = True
                    started = True
                elif p[4]:  # quoted: no splitting
                    cur.text += v
                    started = True
                else:
                    pieces = v.split()
                    if not pieces:
                        continue
                    if v[:1].isspace() and started:
                        fields.append(cur)
                        cur = Word("", line)
                    for k, piece in enumerate(pieces):
                        if k:
                            fields.append(cur)
                            cur = Word("", line)
                        cur.text += piece
                    started = True
                    if v[-1:].isspace():
                        fields.append(cur)
                        cur, started = Word("", line), False
            elif kind == "array":
                arr = self.vars.get(p[1])
                if started:
                    fields.append(cur)
                if isinstance(arr, list):
                    fields.extend(Word(x.text, x.line, x.unknown, x.splat) for x in arr)
                elif isinstance(arr, str):
                    fields.extend(Word(x, line) for x in arr.split())
                else:
                    fields.append(Word("", line, unknown=True))
                cur, started = Word("", line), False
            elif kind == "splat":
                if started:
                    fields.append(cur)
                fields.append(Word("", line, splat=True))
                cur, started = Word("", line), False
            else:
                cur.unknown = True
                started = True
        if started:
            fields.append(cur)
        return fields


_MISSING = object()


def _assigned_name(w) -> Optional[str]:
    """NAME of a `NAME=value` (or a bare `NAME` after `export`) word."""
    parts, _ = w
    if parts and parts[0] == "array":
        return None
    if parts and parts[0][0] == "lit" and not parts[0][2]:
        m = _ASSIGN.match(parts[0][1])
        if m is not None:
            return m.group(1)
        if len(parts) == 1 and _NAME.fullmatch(parts[0][1]):
            return parts[0][1]
    return None


def _plain(w) -> Optional[str]:
    parts, _ = w
    if parts and parts[0] != "array" and all(p[0] == "lit" for p in parts):
        return "".join(p[1] for p in parts)
    return None


def _expand_default(arg: str, reader: ShellReader) -> Optional[str]:
    """The word of `${VAR:-word}`: quotes dropped, `$X`/`${X}` expanded."""
    arg = arg.strip()
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "'\"":
        arg = arg[1:-1]
    unknown = False

    def sub(m):
        nonlocal unknown
        name = m.group(1) or m.group(2)
        v = reader.vars.get(name)
        if not isinstance(v, str):
            unknown = True
            return ""
        return v

    out = re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", sub, arg)
    if "$(" in arg or "`" in arg:
        return None
    return None if unknown else out


# -- launches ---------------------------------------------------------------------------
# Options of `accelerate launch` that take no value (accelerate 1.15 commands/launch.py, store_true/false).
ACCELERATE_FLAGS = frozenset({
    "quiet", "q", "cpu", "multi_gpu", "tpu", "enable_cpu_affinity", "dynamo_use_fullgraph", "dynamo_use_dynamic",
    "dynamo_use_regional_compilation", "use_deepspeed", "use_fsdp", "use_parallelism_config", "use_megatron_lm",
    "same_network", "module", "m", "no_python", "tpu_cluster", "no_tpu_cluster", "tpu_use_sudo", "downcast_bf16",
    "fp8_use_autocast_during_eval", "debug", "h", "help",
})
# torchrun (torch.distributed.run) options that take no value.
TORCHRUN_FLAGS = frozenset({"standalone", "no_python", "module", "m", "run_path", "use_env", "h", "help"})
# Composer's launcher (`composer [-n N] train.py recipe.yaml ...`, mosaicml 0.32 composer/cli/launcher.py): options
# without a value; `-m`/`--module_mode` runs the script as a module, `-c`/`--command_mode` runs it as a command.
COMPOSER_FLAGS = frozenset({"verbose", "v", "module_mode", "m", "command_mode", "c", "version", "h", "help"})
# Options of `accelerate launch` kept as launch settings (besides every `--fsdp_*`).
_ACCELERATE_KEPT = ("mixed_precision", "num_processes", "num_machines")
# Programs that run the command after their own options: process managers of clusters (Slurm, MPI, Horovod, LSF
# jsrun, Cray aprun, TACC ibrun), containers and process utilities.
_WRAPPERS = {"srun", "mpirun", "mpiexec", "env", "nohup", "time", "exec", "stdbuf", "numactl", "taskset", "nice",
             "ionice", "singularity", "apptainer", "xargs", "sudo", "timeout", "caffeinate", "horovodrun", "jsrun",
             "aprun", "ibrun"}
# Two-word prefixes that run the command after them: environment runners, and ezpz's launcher (`ezpz launch
# python3 -m pkg.train ...` starts the command on every rank through mpiexec/torchrun, ezpz docs/cli).
_RUNNERS = {("uv", "run"), ("poetry", "run"), ("pixi", "run"), ("pipenv", "run"), ("conda", "run"),
            ("hatch", "run"), ("rye", "run"), ("ezpz", "launch")}


@dataclass
class Launch:
    """One command that runs a Python script: the launcher, its options, the script and its arguments."""

    file: str  # the shell file, as displayed, or "--launch" for a command given on the command line
    line: int
    launcher: str  # "accelerate", "torchrun", "python", "deepspeed"
    script: Optional[str] = None  # as written (known text after the last unknown part)
    module: Optional[str] = None  # `-m pkg.mod`
    args: list[Word] = field(default_factory=list)
    options: dict[str, Word] = field(default_factory=dict)  # launcher options, names normalised
    open_args: bool = False  # "$@" (or an unknown word) among the script's arguments
    text: str = ""  # the shell text, for source lines and noqa
    path: Optional[str] = None  # the shell file's path on disk
    # Environment variables the launch sets for the script (exported, `NAME=v cmd`, `env NAME=v cmd`).
    env: dict[str, Word] = field(default_factory=dict)
    script_open: bool = False  # the script's path starts with a part the reader cannot know (`$DIR/train.py`)
    cds: tuple = ()  # the `cd DIR` words run before the launch, in order
    # A candidate launch inferred from a lone recipe that fits the script's parser (`fsdplint.launch.recipes`):
    # the recipe's path; its values are bound as the script's arguments.
    recipe: Optional[str] = None

    @property
    def label(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def is_fsdp_capable(self) -> bool:
        """deepspeed jobs (the deepspeed launcher, `accelerate launch --use_deepspeed`) are not FSDP."""
        return self.launcher != "deepspeed" and "use_deepspeed" not in self.options


def _opt_name(text: str) -> tuple[str, Optional[str]]:
    body = text.lstrip("-")
    value = None
    if "=" in body:
        body, value = body.split("=", 1)
    return body.replace("-", "_"), value


def script_options(words: list[Word]) -> list[tuple[str, Optional[Word], int]]:
    """(name, value word or None for a bare flag, line) of a script's `--key value` / `--key=value` /
    `--flag` arguments, names as written after the dashes (for a tool whose own parser this reader does
    not have; a script whose parser is read binds its words with `fsdplint.launch.arguments.bind`)."""
    out = []
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if w.unknown or not w.text.startswith("--") or len(w.text) == 2:
            continue
        name, _, value = w.text[2:].partition("=")
        if "=" in w.text:
            out.append((name, Word(value, w.line, w.unknown), w.line))
        elif i < len(words) and not words[i].text.startswith("--") and not words[i].splat:
            out.append((name, words[i], w.line))
            i += 1
        else:
            out.append((name, None, w.line))
    return out


def _base(w: Word) -> str:
    return os.path.basename(w.text) if not w.unknown else ""


def _is_python(name: str) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)?)?", name) is not None


def _launch_from(words: list[Word], file: str, text: str, path: Optional[str]) -> Optional[Launch]:
    env_words: dict[str, Word] = {}
    launch = _launch_from_words(words, file, text, path, env_words)
    if launch is not None and env_words:
        launch.env.update(env_words)
    return launch


def _launch_from_words(words: list[Word], file: str, text: str, path: Optional[str], env_words: dict) -> Optional[Launch]:
    i = 0
    # Wrappers: skip to the first word that starts a launcher we know.
    for _ in range(6):
        if i >= len(words):
            return None
        b = _base(words[i])
        if i + 1 < len(words) and (b, words[i + 1].text) in _RUNNERS:
            i += 2
            continue
        if b == "sbatch":
            for k in range(i + 1, len(words)):
                name, val = _opt_name(words[k].text) if words[k].text.startswith("--") else ("", None)
                if name == "wrap":
                    inner = val if val is not None else (words[k + 1].text if k + 1 < len(words) else "")
                    cmds = ShellReader(inner).commands()
                    for c in cmds:
                        for w in c.words:
                            w.line = words[k].line
                        got = _launch_from(c.words, file, text, path)
                        if got is not None:
                            got.line = words[i].line
                            return got
            return None
        if b in _WRAPPERS:
            j = i + 1
            while j < len(words) and not _starts_launcher(words[j]) and not (b != "env" and _base(words[j]) == "env"):
                if b == "env" and not words[j].text.startswith("-") and _ASSIGN.match(words[j].text):
                    name, _, value = words[j].text.partition("=")
                    env_words[name] = Word(value, words[j].line, words[j].unknown)
                j += 1
            i = j
            continue
        break
    if i >= len(words):
        return None
    w0 = words[i]
    b = _base(w0)
    rest = words[i + 1:]
    if b == "accelerate" and rest and rest[0].text == "launch":
        return _accelerate(rest[1:], w0.line, file, text, path)
    if b in ("accelerate-launch",):
        return _accelerate(rest, w0.line, file, text, path)
    if b in ("torchrun", "torch-run"):
        return _torchrun(rest, w0.line, file, text, path)
    if b == "deepspeed":
        launch = _generic(rest, w0.line, file, text, path, "deepspeed", frozenset({"autotuning"}))
        return launch
    if b == "composer":
        return _composer(rest, w0.line, file, text, path, env_words)
    if b == "tune" and rest and rest[0].text == "run":
        return _tune_run(rest[1:], w0.line, file, text, path)
    if b == "tune" and _legacy_tune(rest):
        return _tune_run(rest, w0.line, file, text, path)
    if _is_python(b):
        j = 0
        while j < len(rest) and rest[j].text.startswith("-") and rest[j].text not in ("-m", "-c", "-"):
            j += 2 if rest[j].text in ("-W", "-X") else 1
        if j < len(rest) and rest[j].text == "-c":
            return None
        if j + 1 < len(rest) and rest[j].text == "-m":
            mod = rest[j + 1].text
            after = rest[j + 2:]
            if mod in ("torch.distributed.run", "torch.distributed.launch"):
                return _torchrun(after, w0.line, file, text, path)
            if mod in ("accelerate.commands.launch",):
                return _accelerate(after, w0.line, file, text, path)
            if mod.startswith("deepspeed"):
                return _generic(after, w0.line, file, text, path, "deepspeed", frozenset())
            return _bind(Launch(file, w0.line, "python", text=text, path=path), None, mod, after)
        if j < len(rest) and rest[j].text.endswith(".py"):
            return _bind(Launch(file, w0.line, "python", text=text, path=path), rest[j], None, rest[j + 1:])
        return None
    if w0.text.endswith(".py") and not w0.unknown:
        return _bind(Launch(file, w0.line, "python", text=text, path=path), w0, None, rest)
    # Another program that runs a command given after `--` (`kubectl exec POD -- python train.py`, `ray job
    # submit -- python train.py`): that command is the launch when it starts with an interpreter or launcher
    # (`git log -- train.py` names a file, it runs nothing).
    for k, w in enumerate(rest):
        if w.text == "--" and not w.unknown and k + 1 < len(rest) and _starts_launcher(rest[k + 1]) \
                and not rest[k + 1].text.endswith(".py"):
            return _launch_from_words(rest[k + 1:], file, text, path, env_words)
    return None


def _starts_launcher(w: Word) -> bool:
    b = _base(w)
    return b in ("accelerate", "torchrun", "deepspeed", "sbatch", "composer", "tune") or _is_python(b) or (
        w.text.endswith(".py") and not w.text.startswith("-"))


def _bind(launch: Launch, script: Optional[Word], module: Optional[str], args: list[Word]) -> Launch:
    if script is not None:
        launch.script = script.text
        launch.script_open = script.unknown
    launch.module = module
    launch.args = list(args)
    launch.open_args = any(a.splat or a.unknown for a in args)
    return launch


def _generic(words: list[Word], line: int, file: str, text: str, path, launcher: str, flags) -> Launch:
    launch = Launch(file, line, launcher, text=text, path=path)
    j = 0
    module = False
    while j < len(words):
        w = words[j]
        if w.splat:
            launch.open_args = True
            j += 1
            continue
        if w.text.startswith("-") and len(w.text) > 1:
            name, val = _opt_name(w.text)
            if name in ("m", "module"):
                module = True
                launch.options[name] = w
                j += 1
                continue
            if name in flags or val is not None or j + 1 >= len(words):
                launch.options[name] = Word(val if val is not None else "true", w.line, w.unknown)
                j += 1
            else:
                launch.options[name] = words[j + 1]
                j += 2
            continue
        if module:
            return _bind(launch, None, w.text, words[j + 1:])
        return _bind(launch, w, None, words[j + 1:])
    return launch


def _composer(words, line, file, text, path, env_words) -> Optional[Launch]:
    """`composer [options] SCRIPT ARGS...` runs `python SCRIPT ARGS` on each rank; with `-m` SCRIPT is a module,
    with `-c` it is a command of its own (read as one)."""
    launch = _generic(words, line, file, text, path, "composer", COMPOSER_FLAGS)
    if "module_mode" in launch.options and launch.script and not launch.module:
        launch.module, launch.script = launch.script, None
    if ("c" in launch.options or "command_mode" in launch.options) and launch.script:
        got = _launch_from_words([Word(launch.script, line, launch.script_open), *launch.args], file, text, path,
                                 env_words)
        if got is not None:
            got.line = line
        return got
    return launch


def _legacy_tune(words) -> bool:
    """`tune [torchrun options] RECIPE ...` of torchtune before `tune run`: the first word that is no torchrun
    option is a recipe, not one of `tune`'s subcommands."""
    from fsdplint.launch import tune

    launch = _generic(words, 0, "", "", None, "torchrun", TORCHRUN_FLAGS)
    return launch.script is not None and not launch.script_open and launch.script not in tune.SUBCOMMANDS


def _tune_run(words, line, file, text, path) -> Launch:
    """torchtune's `tune run [torchrun options] RECIPE --config CONFIG key=value...` (see launch/tune.py): the
    recipe a registry name or path names, run through torchrun when torchrun options are given."""
    from fsdplint.launch import tune

    launch = _generic(words, line, file, text, path, "torchrun", TORCHRUN_FLAGS)
    if not launch.options:
        launch.launcher = "python"  # `tune run RECIPE` without torchrun options: one process
    name = launch.script
    if name is None or launch.script_open:
        return launch
    root = tune.registry_root(Path(path).parent if path else Path.cwd())
    found = tune.recipe_file(name, root)
    # A registry recipe is a file of the registry's repository; a path is resolved as any script's is; a
    # recipe of the installed package is no file of this project (no script: nothing to lint under it).
    launch.script = name if name.endswith(".py") else (str(root / found) if found and root else None)
    args = []
    i = 0
    while i < len(launch.args):
        w = launch.args[i]
        args.append(w)
        if w.text == "--config" and i + 1 < len(launch.args) and not launch.args[i + 1].unknown:
            nxt = launch.args[i + 1]
            cfg = tune.config_file(nxt.text, root)
            if cfg != nxt.text and root is not None:
                cfg = str(root / cfg)
            args.append(Word(cfg, nxt.line, nxt.unknown, nxt.splat))
            i += 2
            continue
        i += 1
    launch.args = args
    return launch


def _accelerate(words, line, file, text, path) -> Launch:
    return _generic(words, line, file, text, path, "accelerate", ACCELERATE_FLAGS)


def _torchrun(words, line, file, text, path) -> Launch:
    return _generic(words, line, file, text, path, "torchrun", TORCHRUN_FLAGS)


def parse_launches(text: str, file: str, path: Optional[str] = None) -> list[Launch]:
    """Every launch of a Python script or module in shell text."""
    out = []
    for cmd in ShellReader(text).commands():
        launch = _launch_from(cmd.words, file, text, path)
        if launch is not None and (launch.script or launch.module):
            launch.env = {k: w for k, w in {**cmd.env, **launch.env}.items() if w is not None and _LAUNCH_ENV.match(k)}
            launch.cds = cmd.cds
            out.append(launch)
    return out


# The environment variables accelerate reads to configure FSDP (accelerate 1.15 utils/dataclasses.py,
# FullyShardedDataParallelPlugin.__post_init__ with env_prefix "FSDP_"; state.py for ACCELERATE_USE_FSDP).
_LAUNCH_ENV = re.compile(r"(ACCELERATE_USE_FSDP|FSDP_[A-Z0-9_]+)$")


# -- which launches run a script ---------------------------------------------------------------
_SHELL_SUFFIXES = (".sh", ".bash", ".slurm", ".sbatch", ".job")
_SKIP_DIRS = {".git", ".hg", ".venv", "venv", "env", "node_modules", "__pycache__", "site-packages", "build",
              "dist", ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_MAX_SHELL_FILES = 300
_MAX_DOC_FILES = 200
_MAX_SHELL_BYTES = 512 * 1024
_PARSED: dict[tuple, list[Launch]] = {}
_FILES: dict[str, list[Path]] = {}
_TEXTS: dict[tuple, str] = {}
# (mtime, size) of each launcher file, looked at once per run (`new_run`): every linted script asks about
# every launcher of its project, and a run over a repository would stat each one per script.
_STAMPS: dict[str, Optional[tuple]] = {}


def _stamp(path: Path) -> Optional[tuple]:
    key = str(path)
    if key not in _STAMPS:
        try:
            st = path.stat()
            _STAMPS[key] = (st.st_mtime_ns, st.st_size)
        except OSError:
            _STAMPS[key] = None
    return _STAMPS[key]


def project_root(script: Path) -> Path:
    """The nearest directory above the script that holds pyproject.toml/setup.py/setup.cfg/.git."""
    start = script.resolve().parent
    d = start
    for _ in range(8):
        if has_marker(d):
            return d
        if d.parent == d:
            break
        d = d.parent
    return start


def _is_doc(path: Path, root: Path) -> bool:
    """A document whose shell blocks count as launchers: a README anywhere, any Markdown/RST page under a
    docs/ or examples/ folder (pages elsewhere rarely hold the project's own launch commands)."""
    if not path.name.endswith(DOC_SUFFIXES):
        return False
    if path.name.lower().startswith("readme"):
        return True
    try:
        parts = path.relative_to(root).parts[:-1]
    except ValueError:
        return False
    return any(p.lower() in ("docs", "doc", "examples", "example", "recipes") for p in parts)


def shell_files(root: Path, max_depth: int = 4) -> list[Path]:
    """Shell scripts under `root` (`max_depth` directory levels down), then the documents whose shell
    blocks launch scripts (READMEs, docs/, examples/), cached per process."""
    key = f"{root}\0{max_depth}"
    hit = _FILES.get(key)
    if hit is not None:
        return hit
    found: list[Path] = []
    docs: list[Path] = []
    base_depth = len(root.parts)
    for dirpath, dirs, names in os.walk(root):
        depth = len(Path(dirpath).parts) - base_depth
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".") and depth < max_depth)
        for n in sorted(names):
            if n.endswith(_SHELL_SUFFIXES):
                found.append(Path(dirpath) / n)
            elif n.endswith(DOC_SUFFIXES) and len(docs) < _MAX_DOC_FILES and _is_doc(Path(dirpath) / n, root):
                docs.append(Path(dirpath) / n)
            elif n.endswith(JOB_SUFFIXES) and len(docs) < _MAX_DOC_FILES and _is_job(Path(dirpath) / n):
                docs.append(Path(dirpath) / n)
        if len(found) >= _MAX_SHELL_FILES:
            break
    _FILES[key] = found[:_MAX_SHELL_FILES] + docs
    return _FILES[key]


def _is_job(path: Path) -> bool:
    """A job YAML (SkyPilot's `run: |` block) that runs a launcher: its commands launch the project's scripts."""
    try:
        if path.stat().st_size > _MAX_SHELL_BYTES:
            return False
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return "\nrun:" in text and is_job_file(text)


def _shell_text_of(path: Path, text: str) -> str:
    """A launcher's shell text; for a document, its shell blocks in place (other lines blank); for a job
    YAML, its `run:` block in place."""
    if path.name.endswith(DOC_SUFFIXES):
        return shell_text(text, rst=path.suffix == ".rst")
    if path.name.endswith(JOB_SUFFIXES):
        return job_run_text(text)
    return text


def read_launches(path: Path, display: str) -> list[Launch]:
    try:
        stamp = _stamp(path)
        if stamp is None:
            return []
        if stamp[1] > _MAX_SHELL_BYTES:
            return []
        key = (str(path), *stamp)
        hit = _PARSED.get(key)
        if hit is not None:
            return hit
        text = _shell_text_of(path, path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return []
    try:
        launches = parse_launches(text, display, str(path))
    except Exception:  # a shell file this reader cannot follow launches nothing it can tell
        launches = []
    _PARSED[key] = launches
    return launches


def _trailing_match(launch: Launch, script: Path) -> bool:
    """The launch's known trailing path components are the script's (a launch given on the command line,
    with no launcher file whose directory would anchor it)."""
    parts = script.resolve().parts
    want = _wanted_tails(launch)
    return any(w and tuple(parts[-len(w):]) == tuple(w) for w in want)


def _wanted_tails(launch: Launch) -> list[list[str]]:
    if launch.module:
        mod = launch.module.split(".")
        return [mod[:-1] + [mod[-1] + ".py"], mod + ["__main__.py"]]
    if launch.script:
        tail = [p for p in launch.script.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in tail:
            tail = tail[len(tail) - tail[::-1].index(".."):]
        return [tail]
    return []


def working_dirs(launch: Launch, root: Path) -> list[Path]:
    """Where the launch may run, most likely first: the directory its last `cd` names (resolved against the
    launcher's directory and the project root; `cd "$(dirname "$0")"` is the launcher's directory), the
    launcher's directory, the project root, then the directories between them. Empty for a launch given on
    the command line (no launcher file anchors it)."""
    if not launch.path:
        return []
    here = Path(launch.path).resolve().parent
    out: list[Path] = []
    bases = [here, root]
    for cd in launch.cds:
        if cd.unknown:
            # `cd "$(dirname "$0")"`, `cd $SCRIPT_DIR`: the launcher's own directory is the usual meaning;
            # a known tail after the unknown part (`cd $ROOT/examples`) is looked up below the candidates.
            tail = cd.text.strip("/")
            bases = [b / tail if tail else b for b in (here, root)] + ([here] if tail else [])
            continue
        if os.path.isabs(cd.text):
            bases = [Path(cd.text)]
        else:
            bases = [b / cd.text for b in bases]
    out.extend(Path(os.path.normpath(b)) for b in bases)
    out += [here, root]
    d = here
    while root in d.parents:
        d = d.parent
        out.append(d)
    return list(dict.fromkeys(out))


_PY_BY_NAME: dict[tuple, list[Path]] = {}


def _py_named(root: Path, name: str) -> list[Path]:
    """The files called `name` under `root` (a few levels down), cached per process."""
    key = (str(root), name)
    hit = _PY_BY_NAME.get(key)
    if hit is None:
        hit = []
        base_depth = len(root.parts)
        for dirpath, dirs, names in os.walk(root):
            depth = len(Path(dirpath).parts) - base_depth
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".") and depth < 6)
            if name in names:
                hit.append(Path(dirpath) / name)
        _PY_BY_NAME[key] = hit
    return hit


def launched_files(launch: Launch, root: Path) -> list[Path]:
    """The file(s) a launch from a launcher file runs, resolved as the shell and Python would: the script
    path (or `-m pkg.mod` module, also below `src/`) relative to the first working directory where it
    exists. When it exists in none (the launch runs from elsewhere, or after an unknown `$DIR/`): the files
    of the project whose path ends with the launch's known components, when those include a directory or
    name a single file of the project; never every same-named script of unrelated folders."""
    tails = _wanted_tails(launch)
    if not tails:
        return []
    dirs = working_dirs(launch, root)
    if launch.module:
        dirs = dirs + [d / "src" for d in dirs]
    if launch.script and not launch.script_open and os.path.isabs(launch.script):
        p = Path(launch.script)
        return [p] if p.is_file() else []
    for d in dirs:
        for tail in tails:
            p = d.joinpath(*tail) if tail else d
            try:
                if p.is_file():
                    return [Path(os.path.normpath(p.resolve()))]
            except OSError:
                continue
    # Not found where the launch would run: match by the known trailing components.
    out = []
    for tail in tails:
        if not tail:
            continue
        same = [p.resolve() for p in _py_named(root, tail[-1])]
        hits = [p for p in same if tuple(p.parts[-len(tail):]) == tuple(tail)]
        if len(tail) >= 2 or len(hits) == 1:
            out.extend(hits)
    return out


def runs_script(launch: Launch, script: Path, root: Optional[Path] = None) -> bool:
    """Does this launch run `script`? A launch in a launcher file runs the file its command names from
    where it runs (`launched_files`); one given on the command line is matched by its known trailing path
    components."""
    if not launch.path:
        return _trailing_match(launch, script)
    if root is None:
        try:
            root = project_root(Path(launch.path))
        except OSError:
            return False
    try:
        target = script.resolve()
    except OSError:
        return False
    return target in _launched(launch, Path(root).resolve())


_LAUNCHED: dict[tuple, tuple] = {}


def _launched(launch: Launch, root: Path) -> frozenset:
    """`launched_files`, once per launch and run: every script of the project asks about every launch that
    names its stem (in docs, hundreds), and each answer costs path resolutions and stats."""
    key = (id(launch), root)
    hit = _LAUNCHED.get(key)
    if hit is None or hit[0] is not launch:  # (the launch is kept in the value: its id is not reused)
        hit = _LAUNCHED[key] = (launch, frozenset(launched_files(launch, root)))
    return hit[1]


def new_run() -> None:
    """A new run of the linter: scripts may have appeared or moved since the last one looked."""
    _LAUNCHED.clear()
    _STAMPS.clear()


def launches_for(script: Path, linted: Optional[str] = None) -> list[Launch]:
    """The launches in the project's shell scripts that run `script` (deepspeed jobs left out).
    `linted`: the directory the user lints (`fsdplint check DIR`); with no project marker above the
    script, a directory the user chose to lint as a whole is the project (its launch.sh may sit two levels
    above `scripts/fsdp/train.py`)."""
    try:
        root = project_root(script)
    except OSError:
        return []
    depth = 4 if has_marker(root) else 0
    lr = linted_root(root, linted) if not depth else None
    if lr is not None and lr != root:
        root, depth = lr, 4
    needle = script.stem if script.name != "__main__.py" else script.parent.name
    try:  # (once here, not per launch asked about)
        target, resolved_root = script.resolve(), root.resolve()
    except (OSError, RuntimeError):
        return []
    out = []
    # Outside a project (no pyproject.toml/setup.py/.git above, not under the linted directory): the script's
    # own directory only.
    for sh in shell_files(root, depth):
        stamp = _stamp(sh)
        if stamp is None:
            continue
        tkey = (str(sh), *stamp)
        text = _TEXTS.get(tkey)
        if text is None:
            try:
                text = _TEXTS[tkey] = sh.read_text(encoding="utf-8", errors="replace")[:_MAX_SHELL_BYTES]
            except OSError:
                continue
        if needle not in text:
            continue
        try:
            display = os.path.relpath(sh)
        except ValueError:
            display = str(sh)
        if display.startswith(".." + os.sep + ".."):
            display = str(sh)
        for launch in read_launches(sh, display):
            if launch.is_fsdp_capable and (target in _launched(launch, resolved_root) if launch.path
                                           else runs_script(launch, script, root)):
                out.append(launch)
    return out


def mentioned_by_launchers(root: Path, name: str) -> bool:
    """Does a shell script or documented command of the project mention the file name `name`?"""
    for sh in shell_files(root, 4 if has_marker(root) else 0):
        try:
            stamp = _stamp(sh)
            if stamp is None:
                continue
            tkey = (str(sh), *stamp)
            text = _TEXTS.get(tkey)
            if text is None:
                text = _TEXTS[tkey] = sh.read_text(encoding="utf-8", errors="replace")[:_MAX_SHELL_BYTES]
        except OSError:
            continue
        if name in text:
            return True
    return False


def launches_from_command(cmd: str) -> list[Launch]:
    """Launches of a `--launch "CMD"` given on the command line (deepspeed jobs left out)."""
    return [l for l in parse_launches(cmd, "--launch") if l.is_fsdp_capable]


def unbound_notice(cmd: str) -> Optional[str]:
    """Why a well-formed launch runs no file of the project, when that is all there is to it: a `tune run` of
    a recipe of the installed torchtune package (its code is the library's, not the project's); else None
    (the command is not a launch: a usage error)."""
    for c in ShellReader(cmd).commands():
        texts = [w.text for w in c.words]
        for i, t in enumerate(texts[:-1]):
            if _base(c.words[i]) != "tune":
                continue
            words = c.words[i + 2:] if texts[i + 1] == "run" else c.words[i + 1:]
            if texts[i + 1] == "run" or _legacy_tune(words):
                launch = _tune_run(words, c.line, "--launch", cmd, None)
                if launch.script is None and not launch.script_open:
                    name = _generic(words, 0, "", "", None, "torchrun", TORCHRUN_FLAGS).script or "?"
                    return (f"the recipe {name!r} is not in this project's torchtune recipe registry: it runs "
                            "the installed torchtune's recipe, whose code is not linted")
    return None


def is_launcher_file(path: Path) -> bool:
    """A shell launcher named on the command line (read as the launches it runs, never as Python)."""
    return path.suffix in _SHELL_SUFFIXES


def launcher_targets(sh: Path) -> tuple[list[Launch], list[Path], list[str]]:
    """The launches of a shell file given on the command line, the scripts they run (resolved from where
    each runs) and a warning for each FSDP-capable launch whose script is not found."""
    try:
        display = os.path.relpath(sh)
    except ValueError:
        display = str(sh)
    try:
        text = sh.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise OSError(f"{display}: {e.strerror or e}") from None
    launches = [l for l in parse_launches(text, display, str(sh)) if l.is_fsdp_capable]
    root = project_root(sh)
    scripts: list[Path] = []
    warnings = []
    for launch in launches:
        found = launched_files(launch, root)
        if not found:
            what = f"-m {launch.module}" if launch.module else launch.script
            warnings.append(f"{launch.label}: the script it launches ({what}) was not found; nothing linted for it")
        for p in found:
            if p not in scripts:
                scripts.append(p)
    if not launches:
        warnings.append(f"{display}: launches no Python script (deepspeed jobs are not FSDP); nothing linted for it")
    return launches, scripts, warnings
