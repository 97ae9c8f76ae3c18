"""Reading a tool config: recognise the tool by the file's keys, then let its reader fill the job."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from fsdplint.launch.settings import Setting
from fsdplint.launch.tools.job import Job, mapping_values, yaml_tree


def recognise(text: str, filename: str, *, recipes: bool = False) -> Optional[str]:
    """"axolotl" / "llamafactory" / "oumi" when the YAML text is such a config (by its keys), else None;
    with `recipes`, also "recipe" for a trl / alignment-handbook recipe (model side only)."""
    if "base_model" not in text and "model_name" not in text:
        return None  # cheap pre-filter: the tools name the model base_model, model_name_or_path or model_name
    root = yaml_tree(text, filename)
    if root is None:
        return None
    keys = {str(k.value) for k, _ in root.value}
    import fsdplint.launch.tools.axolotl as axolotl
    import fsdplint.launch.tools.llamafactory as llamafactory
    import fsdplint.launch.tools.oumi as oumi

    if axolotl.looks_like(keys):
        return "axolotl"
    if llamafactory.looks_like(keys):
        return "llamafactory"
    nested = {f"{k.value}.{kk.value}" for k, v in root.value if isinstance(v, yaml_mapping())
              for kk, _ in v.value}
    if oumi.looks_like(keys, nested):
        return "oumi"
    if recipes:
        import fsdplint.launch.tools.recipe as recipe

        if recipe.looks_like(keys):
            return "recipe"
    return None


def yaml_mapping():
    import yaml

    return yaml.MappingNode


def read_job(text: str, filename: str, *, path: Optional[Path] = None, explicit: Optional[dict] = None,
             use_installed: bool = True, versions: Optional[dict] = None, recipes: bool = False) -> Optional[Job]:
    """The job a tool config describes, or None when `text` is no tool config.

    `versions`: resolved library versions by package (TargetVersion) for version-dependent
    tool behaviour (e.g. transformers/bitsandbytes for LLaMA-Factory's quant storage)."""
    tool = recognise(text, filename, recipes=recipes)
    if tool is None:
        return None
    values = mapping_values(yaml_tree(text, filename), filename)
    return job_from_values(tool, filename, text, values, path=path, explicit=explicit,
                           use_installed=use_installed, versions=versions)


def job_from_values(tool: str, filename: str, text: str, values: dict[str, Setting], *, path: Optional[Path] = None,
                    explicit: Optional[dict] = None, use_installed: bool = True,
                    versions: Optional[dict] = None) -> Job:
    """The job for a tool from its settings by key (as a YAML file or a launcher's `--key value`
    flags give them; nested keys as "fsdp_config.<key>"), each with the file and line it came from."""
    import fsdplint.launch.tools.axolotl as axolotl
    import fsdplint.launch.tools.llamafactory as llamafactory
    from fsdplint.launch.tools.defaults import tool_version

    import fsdplint.launch.tools.oumi as oumi
    import fsdplint.launch.tools.recipe as recipe

    tv = tool_version(tool, path, explicit or {}, use_installed) if tool in ("axolotl", "llamafactory") else None
    reader = {"axolotl": axolotl, "llamafactory": llamafactory, "oumi": oumi, "recipe": recipe}[tool]
    job = Job(tool, filename, text, dict(values), tv)
    reader.fill(job, versions or {}, path)
    return job


