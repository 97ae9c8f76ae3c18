"""The shared analysis of a training script: which objects hold the model, and what happens to them, in order.

Rules query this instead of re-matching syntax. Each entry-point scope (module
body, functions not called from elsewhere in the file) becomes a `Timeline`:
its calls in evaluation order, with calls to helper functions of the same file
inlined, and a union-find over names so `model = FSDP(model)`,
`peft_model = get_peft_model(model, cfg)` and `model.module` all denote one
model. When the analysis cannot tell, it records nothing and rules stay silent.

The package: `records` (steps, events, refs), `timeline` (one program's order and queries),
`builder` (from collector records to timelines), `classes` (a class's methods as one program),
`linking` (calls into other modules of the project, run as if inlined), `index` (the project: its root,
imports between its modules, per-file fact sheets), `cache` (fact sheets on disk by content hash),
`values` (constants of expressions), `paths` (branch exclusivity, rank guards), `framework` (the FSDP wrap
accelerate's prepare, the HF/trl trainers or Composer do, with the job's plan), `script`
(`ScriptAnalysis`, the facade rules use).
"""

from fsdplint.analysis.builder import HOLDERS, MODEL_METHODS, SAME_MODEL_APIS, SAME_MODEL_METHODS, TRANSPARENT
from fsdplint.analysis.records import UNKNOWN, Event, Item, QName, Ref, Step, UnionFind
from fsdplint.analysis.script import ScriptAnalysis, analyze
from fsdplint.analysis.timeline import Timeline

__all__ = [
    "HOLDERS", "MODEL_METHODS", "SAME_MODEL_APIS", "SAME_MODEL_METHODS", "TRANSPARENT", "UNKNOWN", "Event", "Item",
    "QName", "Ref", "ScriptAnalysis", "Step", "Timeline", "UnionFind", "analyze",
]
