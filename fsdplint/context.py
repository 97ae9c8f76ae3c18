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
    __slots__ = ("rule", "node", "message", "fix", "setting")

    def __init__(self, rule, node, message, fix, setting=None) -> None:
        self.rule, self.node, self.message, self.fix = rule, node, message, fix
        # A launch-config setting outside the script (a YAML line) the finding points at.
        self.setting = setting


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
        self._versions: dict[str, versions.TargetVersion] = {}
        self.reports: list[Report] = []
        self.rule: Optional[type["Rule"]] = None

    @cached_property
    def analysis(self) -> "ScriptAnalysis":
        from fsdplint.analysis import ScriptAnalysis

        from fsdplint import launch as launch_mod

        run = self.options.get("run")
        launch = run.launch if run is not None else None
        env, dirs = None, ()
        if "add_argument" in self.source or "Parser" in self.source:
            from fsdplint import arguments
            from fsdplint.runs import base_dirs

            try:
                defs = arguments.parse_definitions(self.source, self._use_installed)
                if defs is not None:
                    dirs = base_dirs(run, self.path)
                    env = arguments.bind(defs, launch, dirs)
            except (RecursionError, ValueError, TypeError, AttributeError, KeyError, IndexError):
                env = None  # the arguments stay unknown: the analysis goes on without them
        a = ScriptAnalysis(self.module, env=env)
        yaml_facts = self.options.get("launch")
        if yaml_facts is None and launch is not None:
            if not dirs:
                from fsdplint.runs import base_dirs

                dirs = base_dirs(run, self.path)
            yaml_facts = launch_mod.from_launcher(launch, dirs)
        if yaml_facts is None and self.path is not None and self.options.get("discover_launch", True):
            yaml_facts = launch_mod.find_accelerate_config(self.path)
        script_facts = launch_mod.from_script(a)
        arg_facts = launch_mod.from_arguments(env, dirs) if env is not None else None
        if arg_facts is not None:
            script_facts = arg_facts.merged(script_facts) if script_facts is not None else arg_facts
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
        """1-based line of a node."""
        return self.positions.range(node)[0].row

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def report(self, node: cst.CSTNode, message: Optional[str] = None, *, fix: Optional[FixSpec] = None) -> None:
        rule = self.rule
        assert rule is not None, "report() outside a rule"
        self.reports.append(Report(rule, node, message or getattr(rule, "message", rule.summary), fix))

    def report_setting(self, setting, message: Optional[str] = None, *, fix: Optional[FixSpec] = None, fallback=None) -> None:
        """Report at a launch-config setting: its script node, or its line in the YAML file."""
        if setting is not None and setting.node is not None:
            self.report(setting.node, message, fix=fix)
        elif setting is not None and setting.filename:
            rule = self.rule
            self.reports.append(Report(rule, None, message or getattr(rule, "message", rule.summary), None, setting))
        elif fallback is not None:
            self.report(fallback, message, fix=fix)
