"""Stand-ins for what the dry run cannot load: hub datasets and tokenizers that are neither local nor
cached, attention kernels this machine lacks, and writes to the hub.

A real local path or a cached hub copy is always loaded for real; a stand-in replaces only what would
otherwise fail for lack of network or of a GPU-only package, and every one is said in the report:

- `AutoTokenizer.from_pretrained("org/name")` not cached: a word-level tokenizer built offline with the
  vocabulary size of that model's config (when the config is cached or local), the special tokens the
  job passes, and a plain chat template, so `apply_chat_template`, padding and packing run.
- `load_dataset("org/name", ...)` not cached: 2048 rows per split (enough for the job's own test-split
  sizes and a batch on every rank) with the columns the job reads. The columns are read from the
  job's own source, the module that called `load_dataset`: the string keys its `.map`/`.filter`
  functions subscript (`sample["dialogue"]`), the names it gives `remove_columns` and the column a
  `rename_column` reads (not the one it makes); and from its configuration: the values of `*column*` / `*field*` options on its
  command line and keys in the YAML/JSON files the command line names (a recipe's `columns:
  [messages]`). Loaded whole (no `split`), it has `train`, `test` and the other split names the job
  subscripts (`raw["validation"]`). With none, a `text` column (what `SFTTrainer` and language-modelling jobs read
  without naming it). `messages` holds chat turns,
  `label`-like columns hold integers, the rest hold text.
- `evaluate.load("glue", "mrpc")` (a hub metric) not cached: a metric of the same name whose
  `add_batch`/`add`/`compute` take predictions and references and compute what that metric reports
  for labels (accuracy, f1, precision, recall, Matthews correlation; Pearson/Spearman for regression
  configs), so an evaluation loop runs. Without `evaluate` installed nothing is patched: the job's own
  `import evaluate` then fails as it would anywhere, and the run says what to install.
- `attn_implementation="flash_attention_2"` (or another kernel) that is not installed here: sdpa, as
  the kernel would be on the cluster for what the dry run checks (shapes, dtypes, wrapping).
- `push_to_hub` / `create_repo` / uploads: nothing is written to the hub, ever.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys

ROWS = 2048
NOTES: list[str] = []

# Split names are subscripted too (`raw["train"]`); they are not columns.
_SPLITS = {"train", "test", "validation", "valid", "eval", "dev"}
_CHAT_COLUMNS = {"messages", "conversation", "conversations", "chat", "dialog"}
_INT_COLUMNS = re.compile(r"(label|labels|idx|id|.*_id|.*_label)$")
# Calls that name columns of the data as loaded (select_columns/cast_column often name derived ones).
_COLUMN_CALLS = {"remove_columns"}
_WORDS = "the a cat dog sat on mat hello world of and to in is it that was for".split()
_CHAT_TEMPLATE = ("{% for message in messages %}{{ bos_token if loop.first else '' }}{{ message['role'] }}: "
                  "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% endif %}")


def install() -> None:
    _tokenizers()
    _datasets()
    _metrics()
    _attention()
    _hub_writes()


def _note(text: str) -> None:
    if text not in NOTES:
        NOTES.append(text)


def _is_local(name) -> bool:
    """A path, not a hub id: it exists, is written as a path, or sits in a directory that exists (a
    mistyped `models/llama` under an existing `models/` is the job's error, not a hub id to stand in)."""
    if not isinstance(name, str) or os.path.exists(name) or name.startswith((".", "/", "~")):
        return True
    parent = os.path.dirname(name)
    return bool(parent) and os.path.isdir(parent)


# -- tokenizers --------------------------------------------------------------------------------------

def _tokenizers() -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    for owner in (AutoTokenizer, PreTrainedTokenizerBase):
        original = owner.from_pretrained.__func__

        def from_pretrained(cls, name, *args, _original=original, **kwargs):
            try:
                return _original(cls, name, *args, **kwargs)
            except (OSError, ValueError) as e:
                if _is_local(name) or not _missing(e):
                    raise
                return standin_tokenizer(name, **kwargs)

        owner.from_pretrained = classmethod(from_pretrained)


def _missing(e: Exception) -> bool:
    """The error is the hub being out of reach (offline, not cached), not a broken local file."""
    text = f"{type(e).__name__} {e}".lower()
    return any(k in text for k in ("offline", "connect", "cached", "couldn't find", "not find", "does not appear",
                                    "can't load", "not a valid model identifier", "localentrynotfound",
                                    "repository not found", "no such file", "couldn't instantiate the backend tokenizer"))


def _vocab_size(name: str) -> tuple[int, str]:
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(name, local_files_only=True)  # sizing only: never a download
        size = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
        if size:
            return int(size), f"its config's vocabulary of {size}"
    except Exception:  # no config either: a Llama-2-sized vocabulary
        pass
    return 32000, "32000 tokens (no config.json cached for it either)"


def standin_tokenizer(name: str, **kwargs):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    size, why = _vocab_size(name)
    special = {k: kwargs[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if kwargs.get(k)}
    special.setdefault("bos_token", "<s>")
    special.setdefault("eos_token", "</s>")
    special.setdefault("unk_token", "<unk>")
    extra = [str(t) for t in kwargs.get("additional_special_tokens") or []]
    base = [str(v) for v in special.values()]
    words = list(dict.fromkeys(base + _WORDS))
    words += [f"w{i}" for i in range(max(size - len(words) - len(extra), 0))]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=str(special["unk_token"])))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, additional_special_tokens=extra or None,
                                  model_max_length=kwargs.get("model_max_length", 4096), **special)
    out.name_or_path = name
    out.chat_template = _CHAT_TEMPLATE
    _note(f"tokenizer {name} not cached: used a stand-in word-level tokenizer of {why}"
          + (f" (+{len(extra)} added special tokens)" if extra else "") + " and a plain chat template")
    return out


