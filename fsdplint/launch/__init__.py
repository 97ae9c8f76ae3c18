"""How a project launches its scripts: the one place that turns a project into launches.

`shell` reads launch commands (shell scripts, and the shell blocks `docs` finds in Markdown/RST),
`settings` the FSDP settings they carry (accelerate configs, `accelerate launch` flags, TrainingArguments),
`arguments` what a script's parser makes of a launch's arguments and recipes, `recipes` the lone recipes
that fit a script's parser (candidate launches), `runs` one lint per launch,
`tools` the training-tool configs (axolotl, LLaMA-Factory, trl recipes) read as jobs.

The package sits below the analysis: it imports nothing from `fsdplint.analysis`, the engine, the rules,
the audit, the run or the output (tests/test_layout.py states the floor).
"""
