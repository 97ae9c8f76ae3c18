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
    __slots__ = ("rule", "node", "message", "fix")

    def __init__(self, rule, node, message, fix) -> None:
        self.rule, self.node, self.message, self.fix = rule, node, message, fix


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

        a = ScriptAnalysis(self.module)
        launch = self.options.get("launch")
        if launch is not None:
            a.launch = launch
            a.launch_fsdp_version = getattr(launch, "fsdp_version", None)
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
    def _all_positions(self):
        from fsdplint.positions import Positions

        return Positions(self.module, self.source, None)

    def line(self, node: cst.CSTNode) -> int:
        """1-based line of a node (computed for the whole file once, on first use)."""
        return self._all_positions.range(node)[0].row

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def report(self, node: cst.CSTNode, message: Optional[str] = None, *, fix: Optional[FixSpec] = None) -> None:
        rule = self.rule
        assert rule is not None, "report() outside a rule"
        self.reports.append(Report(rule, node, message or getattr(rule, "message", rule.summary), fix))