# -- datasets ----------------------------------------------------------------------------------------

def _datasets() -> None:
    try:
        import datasets
        from datasets import load as load_mod
    except ImportError:  # the job's own import reports it
        return
    original = datasets.load_dataset

    @functools.wraps(original)
    def load_dataset(path, *args, **kwargs):
        try:
            return original(path, *args, **kwargs)
        except Exception as e:
            if _is_local(path) or kwargs.get("data_files") or kwargs.get("data_dir") or not _dataset_missing(e):
                raise
            caller = _caller_file()
            columns = list(dict.fromkeys((columns_read_by(caller) if caller else []) + columns_configured(sys.argv)))
            return standin_dataset(path, kwargs.get("split", args[1] if len(args) > 1 else None), columns, caller)

    datasets.load_dataset = load_dataset
    load_mod.load_dataset = load_dataset


def _dataset_missing(e: Exception) -> bool:
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & {"DatasetNotFoundError", "ConnectionError", "OfflineModeIsEnabled", "LocalEntryNotFoundError",
                         "HfHubHTTPError", "FileNotFoundError"}) or _missing(e)


def _caller_file():
    """The job's file that called `load_dataset`: the nearest frame outside the installed libraries."""
    import sysconfig

    libs = tuple(p for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                             sysconfig.get_paths()["stdlib"]} if p)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame = sys._getframe(2)
    while frame is not None:
        f = os.path.abspath(frame.f_code.co_filename)
        if os.path.isfile(f) and not f.startswith(libs) and not f.startswith(here):
            return f
        frame = frame.f_back
    return None


def columns_read_by(path: str) -> list[str]:
    """The dataset columns a module reads: string keys subscripted in the functions it passes to
    `.map`/`.filter` (by name or as a lambda, one call deep), and the names it gives the column calls."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return []
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found: list[str] = []
    made: set[str] = set()  # rename targets: columns the job makes, which the loaded data must not have
    mapped = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if name in ("map", "filter") and isinstance(call.func, ast.Attribute):
            fn = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "function"), None)
            mapped.append(fn)
        if name == "rename_column":  # the column it reads, not the one it makes
            found += _strings(call.args[:1])
            made.update(_strings(call.args[1:2]))
        elif name == "rename_columns" and call.args and isinstance(call.args[0], ast.Dict):
            found += _strings([k for k in call.args[0].keys if k is not None])
            made.update(_strings(call.args[0].values))
        elif name in _COLUMN_CALLS:
            found += _strings(call.args)
        found += [s for k in call.keywords if k.arg in ("remove_columns", "column_names", "input_columns")
                  for s in _strings([k.value])]
    seen = set()
    while mapped:
        fn = mapped.pop()
        if isinstance(fn, ast.Name) and fn.id in functions and fn.id not in seen:
            seen.add(fn.id)
            fn = functions[fn.id]
        elif not isinstance(fn, ast.Lambda):
            continue
        for n in ast.walk(fn):
            if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
                found.append(n.slice.value)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in functions:
                mapped.append(n.func)  # a function the mapped one calls with the row
    columns = [c for c in dict.fromkeys(found) if re.fullmatch(r"[a-z_][a-z0-9_]*", c) and c not in _SPLITS
               and c not in made]
    return columns


def splits_read_by(path: str) -> list[str]:
    """The split names a module subscripts (`raw["validation"]`): a dataset loaded whole gets those
    splits, as the hub copy would have them."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return []
    found = [n.slice.value for n in ast.walk(tree) if isinstance(n, ast.Subscript)
             and isinstance(n.slice, ast.Constant) and n.slice.value in _SPLITS]
    return list(dict.fromkeys(found))


