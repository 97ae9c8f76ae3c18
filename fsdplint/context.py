"""What a rule sees while it checks one file."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

import libcst as cst

from fsdplint import versions
from fsdplint.fixes import FixSpec

if TYPE_CHECKING:  # pragma: no cover
    from fsdplint.analysis import ScriptAnalysis
    from fsdplint.rule import Rule


class Report:
    __slots__ = ("rule", "node", "message", "fix", "setting", "related")

    def __init__(self, rule, node, message, fix, setting=None, related=()) -> None:
        self.rule, self.node, self.message, self.fix = rule, node, message, fix
        # A launch-config setting outside the script (a YAML line) the finding points at.
        self.setting = setting
        # Other nodes the finding depends on (perhaps in another module of the project): related locations.
        self.related = tuple(related)


class LintContext:
    def __init__(
        self,
        *,
        filename: str,
        path: Optional[Path],
        source: str,
        module: cst.Module,
        explicit_targets: Mapping[str, str] = {},
        config_targets: Mapping[str, str] = {},
        config_source: str = "[tool.fsdplint]",
        options: Mapping[str, Any] = {},
        rule_options: Mapping[str, Mapping[str, Any]] = {},
        use_installed: bool = True,
        project: Any = None,
        collector: Any = None,
    ) -> None:
        self.filename = filename
        self.path = path
        self.source = source
        self.module = module
        self.options = options
        self._explicit = explicit_targets
        self._config = config_targets
        self._config_source = config_source
        self._rule_options = rule_options
        self._use_installed = use_installed
        # The project the file belongs to (fsdplint/analysis/index.py), None for a lone file.
        self.project = project
        self._collector = collector  # the collector of a parse another file's analysis already made
        self._versions: dict[str, versions.TargetVersion] = {}
        self.reports: list[Report] = []
        self._mentioned: list = []  # nodes of other modules whose line a message names (see `line`)
        self.rule: Optional[type["Rule"]] = None

    @cached_property
    def analysis(self) -> "ScriptAnalysis":
        from fsdplint.analysis import ScriptAnalysis

        from fsdplint import launch as launch_mod

        a = ScriptAnalysis(self.module, self._collector, project=self.project, path=self.path if self.project is not None else None)
        if self.project is not None and a.path is not None:
            self.project.remember(a.path, self.source, self.module, a.c)
        yaml_facts = self.options.get("launch")
        if yaml_facts is None and self.path is not None and self.options.get("discover_launch", True):
            yaml_facts = launch_mod.find_accelerate_config(self.path)
        script_facts = launch_mod.from_script(a)
        facts = yaml_facts.merged(script_facts) if (yaml_facts and script_facts) else (yaml_facts or script_facts)
        if facts is not None:
            a.launch = facts
            a.launch_fsdp_version = facts.fsdp_version
        return a

    def version(self, package: str) -> versions.TargetVersion:
        if package not in self._versions:
            self._versions[package] = versions.resolve(
                package, self.path, self._explicit, self._config, self._config_source, self._use_installed
            )
        return self._versions[package]

    def option(self, name: str, default: Any = None) -> Any:
        if self.rule is None:
            return default
        return self._rule_options.get(self.rule.code, {}).get(name, default)

    @cached_property
    def positions(self):
        """Positions of nodes, computed per top-level statement on first use."""
        from fsdplint.positions import Positions

        return Positions(self.module, self.source, self.analysis.c.top)

    def line(self, node: cst.CSTNode) -> int:
        """1-based line of a node. For a node of another module of the project: the line of the call in
        this file that runs it (the next report names the other place as a related location)."""
        if id(node) not in self.analysis.c.top:
            from fsdplint.analysis.index import locate

            hit = locate(self.analysis, node)
            if hit is not None:
                self._mentioned.append(node)
                if hit[1] is None:
                    return hit[0].start.row
                node = hit[1].node
        return self.positions.range(node)[0].row

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def report(self, node: cst.CSTNode, message: Optional[str] = None, *, fix: Optional[FixSpec] = None,
               related: tuple = ()) -> None:
        """Report at `node`. A node of another module of the project is reported at the call in this file
        through which it runs, naming the other place (the engine does that); `related`: nodes (or events)
        the finding depends on, shown as related locations when they sit in another module."""
        rule = self.rule
        assert rule is not None, "report() outside a rule"
        nodes = tuple(getattr(r, "node", r) for r in related) + tuple(self._mentioned)
        self._mentioned.clear()
        self.reports.append(Report(rule, node, message or getattr(rule, "message", rule.summary), fix, related=nodes))

    def report_setting(self, setting, message: Optional[str] = None, *, fix: Optional[FixSpec] = None, fallback=None) -> None:
        """Report at a launch-config setting: its script node, or its line in the YAML file."""
        if setting is not None and setting.node is not None:
            self.report(setting.node, message, fix=fix)
        elif setting is not None and setting.filename:
            rule = self.rule
            self.reports.append(Report(rule, None, message or getattr(rule, "message", rule.summary), None, setting))
        elif fallback is not None:
            self.report(fallback, message, fix=fix)
