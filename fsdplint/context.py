"""What a rule sees while it checks one file."""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

import libcst as cst

from fsdplint import versions
from fsdplint.fixes import FixSpec

if TYPE_CHECKING:  # pragma: no cover
    from fsdplint.analysis import ScriptAnalysis
    from fsdplint.findings import Severity
    from fsdplint.rule import Rule


# Words that name FSDP in code: `FullyShardedDataParallel`, `fully_shard`, `fsdp_config`, "FSDP", ...
_FSDP_WORDS = re.compile(r"(?i)fsdp|fully_shard|FullyShardedDataParallel")
_COMMENTS_AND_DOCSTRINGS = re.compile(r'#[^\n]*|"{3}[\s\S]*?"{3}' + r"|'{3}[\s\S]*?'{3}")


def _code_only(text: str) -> str:
    """The source without comments and triple-quoted strings (docstrings): prose that mentions FSDP is
    not FSDP in the job."""
    return _COMMENTS_AND_DOCSTRINGS.sub(" ", text)


class Report:
    __slots__ = ("rule", "node", "message", "fix", "setting", "severity", "related")

    def __init__(self, rule, node, message, fix, setting=None, severity=None, related=()) -> None:
        self.rule, self.node, self.message, self.fix = rule, node, message, fix
        # A launch-config setting outside the script (a YAML line) the finding points at.
        self.setting = setting
        # None: the rule's own severity (a version-dependent finding on an unknown version is lower).
        self.severity = severity
        # Other nodes the finding depends on (perhaps in another module of the project): related locations.
        self.related = tuple(related)


_DEFINITIONS: dict = {}


def _definitions(source: str, use_installed: bool, finder, path):
    """The script's argument definitions, read once per file's lint: the lints under each launch and argument
    set (fsdplint/runs.py) read the same text (binding them to values leaves them as they are)."""
    from fsdplint.launch import arguments

    key = (source, use_installed, path, getattr(finder, "__self__", finder))
    if key not in _DEFINITIONS:
        _DEFINITIONS.clear()
        _DEFINITIONS[key] = arguments.parse_definitions(source, use_installed, finder, path)
    return _DEFINITIONS[key]