def _is_column_key(key) -> bool:
    key = str(key).lower().lstrip("-")
    return "column" in key or key.endswith("_field") or key == "field"


def columns_configured(argv: list[str]) -> list[str]:
    """Columns the job's configuration names: `--dataset_text_field content`, and `*column*` / `*field*`
    keys of the YAML/JSON files on its command line (a recipe's `columns: [messages]`)."""
    found: list[str] = []
    for i, word in enumerate(argv):
        key, eq, value = word.partition("=")
        if key.startswith("--") and _is_column_key(key):
            v = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            found += [c for c in re.split(r"[,\s]+", v) if c]
        path = value if eq else word
        if path.endswith((".yaml", ".yml", ".json")) and os.path.isfile(path):
            found += _config_file_columns(path)
    return [c for c in dict.fromkeys(found) if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", c) and c not in _SPLITS]


def _config_file_columns(path: str) -> list[str]:
    try:
        import yaml

        with open(path, encoding="utf-8", errors="replace") as f:
            data = yaml.safe_load(f)
    except Exception:  # not the job's config, or not readable: it names no column
        return []
    out: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if _is_column_key(k) and isinstance(v, str):
                    out.append(v)
                elif _is_column_key(k) and isinstance(v, list):
                    out.extend(x for x in v if isinstance(x, str))
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(data)
    return out


def _strings(nodes) -> list[str]:
    out = []
    for n in nodes:
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
        elif isinstance(n, (ast.List, ast.Tuple, ast.Set)):
            out += _strings(n.elts)
        elif isinstance(n, ast.Dict):
            out += _strings([k for k in n.keys if k is not None])
    return out


def _value(column: str, i: int):
    text = " ".join(_WORDS[(i + k) % len(_WORDS)] for k in range(24))
    if column in _CHAT_COLUMNS:
        return [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
    if _INT_COLUMNS.match(column):
        return i % 2
    return text


def standin_dataset(name: str, split, columns: list[str], caller=None):
    from datasets import Dataset, DatasetDict

    columns = columns or ["text"]
    rows = {c: [_value(c, i) for i in range(ROWS)] for c in columns}
    where = f" (read from {os.path.basename(caller)})" if caller and columns != ["text"] else ""
    _note(f"dataset {name} not cached: used a {ROWS}-row stand-in with columns {', '.join(columns)}{where}")
    if split is None:
        splits = ["train", "test"] + [s for s in (splits_read_by(caller) if caller else []) if s not in ("train", "test")]
        return DatasetDict({s: Dataset.from_dict(rows) for s in splits})
    if isinstance(split, (list, tuple)):
        return [Dataset.from_dict(rows) for _ in split]
    return Dataset.from_dict(rows)


# -- metrics -----------------------------------------------------------------------------------------

# What a hub metric reports, by its name and config (GLUE's configs report different keys); a name not
# here reports accuracy, the figure classification metrics share.
_METRIC_KEYS = {
    "accuracy": ("accuracy",), "f1": ("f1",), "precision": ("precision",), "recall": ("recall",),
    "matthews_correlation": ("matthews_correlation",), "pearsonr": ("pearsonr",), "spearmanr": ("spearmanr",),
    "exact_match": ("exact_match",), "mse": ("mse",), "mae": ("mae",),
    ("glue", "mrpc"): ("accuracy", "f1"), ("glue", "qqp"): ("accuracy", "f1"),
    ("glue", "cola"): ("matthews_correlation",), ("glue", "stsb"): ("pearson", "spearmanr"),
    ("super_glue", "cb"): ("accuracy", "f1"), ("super_glue", "multirc"): ("exact_match", "f1_m", "f1_a"),
}


def _metrics() -> None:
    try:
        import evaluate
    except ImportError:  # the job's own `import evaluate` reports it
        return
    original = evaluate.load

    @functools.wraps(original)
    def load(path, config_name=None, *args, **kwargs):
        try:
            return original(path, config_name, *args, **kwargs)
        except Exception as e:
            if _is_local(path) or not _dataset_missing(e):
                raise
            return standin_metric(path, config_name)

    evaluate.load = load
    loading = sys.modules.get("evaluate.loading")
    if loading is not None and getattr(loading, "load", None) is original:
        loading.load = load


class StandinMetric:
    """A hub metric's stand-in: the interface evaluation loops use (`add_batch`, `add`, `compute`) and
    the keys the real metric reports, computed from the predictions and references it is given."""

    def __init__(self, name: str, config_name=None):
        self.name, self.config_name = name, config_name
        base = name.rstrip("/").rsplit("/", 1)[-1]
        self.keys = _METRIC_KEYS.get((base, config_name)) or _METRIC_KEYS.get(base) or ("accuracy",)
        self._predictions: list = []
        self._references: list = []

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        self._predictions += _as_list(predictions)
        self._references += _as_list(references)

    def add(self, *, prediction=None, reference=None, **kwargs):
        self.add_batch(predictions=[prediction], references=[reference])

    def compute(self, *, predictions=None, references=None, **kwargs):
        if predictions is not None or references is not None:
            self.add_batch(predictions=predictions, references=references)
        preds, refs = self._predictions, self._references
        self._predictions, self._references = [], []
        if not refs:
            return None  # as evaluate answers on a process with nothing to compute
        return {k: _score(k, preds, refs) for k in self.keys}


def _as_list(values) -> list:
    if values is None:
        return []
    if hasattr(values, "tolist"):  # tensors and arrays
        values = values.tolist()
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _score(key: str, preds: list, refs: list) -> float:
    n = min(len(preds), len(refs))
    preds, refs = preds[:n], refs[:n]
    if key in ("accuracy", "exact_match"):
        return sum(p == r for p, r in zip(preds, refs)) / n if n else 0.0
    if key in ("mse", "mae"):
        errs = [float(p) - float(r) for p, r in zip(preds, refs)]
        return sum(e * e if key == "mse" else abs(e) for e in errs) / n if n else 0.0
    if key in ("pearson", "pearsonr", "spearmanr"):
        xs, ys = [float(p) for p in preds], [float(r) for r in refs]
        if key == "spearmanr":
            xs, ys = _ranks(xs), _ranks(ys)
        return _correlation(xs, ys)
    positive = 1  # binary labels: the positive class, as the metrics' default pos_label
    tp = sum(p == positive and r == positive for p, r in zip(preds, refs))
    fp = sum(p == positive and r != positive for p, r in zip(preds, refs))
    fn = sum(p != positive and r == positive for p, r in zip(preds, refs))
    tn = n - tp - fp - fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    if key == "precision":
        return precision
    if key == "recall":
        return recall
    if key == "matthews_correlation":
        den = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
        return (tp * tn - fp * fn) / den if den else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0  # f1 and its variants


def _ranks(xs: list) -> list:
    order = sorted(range(len(xs)), key=xs.__getitem__)
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _correlation(xs: list, ys: list) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sx = sum((x - mx) ** 2 for x in xs) ** 0.5
    sy = sum((y - my) ** 2 for y in ys) ** 0.5
    return cov / (sx * sy) if sx and sy else 0.0


def standin_metric(name: str, config_name=None) -> StandinMetric:
    metric = StandinMetric(name, config_name)
    which = f"{name}" + (f" ({config_name})" if config_name else "")
    _note(f"metric {which} not cached: used a stand-in computing {', '.join(metric.keys)} from the predictions "
          "and references the job gives it")
    return metric


# -- attention kernels, hub writes -------------------------------------------------------------------

def _attention() -> None:
    from transformers import PreTrainedModel

    check = getattr(PreTrainedModel, "_check_and_adjust_attn_implementation", None)
    if check is None:
        return

    @functools.wraps(check)
    def adjusted(self, attn_implementation, *args, **kwargs):
        try:
            return check(self, attn_implementation, *args, **kwargs)
        except (ImportError, ValueError):
            if not isinstance(attn_implementation, str) or "flash" not in attn_implementation and "/" not in attn_implementation:
                raise
            _note(f"attn_implementation={attn_implementation!r}: its kernel is not installed here, the dry run "
                  "uses sdpa (shapes, dtypes and wrapping are the same)")
            return check(self, "sdpa", *args, **kwargs)

    PreTrainedModel._check_and_adjust_attn_implementation = adjusted


def _hub_writes() -> None:
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoUrl
    except ImportError:
        return

    def create_repo(self, repo_id, *args, **kwargs):
        _note(f"push_to_hub: the hub repository {repo_id} was not created (the dry run never writes to the hub)")
        # The real call answers with the repository under the user's namespace when none is given.
        full = repo_id if "/" in str(repo_id) else f"dry-run/{repo_id}"
        return RepoUrl(f"https://huggingface.co/{full}")

    def skipped(self, *args, **kwargs):
        _note("push_to_hub: nothing was uploaded (the dry run never writes to the hub)")
        return None

    HfApi.create_repo = create_repo
    for name in ("upload_folder", "upload_file", "create_commit", "upload_large_folder"):
        if hasattr(HfApi, name):
            setattr(HfApi, name, skipped)
