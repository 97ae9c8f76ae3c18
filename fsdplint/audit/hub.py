"""Where `fsdplint model ARG` finds its config: a file, a local model directory, or a hub model id.

Only `config.json` and `adapter_config.json` are ever read, never weights. A hub id goes through
huggingface_hub's cache (`models--org--name/snapshots/<rev>/`, `refs/main`), so a model that was
downloaded once, or a cache filled by `huggingface-cli download org/name config.json`, works offline;
with `HF_HUB_OFFLINE=1` (or `HF_HUB_OFFLINE` unset and no network) nothing but the cache is read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from fsdplint.errors import AuditInputError

# "org/name" or "name" (hub ids); "org/name@revision" picks a branch, tag or commit.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?(@[\w./-]+)?")
CONFIG = "config.json"
ADAPTER = "adapter_config.json"


@dataclass
class Resolved:
    config: Optional[Path]  # config.json (or an audit spec file)
    adapter: Optional[Path] = None  # adapter_config.json, when ARG names an adapter
    notes: list[str] = field(default_factory=list)


def looks_like_hub_id(arg: str) -> bool:
    if Path(arg).exists() or arg.endswith((".json", ".toml")) or arg.startswith((".", "/", "~")):
        return False
    return bool(_HUB_ID.fullmatch(arg)) and "/" in arg.split("@")[0]


def resolve(arg: str) -> Resolved:
    """The files behind ARG. A directory or hub repo holding only adapter_config.json is an adapter:
    its base model (`base_model_name_or_path`) is resolved the same way."""
    path = Path(arg)
    if path.is_dir():
        if (path / CONFIG).is_file():
            return Resolved(path / CONFIG)
        if (path / ADAPTER).is_file():
            return _adapter(path / ADAPTER, arg)
        raise AuditInputError(f"{path}: no {CONFIG} (or {ADAPTER}) in this directory")
    if path.exists() or not looks_like_hub_id(arg):
        return Resolved(path)
    repo, _, revision = arg.partition("@")
    found = hub_file(repo, CONFIG, revision or None)
    if found is not None:
        return Resolved(found, notes=[f"{CONFIG} of {arg} read from the Hugging Face cache ({found.parent})."])
    adapter = hub_file(repo, ADAPTER, revision or None)
    if adapter is not None:
        return _adapter(adapter, arg)
    raise AuditInputError(f"{arg}: no {CONFIG} or {ADAPTER} for this model id in the Hugging Face cache "
                          f"({cache_dir()}){_offline_hint()}")


def _adapter(adapter: Path, arg: str) -> Resolved:
    import json

    try:
        data = json.loads(adapter.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AuditInputError(f"{adapter}: cannot read the adapter config: {e}") from None
    base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    if not isinstance(base, str) or not base:
        raise AuditInputError(f"{adapter}: base_model_name_or_path: the adapter does not say which model it is for")
    inner = resolve(base)
    inner.adapter = adapter
    inner.notes.insert(0, f"{arg} is a LoRA adapter ({adapter}); base model {base}.")
    return inner


def cache_dir() -> Path:
    """huggingface_hub's cache, from the environment at call time (HF_HUB_CACHE, HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _offline_hint() -> str:
    return "; HF_HUB_OFFLINE is set, so nothing is downloaded" if offline() else ""


# Seconds to wait for the hub to answer before telling the user to work offline.
HUB_TIMEOUT_S = float(os.environ.get("FSDPLINT_HUB_TIMEOUT", "3") or 3)
_REACHED: dict = {}


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _unreachable(endpoint: str) -> Optional[str]:
    """Why the hub's host cannot be connected to within HUB_TIMEOUT_S (None when it can), once per run."""
    if endpoint in _REACHED:
        return _REACHED[endpoint]
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    why = None
    proxied = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or os.environ.get("HTTP_PROXY")
    if parts.hostname and not proxied:  # behind a proxy the direct connection says nothing
        try:
            socket.create_connection((parts.hostname, port), timeout=HUB_TIMEOUT_S).close()
        except OSError as e:
            why = f"no answer within {HUB_TIMEOUT_S:g} s" if isinstance(e, socket.timeout) else (e.strerror or str(e))
    _REACHED[endpoint] = why
    return why


def hub_file(repo: str, filename: str, revision: Optional[str]) -> Optional[Path]:
    """`filename` of hub repo `repo` through huggingface_hub: the cache first; the network only when
    HF_HUB_OFFLINE is not set. None when the repo has no such file."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        raise AuditInputError(f"{repo}: reading a hub model id needs huggingface_hub "
                              f"(pip install 'fsdplint[model]')") from None
    cache = cache_dir()
    hit = try_to_load_from_cache(repo, filename, cache_dir=str(cache), revision=revision)
    if isinstance(hit, str):
        return Path(hit)
    if hit is not None or offline():  # `_CACHED_NO_EXIST`: the hub said it has no such file
        return None
    unreachable = _unreachable(_endpoint())
    if unreachable:
        # huggingface_hub retries a refused connection for most of a minute; say at once what to do.
        raise AuditInputError(f"{repo}: {filename} is not in the Hugging Face cache ({cache}) and the hub "
                              f"({_endpoint()}) cannot be reached ({unreachable}): set HF_HUB_OFFLINE=1 to read "
                              "the cache only, or pass a local model directory or config.json")
    try:
        return Path(hf_hub_download(repo, filename, revision=revision, cache_dir=str(cache),
                                    etag_timeout=HUB_TIMEOUT_S))
    except EntryNotFoundError:
        return None
    except LocalEntryNotFoundError as e:
        raise AuditInputError(f"{repo}: {filename} is not in the Hugging Face cache ({cache}) and the hub cannot "
                              f"be reached: {' '.join(str(e).split())[:200]}") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise AuditInputError(f"{repo}: cannot read {filename} from the Hugging Face hub: "
                              f"{' '.join(str(e).split())[:200]}") from None
