"""Shell launch scripts: which script a command runs, with which arguments, launch options and lines."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fsdplint.launch.shell import launches_for, parse_launches, runs_script


def _launches(sh: str):
    return parse_launches(textwrap.dedent(sh), "run.sh")


def _args(launch):
    return [w.text for w in launch.args if not w.splat]


def test_continuations_variables_quotes_and_arrays():
    (l,) = _launches(
        """\
        #!/bin/bash
        MODEL=${MODEL:-meta-llama/Llama-3.1-8B}
        CFG="configs/fsdp.yaml"
        EXTRA=(--lora_r 16 --lora_alpha 32)
        # a comment that mentions --load_in_8bit
        accelerate launch --config_file "$CFG" \\
            --fsdp_version 2 \\
            scripts/train.py --model "$MODEL" --load_in_4bit \\
            "${EXTRA[@]}" --msg 'a b $MODEL' 2>&1 | tee log.txt
        """
    )
    assert (l.launcher, l.script, l.line) == ("accelerate", "scripts/train.py", 6)
    assert l.options["config_file"].text == "configs/fsdp.yaml"
    assert (l.options["fsdp_version"].text, l.options["fsdp_version"].line) == ("2", 7)
    assert _args(l) == ["--model", "meta-llama/Llama-3.1-8B", "--load_in_4bit", "--lora_r", "16", "--lora_alpha", "32",
                        "--msg", "a b $MODEL"]
    # each word keeps the line it is written on (array elements: where the array is assigned)
    assert [w.line for w in l.args[:3]] == [8, 8, 8] and l.args[3].line == 4
    assert not l.open_args


def test_export_and_unquoted_expansion_split_into_words():
    (l,) = _launches(
        """\
        export NPROC=8 FLAGS="--use_peft --load_in_4bit"
        torchrun --nproc_per_node $NPROC --standalone train.py $FLAGS
        """
    )
    assert l.launcher == "torchrun" and l.options["nproc_per_node"].text == "8"
    assert "standalone" in l.options and l.script == "train.py"
    assert _args(l) == ["--use_peft", "--load_in_4bit"]


def test_dollar_at_and_unknown_values_are_open():
    (l,) = _launches('python train.py --lr $(cat lr.txt) "$@"\n')
    assert l.open_args
    assert l.args[1].unknown and l.args[-1].splat


def test_unset_variable_is_unknown_not_empty():
    (l,) = _launches("python train.py --output_dir $OUT_DIR\n")
    assert l.args[1].unknown


def test_wrappers_srun_sbatch_env_nohup():
    got = _launches(
        """\
        srun -N 2 --gres=gpu:8 --ntasks-per-node 1 torchrun --nproc_per_node 8 train.py --fsdp "full_shard auto_wrap"
        sbatch --wrap "python -m pkg.train --x 1"
        CUDA_VISIBLE_DEVICES=0,1 nohup python -u train.py --a 1 &
        env WANDB_MODE=offline uv run accelerate launch --use_fsdp train.py
        """
    )
    assert [(l.launcher, l.script, l.module, l.line) for l in got] == [
        ("torchrun", "train.py", None, 1), ("python", None, "pkg.train", 2), ("python", "train.py", None, 3),
        ("accelerate", "train.py", None, 4)]
    assert _args(got[0]) == ["--fsdp", "full_shard auto_wrap"]
    assert "use_fsdp" in got[3].options


def test_ezpz_launch_runs_the_command_after_it():
    (l,) = _launches("ezpz launch python3 -m pkg.examples.hf_trainer --model_name_or_path m --fsdp=auto_wrap\n")
    assert (l.launcher, l.module, l.script) == ("python", "pkg.examples.hf_trainer", None)
    assert _args(l) == ["--model_name_or_path", "m", "--fsdp=auto_wrap"]
    # `ezpz` alone, or another sub-command, launches nothing
    assert _launches("ezpz test --model small\n") == []


def test_python_module_launchers():
    got = _launches(
        """\
        python -m torch.distributed.run --nnodes=1 --nproc_per_node=8 train.py --a
        python3 -m accelerate.commands.launch --use_fsdp train.py
        python -m my_pkg.sft --config recipe.yaml
        accelerate launch -m my_pkg.sft --b
        """
    )
    assert [(l.launcher, l.script, l.module) for l in got] == [
        ("torchrun", "train.py", None), ("accelerate", "train.py", None), ("python", None, "my_pkg.sft"),
        ("accelerate", None, "my_pkg.sft")]
    assert got[0].options["nproc_per_node"].text == "8"


def test_deepspeed_jobs_are_not_fsdp():
    got = _launches(
        """\
        deepspeed --num_gpus 8 train.py --deepspeed ds.json
        accelerate launch --use_deepspeed --zero_stage 3 train.py
        accelerate launch --use_fsdp train.py
        """
    )
    assert [l.is_fsdp_capable for l in got] == [False, False, True]


def test_control_flow_heredocs_and_non_launch_commands():
    got = _launches(
        """\
        if [ "$X" == 1 ]; then python train.py --b; fi
        for seed in 1 2 3; do
          python train.py --seed "$seed"
        done
        cat <<EOF > notes.txt
        python not_a_launch.py
        EOF
        echo python fake.py
        python -c "import train"
        """
    )
    assert [(l.script, l.line) for l in got] == [("train.py", 1), ("train.py", 3)]
    assert got[1].args[1].unknown  # the loop variable is not known


def test_runs_script_matches_trailing_path(tmp_path):
    script = tmp_path / "proj" / "scripts" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    (l1, l2, l3, l4) = _launches(
        """\
        python scripts/train.py
        python $ROOT/scripts/train.py
        python other/train.py
        python -m scripts.train
        """
    )
    assert runs_script(l1, script) and runs_script(l2, script) and runs_script(l4, script)
    assert not runs_script(l3, script)


def test_project_shell_scripts_are_found(tmp_path):
    root = tmp_path / "proj"
    (root / "scripts").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "train.py").write_text("print(1)\n")
    (root / "scripts" / "run.sh").write_text("cd ..\naccelerate launch --use_fsdp train.py --a\n")
    (root / "scripts" / "other.sh").write_text("python eval.py\n")
    (root / "scripts" / "ds.sh").write_text("deepspeed train.py\n")
    got = launches_for(root / "train.py")
    assert [(Path(l.file).name, l.line, l.launcher) for l in got] == [("run.sh", 2, "accelerate")]


def test_a_launcher_edited_between_runs_is_read_again(tmp_path):
    # A long-lived process (an editor's server) runs lint after lint: launchers are looked at once per run.
    from fsdplint.launch import shell

    root = tmp_path / "proj"
    (root / "scripts").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "train.py").write_text("print(1)\n")
    (root / "scripts" / "run.sh").write_text("cd ..\npython eval.py\n")
    assert launches_for(root / "train.py") == []
    (root / "scripts" / "run.sh").write_text("cd ..\n\naccelerate launch --use_fsdp train.py --a\n")
    shell.new_run()
    got = launches_for(root / "train.py")
    assert [(Path(l.file).name, l.line, l.launcher) for l in got] == [("run.sh", 3, "accelerate")]


_SHELLISH = " \t\n\\'\"$`(){}[]<>|&;#=-@*:0123456789abcdefpythonaccelerate.py/"


@settings(max_examples=int(os.environ.get("FSDPLINT_FUZZ_EXAMPLES", "200")), derandomize=True, deadline=None,
          database=None)
@given(st.text(alphabet=_SHELLISH, max_size=160), st.booleans())
@example("a=(x;", False)  # an operator inside an array literal once read forever
def test_any_text_reads_without_error_or_hang(text, as_launch):
    if as_launch:
        text = f"X=(a b)\naccelerate launch --use_fsdp {text} train.py {text}"
    for launch in parse_launches(text, "run.sh"):
        assert launch.script or launch.module
        assert all(w.line >= 1 for w in launch.args)


def test_environment_a_launch_gives_its_script():
    first, second, third = _launches(
        """\
        export ACCELERATE_USE_FSDP=true
        V=2
        export FSDP_VERSION=$V
        LOCAL=1
        FSDP_STATE_DICT_TYPE=SHARDED_STATE_DICT torchrun --nproc_per_node 8 train.py
        srun env FSDP_OFFLOAD_PARAMS=$UNSET python -m pkg.train
        python eval.py
        """
    )
    env = {k: (w.text, w.line) for k, w in first.env.items()}
    assert env == {"ACCELERATE_USE_FSDP": ("true", 1), "FSDP_VERSION": ("2", 3), "FSDP_STATE_DICT_TYPE": ("SHARDED_STATE_DICT", 5)}
    assert second.module == "pkg.train" and second.env["FSDP_OFFLOAD_PARAMS"].unknown
    # A `NAME=value cmd` prefix is for that command only; unrelated variables are not kept.
    assert set(third.env) == {"ACCELERATE_USE_FSDP", "FSDP_VERSION"}
