"""One simulated rank: `python -m fsdplint.run.child SPEC.json`.

Runs the job's entry (a script path, `-m module`, or a console script) with `runpy` and the
`sys.argv` the launcher gives it, in the dry-run world, and writes what it reached to the result
file named in the spec. The launcher's environment (RANK, LOCAL_RANK, WORLD_SIZE, accelerate's
ACCELERATE_*/FSDP_*) is set by the parent.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    started = time.perf_counter()
    result = {"rank": spec["rank"], "point": "start", "findings": [], "memory": None, "notes": [],
              "exception": None}
    try:
        _run(spec, result, started)
    finally:
        result["seconds"] = round(time.perf_counter() - started, 2)
        with open(spec["result"], "w") as f:
            json.dump(result, f)
    return 0


def _run(spec: dict, result: dict, started: float) -> None:
    import logging
    import warnings

    from fsdplint.run import errors, sentinel

    if "HF_HUB_OFFLINE" not in os.environ:
        os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        result["notes"].append("HF_HUB_OFFLINE=1 (the environment did not set it): nothing was downloaded")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.simplefilter("ignore")
    for name in ("bitsandbytes", "peft", "accelerate", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)

    from fsdplint.run import autocast, models, standins, world, wraps

    world.import_stack()
    world.install(spec["world_size"], spec["rank"], spec["local_world_size"], spec["gpu_memory"])
    models.install(spec["world_size"])
    standins.install()  # hub data, tokenizers and kernels this machine cannot load
    wraps.install()
    sentinel.install()
    from fsdplint.run import ranks

    ranks.install(spec["rank"], spec.get("user_root") or spec.get("cwd") or os.getcwd(),
                  os.path.dirname(os.path.abspath(spec["result"])))
    autocast.install(sentinel.autocast_unemulated, sentinel.autocast_used)  # CUDA autocast's casts, on the CPU

    def on_stop(point, model, optimizer):
        if model is None:
            return
        from fsdplint.run import live

        ranks.at_stop(model)
        try:
            result["findings"] = live.checks(model, optimizer)
            if point == "step":
                result["findings"] += live.step_checks(model, optimizer, live.checkpointing(model))
            result["settings"] = live.settings(model, optimizer, sentinel.PROGRESS.batch, spec["world_size"])
        except Exception as e:  # the dry run's own failure: reported, not the job's
            result["notes"].append(f"the runtime checks could not inspect the model: {errors.one_line(e)}")
        if point == "step" and spec.get("until") == "save":
            ranks.resume_job()

    sentinel.PROGRESS.on_stop = on_stop
    if spec.get("until") == "save":
        from fsdplint.run import saving

        saving.install(spec["rank"], spec["writes"])
        sentinel.PROGRESS.until = "save"
        sentinel.PROGRESS.after_step = saving.after_first_step
    sys.argv = [spec["argv0"], *spec["args"]]
    cwd = spec.get("cwd") or os.getcwd()
    os.chdir(cwd)
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        if spec["kind"] == "path":
            sys.path.insert(0, os.path.dirname(os.path.abspath(spec["entry"])))
            runpy.run_path(spec["entry"], run_name="__main__")
        elif spec["kind"] == "module":
            runpy.run_module(spec["entry"], run_name="__main__", alter_sys=True)
        else:  # a console script: "module:function"
            import importlib

            mod, _, fn = spec["entry"].partition(":")
            target = importlib.import_module(mod)
            for part in fn.split("."):
                target = getattr(target, part)
            target()
        result["point"] = "end"
        _at_end(spec, result, cwd, started)
    except sentinel.ReachedStop as stop:
        result["point"] = stop.point
        result["autocast_stop"] = sentinel.PROGRESS.autocast_stop
        result["stop_frame"] = errors.user_frame(stop.__traceback__, spec.get("user_root") or cwd)
        if sentinel.PROGRESS.stepped:  # `--until save`: the step's findings are at the step's line
            result["stop_frame"] = errors.deepest_user_frame(sentinel.PROGRESS.step_stack,
                                                             spec.get("user_root") or cwd)
        result["stopped_after"] = round(time.perf_counter() - started, 2)
        try:
            _full_size(spec, result)
        except Exception as e:  # noqa: BLE001 - the dry run's own limit, not the job's
            result["notes"].append(f"no memory table: the audit of the real config failed ({errors.one_line(e)})")
    except SystemExit as e:
        result["point"] = "exit"
        _at_end(spec, result, cwd, started)
        if e.code not in (None, 0):
            result["exception"] = {"text": f"SystemExit: {e.code}", "code": errors.JOB_RAISED, "frame": None}
    except BaseException as e:  # noqa: BLE001 - every failure of the job is the report
        frame = errors.user_frame(e.__traceback__, spec.get("user_root") or cwd)
        result["exception"] = {"text": errors.one_line(e), "code": errors.rule_for(str(e)), "frame": frame,
                               "traceback": traceback.format_exc(limit=-8)}
    result["reached"] = list(sentinel.PROGRESS.points)
    if spec.get("until") == "save":
        from fsdplint.run import saving

        result["saves"] = saving.record()
        if result["saves"]:
            result["reached"].append("save")
    result["holds"] = ranks.record()  # what each wrap held, the collectives entered (see ranks)
    result["notes"].extend(ranks.RECORD["notes"])
    result["notes"].extend(models.NOTES)
    result["notes"].extend(standins.NOTES)
    result["notes"].extend(sorted(sentinel.PROGRESS.notes))


def _at_end(spec: dict, result: dict, cwd: str, started: float) -> None:
    """A job that wrapped a model but ended without an optimizer step (a forward-only script, a
    `max_steps=0` run): the checks run on what it left, reported at its first training forward."""
    from fsdplint.run import errors, sentinel

    model = sentinel.PROGRESS.wrapped_model()
    if model is None or sentinel.PROGRESS.on_stop is None:
        return
    if sentinel.PROGRESS.stepped:  # `--until save`, no save on this rank: its first step was checked
        frame = errors.deepest_user_frame(sentinel.PROGRESS.step_stack, spec.get("user_root") or cwd)
    else:
        sentinel.PROGRESS.on_stop("end", model, sentinel.PROGRESS.optimizer())
        frame = errors.deepest_user_frame(sentinel.PROGRESS.forward_stack, spec.get("user_root") or cwd)
    if frame:
        result["stop_frame"] = frame
    result["stopped_after"] = round(time.perf_counter() - started, 2)
    try:
        _full_size(spec, result)
    except Exception as e:  # noqa: BLE001 - the dry run's own limit, not the job's
        result["notes"].append(f"no memory table: the audit of the real config failed ({errors.one_line(e)})")


def _full_size(spec: dict, result: dict) -> None:
    """What the memory table of the real config is computed from (see fullsize); the first simulated
    rank also computes it, while the others train, and the parent reuses it for every rank that
    reports the same settings."""
    from fsdplint.run import fullsize, models

    settings = result.get("settings")
    if not settings or not models.REAL:
        return
    wrapped_classes = set(settings.pop("classes", None) or ())
    real = next((r for r in models.REAL if r["cls"] in wrapped_classes), models.REAL[0])
    result["full_size_input"] = {"real": real, "settings": settings}
    if spec.get("audit"):
        fullsize.attach(result, fullsize.audit(result["full_size_input"], spec["gpu_memory"]), spec["rank"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
