"""Training-tool configs (axolotl, LLaMA-Factory, Oumi) read as jobs.

Many QLoRA + FSDP jobs have no training code of their own: the job is a YAML file for a tool
that builds the model, the quantization config, the adapter and the FSDP plugin from it. A
reader per tool turns such a file — recognised by its content, whatever its name — into a `Job`:
what the tool will build at run time (4-bit or 8-bit base and the storage dtype the tool gives
it, adapter and LoRA targets, device_map, FSDP version and settings), each value with the YAML
line it was written on. What the tool does itself (e.g. axolotl sets a float quant storage for
QLoRA + FSDP; LLaMA-Factory refuses 8-bit under FSDP) is encoded per tool version in the
readers and `defaults.py`, so the rules report only what the tool does not catch.

The rules check a job through `ctx.options["job"]` (see `Job.gate`), and its FSDP settings as
ordinary launch facts (`fsdplint.launch.settings.LaunchFacts`), so the existing launch checks apply too.
"""

TOOLS = ("axolotl", "llamafactory", "oumi")