def forget_definitions() -> None:
    """A new file's lint: the definitions read from other modules may have changed since."""
    _DEFINITIONS.clear()


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
        strict_versions: bool = False,
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
        self.strict_versions = strict_versions
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

        from fsdplint.launch import settings as launch_mod

        run = self.options.get("run")
        launch = run.launch if run is not None else None
        env, dirs = None, ()
        from fsdplint.launch import arguments

        if "Parser" in self.source or arguments.might_parse_arguments(self.source):
            from fsdplint.launch.runs import base_dirs

            try:
                finder = self.project.find_module if self.project is not None and self.path is not None else None
                defs = _definitions(self.source, self._use_installed, finder,
                                    self.path.resolve() if finder is not None else None)
                if defs is not None:
                    dirs = base_dirs(run, self.path)
                    env = arguments.bind(defs, launch, dirs, run.free if run is not None else frozenset())
            except (RecursionError, ValueError, TypeError, AttributeError, KeyError, IndexError):
                env = None  # the arguments stay unknown: the analysis goes on without them
        a = ScriptAnalysis(self.module, self._collector, env=env, project=self.project,
                           path=self.path if self.project is not None else None)
        if self.project is not None and a.path is not None:
            self.project.remember(a.path, self.source, self.module, a.c)
        yaml_facts = self.options.get("launch")
        if yaml_facts is None and launch is not None:
            if not dirs:
                from fsdplint.launch.runs import base_dirs

                dirs = base_dirs(run, self.path)
            yaml_facts = launch_mod.from_launcher(launch, dirs)
        if launch is not None and getattr(launch, "env", None):
            env_launch = launch_mod.from_launch_env(launch)
            if env_launch is not None and (yaml_facts is None or yaml_facts.fsdp_version is None
                                           or launch.launcher != "accelerate"):
                # The environment the launcher exports (accelerate launch's own FSDP config replaces it).
                yaml_facts = env_launch.merged(yaml_facts) if yaml_facts is not None else env_launch
        if yaml_facts is None and self.path is not None and self.options.get("discover_launch", True) and (
                launch is None or launch.launcher == "accelerate"):
            # (Under a launch that names no FSDP config: `accelerate launch` without --config_file may still
            # mean the project's config; `python train.py` and `torchrun` never read one.)
            yaml_facts = launch_mod.find_accelerate_config(self.path)
            if yaml_facts is None:
                from fsdplint.launch.tools.jobs import launcher_config

                # An accelerate config elsewhere (configs/fsdp.yaml) that a launcher names with this script.
                yaml_facts = launcher_config(self.path, self.options.get("project_root"))
        script_facts = launch_mod.from_script(a)
        if script_facts is not None and script_facts.fsdp_version is not None and script_facts.get("version") is None \
                and script_facts.get("sharding") is not None:
            from fsdplint.launch.tools.defaults import trainer_fsdp_version

            # TrainingArguments(fsdp=...) without a version: the Trainer's default, by transformers version.
            script_facts.fsdp_version, _ = trainer_fsdp_version(self.version("transformers", a.c))
        arg_facts = launch_mod.from_arguments(env, dirs) if env is not None else None
        if arg_facts is not None and arg_facts.fsdp_version is not None and arg_facts.get("version") is None \
                and arg_facts.get("sharding") is not None:
            from fsdplint.launch.tools.defaults import trainer_fsdp_version

            # `--fsdp "full_shard auto_wrap"` on the command line: the same default as TrainingArguments(fsdp=...).
            arg_facts.fsdp_version, _ = trainer_fsdp_version(self.version("transformers", a.c))
        if arg_facts is not None:
            script_facts = arg_facts.merged(script_facts) if script_facts is not None else arg_facts
        facts = yaml_facts.merged(script_facts) if (yaml_facts and script_facts) else (yaml_facts or script_facts)
        env_facts = launch_mod.from_environ(a) if "environ" in self.source else None
        if env_facts is not None and facts is not None:
            env_facts.source, env_facts.text = env_facts.source or facts.source, env_facts.text or facts.text
            facts = env_facts.merged(facts) if env_facts.fsdp_version is not None or facts.fsdp_version is None \
                else launch_mod.with_environ(facts, env_facts)
        elif env_facts is not None and env_facts.fsdp_version is not None:
            facts = env_facts  # `os.environ["ACCELERATE_USE_FSDP"] = "true"` before Accelerator(): FSDP without a launcher
        if facts is not None:
            a.launch = facts
            a.launch_fsdp_version = facts.fsdp_version
        return a

    @cached_property
    def fsdp_in_job(self) -> bool:
        """Whether FSDP is part of the job this file belongs to: the file uses it (an FSDP call or import,
        `fsdp=`/`fsdp_config=` settings, an FSDP plugin, FSDP names in code), or its launch config enables
        it. `options["fsdp_in_job"]` (set by whoever knows the rest of the job) overrides. A file with no
        FSDP anywhere gets no finding of a rule that needs FSDP (`Rule.needs_fsdp`)."""
        given = self.options.get("fsdp_in_job")
        if given is not None:
            return bool(given)
        launch = self.options.get("launch")
        if launch is not None and getattr(launch, "uses_fsdp", False):
            return True
        if not _FSDP_WORDS.search(self.source):
            # A launch config found next to the script may still enable it, or the project's other modules
            # that this file's programs run may wrap the model.
            a = self.analysis
            return (a.launch is not None and a.launch.uses_fsdp) or bool(a.foreign_calls and a.uses_fsdp)
        if _FSDP_WORDS.search(_code_only(self.source)):
            return True
        a = self.analysis
        return a.uses_fsdp or (a.launch is not None and a.launch.uses_fsdp)

    def version(self, package: str, _collector=None) -> versions.TargetVersion:
        """The target version of `package`: declared, pinned or installed, else what this file's code
        proves (an import that exists only from some release), else unknown (see versions.py).
        `_collector`: the file's records, for use while the analysis itself is being built."""
        if package not in self._versions:
            tv = versions.resolve(
                package, self.path, self._explicit, self._config, self._config_source, self._use_installed,
                stop=self.options.get("project_root"),
            )
            resolving = self.__dict__.setdefault("_resolving", set())
            if tv.kind == "installed" and package not in resolving:
                from fsdplint import behaviour

                resolving.add(package)  # a table that names packages in a cycle cannot recurse forever
                try:
                    why = behaviour.excluded_installed(package, tv, self.version)
                finally:
                    resolving.discard(package)
                if why is not None:
                    # The project pins a release that cannot run the installed one: the installed one is not
                    # what the project runs, so its version is unknown (the oldest one covered is assumed).
                    tv = versions.TargetVersion(package, versions.Version(versions.DEFAULTS[package]),
                                                f"unknown: {why}; assumed the oldest version fsdplint covers",
                                                "unknown")
            if tv.kind == "unknown":
                ev = versions.proven(package, _collector if _collector is not None else self.analysis.c)
                if ev is not None:
                    line = self.line(ev.node)
                    tv = versions.TargetVersion(
                        package, ev.version,
                        f"this module already needs {package} >= {ev.version}: `{ev.what}` (line {line}); "
                        f"the project declares no version", "code", line)
            self._versions[package] = tv
        return self._versions[package]

    def proven_by_job(self, package: str) -> Optional["versions.Evidence"]:
        """A release the job's launch setup already needs, from the behaviour table: accelerate's FSDP2
        (fsdp_version 2 in a launch config or plugin) raises ImportError on torch < 2.6."""
        from fsdplint import behaviour

        if package != "torch":
            return None
        launch = getattr(self.analysis, "launch", None)
        if launch is None or launch.fsdp_version != 2:
            return None
        if behaviour.holds("accelerate_fsdp2_requires_torch_2_6", self.version("accelerate")) is False:
            return None
        setting = launch.get("version") or launch.get("fsdp_version")
        return versions.Evidence("torch", versions.Version("2.6"), getattr(setting, "node", None),
                                 "accelerate's FSDP2 (fsdp_version=2) refuses torch < 2.6",
                                 behaviour.cite("accelerate_fsdp2_requires_torch_2_6"))

    def version_severity(self, tv: versions.TargetVersion) -> Optional["Severity"]:
        """The severity of a finding that holds only on the version `tv`: the rule's own when the
        version is known (or `strict-versions = true`), else a warning (None: the rule's own)."""
        from fsdplint.findings import Severity

        if tv.known or self.strict_versions or self.rule is None:
            return None
        return Severity.WARNING if self.rule.severity == Severity.ERROR else None

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
        else:
            self._mentioned.append(node)  # a place of this file the finding names (its `if`s may matter)
        return self.positions.range(node)[0].row

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def unverified(self, rests_on: Iterable[str]) -> str:
        """Why a finding resting on these behaviour entries (behaviour.py keys) is not established at the
        target versions: their deciding boundary was not read at two adjacent releases; "" when it was."""
        from fsdplint import behaviour

        whys = []
        for key in rests_on:
            if key is None or key not in behaviour.BEHAVIOURS:
                continue
            why = behaviour.unverified(key, self.version(behaviour.BEHAVIOURS[key].package))
            if why and why not in whys:
                whys.append(why)
        return "; ".join(whys)

    def _settle(self, message: Optional[str], severity, rests_on: Iterable[str]):
        """The message and severity of a finding that rests on behaviour entries: an error whose deciding
        boundary is unverified is a warning that says so."""
        from fsdplint.findings import Severity

        why = self.unverified(rests_on) if rests_on else ""
        if not why:
            return message, severity
        rule = self.rule
        message = (message or getattr(rule, "message", rule.summary)).rstrip()
        message = f"{message} ({why}: a warning until it is)"
        own = severity if severity is not None else rule.severity
        if Severity(own) == Severity.ERROR:
            severity = Severity.WARNING
        return message, severity

    def _selected(self, node, message: Optional[str], severity):
        """An error in code that runs only for some literal cases of a value nothing read gives (a builder for
        a few model names, a branch of `mode == "..."`) is a warning that names the case: whether any launch
        selects it is not known."""
        from fsdplint.findings import Severity

        rule = self.rule
        own = severity if severity is not None else rule.severity
        if Severity(own) != Severity.ERROR:
            return message, severity
        a = self.analysis
        target = getattr(node, "node", node)
        call = a.call_at(target) if hasattr(a, "selected_by") else None
        if call is None and isinstance(target, cst.Arg):  # `load_in_8bit=True` of a call: that call
            call = next((c for c in a.all_calls if any(arg is target for arg in c.node.args)), None)
        test = a.selected_by(call) if call is not None else None
        if test is None:
            return message, severity
        message = (message or getattr(rule, "message", rule.summary)).rstrip()
        return (f"{message} (this code runs only when {test}, which no launch or config that was read decides: "
                "a warning until the value is declared)"), Severity.WARNING

    def report(self, node: cst.CSTNode, message: Optional[str] = None, *, fix: Optional[FixSpec] = None,
               severity=None, related: tuple = (), rests_on: Iterable[str] = ()) -> None:
        """Report at `node` (or at an event: see below). A node of another module of the project is reported at the call in this file
        through which it runs, naming the other place (the engine does that); `related`: nodes (or events)
        the finding depends on, shown as related locations when they sit in another module."""
        rule = self.rule
        assert rule is not None, "report() outside a rule"
        # `rests_on`: the behaviour entries whose answer at the target version decided this finding.
        message, severity = self._settle(message, severity, rests_on)
        message, severity = self._selected(node, message, severity)
        step = getattr(node, "step", None)
        if step is not None:  # an event: at its node, or at the call in this file through which its module ran
            if getattr(step, "origin", None) is not None and getattr(step, "site", None) is not None:
                related, node = (node.node, *related), step.site.node
            else:
                node = node.node
        nodes = tuple(getattr(r, "node", r) for r in related) + tuple(self._mentioned)
        self._mentioned.clear()
        self.reports.append(Report(rule, node, message or getattr(rule, "message", rule.summary), fix,
                                   severity=severity, related=nodes))

    def report_setting(self, setting, message: Optional[str] = None, *, fix: Optional[FixSpec] = None, fallback=None,
                       severity=None, rests_on: Iterable[str] = ()) -> None:
        """Report at a launch-config setting: its script node, or its line in the YAML file."""
        message, severity = self._settle(message, severity, rests_on)
        if setting is not None and setting.node is not None:
            self.report(setting.node, message, fix=fix, severity=severity)
        elif setting is not None and setting.filename:
            rule = self.rule
            self.reports.append(Report(rule, None, message or getattr(rule, "message", rule.summary), None, setting,
                                       severity=severity))
        elif fallback is not None:
            self.report(fallback, message, fix=fix, severity=severity)

    def report_pin(self, setting, message: str, related, *, severity=None) -> None:
        """Report at a line of a file the linted file does not hold (a requirements pin), with `related` (a
        findings.Related, e.g. the setting in this file that the finding rests on)."""
        self.reports.append(Report(self.rule, None, message, None, setting, severity=severity, related=(related,)))
