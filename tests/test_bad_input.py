"""Bad input to train.py and evaluate.py: one line saying what is wrong and how to fix it, a non-zero exit, nothing
written. Flags out of range (evaluate.py's too), unknown names, missing or empty prompt files, unreadable models and
checkpoints, a damaged checkpoint refused before anything loads (by evaluate.py too), and a resume whose settings
would not fit the checkpoint's saved state; other changed settings are printed, logged and applied
(tests/test_train.py's settings: the random-weight tiny SD3)."""

import dataclasses
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import checkpoint
import config
import evaluate
import train
from tests.test_train import FAST, ROOT, run


def _fails(tmp_path, capsys, argv, needle, program=train):
    out = tmp_path / "bad"
    with pytest.raises(SystemExit) as err:
        if program is train:
            train.main(config.parse_config(FAST + ["--output-dir", str(out), *argv]))
        else:
            evaluate.main(argv)
    message = str(err.value.code) if not isinstance(err.value.code, int) else capsys.readouterr().err
    assert err.value.code != 0 and needle in message, message
    assert len(message.strip().splitlines()) <= 3  # argparse adds its usage line; ours is one line
    assert not (out / "checkpoints").exists()


def test_unknown_task(tmp_path, capsys):
    _fails(tmp_path, capsys, ["--task", "nope"], "unknown task 'nope'")
    proc = subprocess.run([sys.executable, "train.py", "--task", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0 and "unknown task 'nope'" in proc.stderr


def test_bad_prompts_and_model(tmp_path, capsys):
    _fails(tmp_path, capsys, ["--prompts", str(tmp_path / "missing.txt")], "not found")
    (tmp_path / "empty.txt").write_text("\n\n")
    _fails(tmp_path, capsys, ["--prompts", str(tmp_path / "empty.txt")], "is empty")
    _fails(tmp_path, capsys, ["--model", str(tmp_path / "no-model")], "cannot load the SD3 pipeline")
    _fails(tmp_path, capsys, ["--algo", "ppo"], "unknown --algo 'ppo'")
    _fails(tmp_path, capsys, ["--completion", "ode:0"], "unknown completion 'ode:0'")
    _fails(tmp_path, capsys, ["--group-size", "3"], "must split evenly")


# every numeric field of Config: a value just outside its range, and the nearest value inside it (on a grid of T = 1
# steps with a window of 1, where every edge fits)
EDGES = {"resolution": (0, 1), "steps": (0, 1), "eval_steps": (0, 1), "guidance": (-0.5, 0.0),
         "eval_guidance": (-0.5, 0.0), "noise_level": (-0.1, 0.0), "judge_audit": (-1, 0),
         "audit_continuations": (1, 2), "window": (0, 1), "window_start": (-2, -1),
         "group_size": (1, 2), "prompts_per_iter": (0, 1), "sample_batch": (0, 1), "train_batch": (0, 1),
         "updates_per_iter": (0, 1), "lr": (0.0, 1e-12), "adam_beta1": (1.0, 0.0), "adam_beta2": (-0.1, 0.999999),
         "weight_decay": (-1e-4, 0.0), "adam_eps": (0.0, 1e-30), "max_grad_norm": (0.0, 1e-9),
         "clip_range": (0.0, 1e-9), "beta": (-1e-4, 0.0), "adv_clip": (0.0, 1e-3), "lora_rank": (-1, 0),
         "lora_alpha": (0, 1), "ema_decay": (1.0, 0.0), "ema_every": (0, 1), "max_sequence_length": (0, 1),
         "chunk_size": (-1, 0), "compile_rows": (-1, 0), "reward_batch": (0, 1), "iterations": (0, 1),
         "eval_every": (-1, 0), "eval_samples": (0, 1), "eval_subset": (-1, 0), "eval_seed": (-1, 0),
         "save_every": (-1, 0),
         "seed": (-1, 0), "alarm_se": (0.0, 1e-9), "alarm_window": (0, 1), "alarm_zero_std": (1.01, 1.0),
         "alarm_clip_frac": (-0.01, 0.0), "alarm_kl": (-1e-9, 0.0)}


def test_every_numeric_field_has_a_range():
    numeric = {f.name for f in dataclasses.fields(config.Config) if f.type in ("int", "float")}
    assert numeric == set(EDGES) == {name for name, _, _ in config.RANGES}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_a_value_outside_its_range_is_refused_with_one_line(name):
    tiny = dataclasses.replace(config.parse_config(["--task", "tiny"]), steps=1, window=1)
    bad, edge = EDGES[name]
    for value in (bad, float("nan")):
        problem = config.check_config(dataclasses.replace(tiny, **{name: value}))
        flag = "--" + name.replace("_", "-")
        assert problem.startswith(f"{flag} {value} is out of range: it must be ") and "\n" not in problem, problem
    assert config.check_ranges(dataclasses.replace(tiny, **{name: edge})) == ""
    if isinstance(edge, float):  # and no infinity
        assert "out of range" in config.check_ranges(dataclasses.replace(tiny, **{name: math.inf}))


def test_cps_noise_level_stops_at_one_and_the_command_line_refuses_in_one_line(tmp_path, capsys):
    tiny = config.parse_config(["--task", "tiny"])
    assert config.check_config(dataclasses.replace(tiny, noise_level=1.0)) == ""
    assert "--sampler cps: it must be in [0, 1]" in config.check_config(dataclasses.replace(tiny, noise_level=1.01))
    assert config.check_config(dataclasses.replace(tiny, noise_level=1.5, sampler="sde")) == ""
    _fails(tmp_path, capsys, ["--group-size", "1"], "--group-size 1 is out of range: it must be >= 2 (GRPO")
    proc = subprocess.run([sys.executable, "train.py", "--task", "tiny", "--lr", "-1"], cwd=ROOT, capture_output=True,
                          text=True)
    lines = proc.stderr.strip().splitlines()  # (transformers' import-time warnings come first)
    assert proc.returncode == 2 and lines[-2].startswith("usage: train.py")
    assert lines[-1] == "train.py: error: --lr -1.0 is out of range: it must be > 0"


def test_keep_best_names_a_heldout_metric_of_the_run_and_evaluate_checks_its_ranges(tmp_path, capsys):
    _fails(tmp_path, capsys, ["--keep-best", "eval/toy"], "--keep-best eval/toy is not a held-out metric of this "
           "run; name one of eval/reward, eval/jpeg_compressibility")
    assert config.check_config(dataclasses.replace(config.parse_config(["--task", "tiny"]), keep_best="eval/toy")) == ""
    # evaluate.py's flags shared with train.py, as train.py checks them: argparse's usage, then one line, exit 2
    args = ["--task", "tiny", "--model", "tiny", "--rewards", "jpeg_compressibility:1", "--checkpoint", "none",
            "--output-dir", str(tmp_path / "eval")]
    for flag, value, bound in [("--eval-samples", "-3", ">= 1"), ("--eval-steps", "0", ">= 1"),
                               ("--eval-guidance", "-1", ">= 0"), ("--resolution", "0", "> 0"),
                               ("--reward-batch", "0", ">= 1")]:
        with pytest.raises(SystemExit) as err:
            evaluate.main(args + [flag, value])
        shown = float(value) if flag == "--eval-guidance" else value
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.value.code == 2 and f"error: {flag} {shown} is out of range: it must be {bound}" in last
        assert not (tmp_path / "eval").exists()


def test_unreadable_checkpoints(tmp_path, capsys):
    _fails(tmp_path, capsys, ["--resume", str(tmp_path / "nowhere")], "is not a training checkpoint")
    _fails(tmp_path, capsys, ["--resume", "latest"], "found no checkpoint")
    (tmp_path / "no_ema").mkdir()
    (tmp_path / "no_ema" / "progress.json").write_text('{"iteration": 1}')
    _fails(tmp_path, capsys, ["--resume", str(tmp_path / "no_ema"), "--ema-decay", "0.9"], "has no ema.safetensors")
    (tmp_path / "junk").mkdir()
    args = ["--task", "tiny", "--model", "tiny", "--rewards", "jpeg_compressibility:1"]
    _fails(tmp_path, capsys, args + ["--checkpoint", str(tmp_path / "junk")], "cannot read checkpoint",
           program=evaluate)
    _fails(tmp_path, capsys, args + ["--checkpoint", str(tmp_path / "gone")], "is not a folder", program=evaluate)


def test_help_explains_every_field(capsys):
    with pytest.raises(SystemExit):
        config.parse_config(["--help"])
    text = capsys.readouterr().out
    for f in dataclasses.fields(config.Config):
        assert "--" + f.name.replace("_", "-") in text
    assert "W, number of SDE" in text and "epsilon, the ratio clip" in text



def _tree(folder) -> dict[str, bytes]:
    """Every file under `folder` and its bytes."""
    return {os.path.relpath(os.path.join(d, name), folder): open(os.path.join(d, name), "rb").read()
            for d, _, names in os.walk(folder) for name in names}


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-100])


def test_a_damaged_checkpoint_is_refused_with_one_line_and_nothing_is_written(tmp_path):
    _, out = run(tmp_path, "--save-every", "1")
    folder = os.path.join(out, "checkpoints", "iter-000002")
    written = json.load(open(os.path.join(folder, checkpoint.MANIFEST)))["files"]
    assert set(written) == set(_tree(folder)) - {checkpoint.MANIFEST}
    assert {"model.safetensors", "lora/pytorch_lora_weights.safetensors", "progress.json"} <= set(written)
    size = written["model.safetensors"]["bytes"]
    cases = [  # (keep the manifest, file, damage, what the line says is wrong)
        (True, "model.safetensors", _truncate, f"model.safetensors has {size - 100} bytes where {size} were written"),
        (True, "progress.json", lambda p: p.write_text('{"iteration": 9}'), "progress.json differs from what was "
                                                                             "written (its SHA-256 does not match"),
        (True, "optimizer.bin", os.remove, "optimizer.bin is missing"),
        # a checkpoint from before manifests: each file is read
        (False, "model.safetensors", _truncate, "model.safetensors cannot be read (SafetensorError: "),
        (False, "progress.json", lambda p: p.write_text('{"iterat'), "progress.json cannot be read (JSONDecodeError: "),
        (False, "optimizer.bin", _truncate, "optimizer.bin cannot be read (BadZipFile: "),
    ]
    for number, (manifest, name, damage, says) in enumerate(cases):
        copy = tmp_path / f"damaged{number}"
        shutil.copytree(out, copy)
        damaged = os.path.join(copy, "checkpoints", "iter-000002")
        assert checkpoint.check_checkpoint(damaged) == ""  # whole, with and without its manifest
        if not manifest:
            os.remove(os.path.join(damaged, checkpoint.MANIFEST))
            assert checkpoint.check_checkpoint(damaged) == ""
        damage(copy / "checkpoints" / "iter-000002" / name)
        before = _tree(copy)
        with pytest.raises(SystemExit) as err:
            run(tmp_path, "--iterations", "3", "--resume", "latest", name=f"damaged{number}")
        line = str(err.value.code)
        earlier = os.path.join(copy, "checkpoints", "iter-000001")
        assert line.startswith(f"error: checkpoint {damaged} is damaged: {says}") and "\n" not in line, line
        assert line.endswith(f"; resume from an earlier one (--resume {earlier}, the newest of 1) or start fresh "
                             f"without --resume"), line
        assert _tree(copy) == before, "a refused resume wrote or changed files"
    # the best checkpoint (--keep-best) damaged: refused by --resume, which offers the newest iter-NNNNNN, and by
    # evaluate.py, which checks a training checkpoint against its manifest too
    best = os.path.join(out, "checkpoints", checkpoint.BEST)
    shutil.copytree(os.path.join(out, "checkpoints", "iter-000002"), best)
    _truncate(pathlib.Path(best) / "lora" / "pytorch_lora_weights.safetensors")
    with pytest.raises(SystemExit) as err:
        run(tmp_path, "--iterations", "3", "--resume", best)
    assert str(err.value.code).endswith(f"; resume from an earlier one (--resume {folder}, the newest of 2) or start "
                                        f"fresh without --resume")
    with pytest.raises(SystemExit) as err:
        evaluate.main(["--task", "tiny", "--model", "tiny", "--rewards", "jpeg_compressibility:1",
                       "--checkpoint", best])
    line = str(err.value.code)
    assert line.startswith(f"error: checkpoint {best} is damaged: lora/pytorch_lora_weights.safetensors has ")
    assert line.endswith("; evaluate another checkpoint") and "\n" not in line
    # the first checkpoint damaged: nothing earlier to offer
    os.remove(os.path.join(earlier, "random_states_0.pkl"))
    with pytest.raises(SystemExit) as err:
        run(tmp_path, "--iterations", "3", "--resume", earlier, name=f"damaged{number}")
    assert str(err.value.code).endswith("random_states_0.pkl is missing; start fresh without --resume (no earlier "
                                        f"checkpoint in {os.path.dirname(earlier)})")


def test_resuming_with_a_setting_that_shapes_the_saved_state_is_refused_with_one_line_and_nothing_is_written(tmp_path):
    _, out = run(tmp_path)
    folder = os.path.join(out, "checkpoints", "iter-000002")
    before = _tree(out)
    cases = [(["--lora-rank", "4"], "was trained with --lora-rank 8, not 4 (the shape of its LoRA weights); resume "
                                    "with --lora-rank 8, or start fresh without --resume"),
             (["--lora-alpha", "8"], "was trained with --lora-alpha 16, not 8"),
             (["--lora-targets", "attn.to_q"], "was trained with --lora-targets attn.to_q,attn.to_k,"),
             (["--model", "tiny-flux"], "was trained with --model tiny, not tiny-flux"),
             (["--ema-decay", "0.9"], "was trained with the EMA off (--ema-decay 0.0) and --ema-decay 0.9 turns it "
                                      "on; resume with --ema-decay 0.0")]
    for flags, says in cases:
        with pytest.raises(SystemExit) as err:
            run(tmp_path, "--iterations", "3", "--resume", "latest", *flags)
        line = str(err.value.code)
        assert line.startswith(f"error: checkpoint {folder} {says}") and "\n" not in line, line
        assert _tree(out) == before, "a refused resume wrote or changed files"


def test_config_changes_and_what_counts_as_the_same_setting(tmp_path):
    cfg = config.parse_config(["--task", "tiny", "--lr", "0.01"])
    saved = dataclasses.asdict(dataclasses.replace(cfg, lr=0.003, resume="x"))
    del saved["beta"]  # an older config.json without a field: unchanged
    saved["lora_targets"] = ",".join(reversed(cfg.lora_targets.split(",")))  # the same layers in another order
    saved["model"] = "/elsewhere/old-clone/toy_model"  # the repository moved: the same folder name, gone
    assert checkpoint.config_changes(saved, cfg) == {"lr": (0.003, 0.01)}
    assert checkpoint.shape_problem(saved, cfg) == ""
    saved["model"] = str(tmp_path)  # another folder that exists
    assert checkpoint.shape_problem(saved, cfg).startswith(f"was trained with --model {tmp_path}, not ")


def test_resuming_with_another_lr_prints_and_logs_the_change_and_trains_at_it(tmp_path, capsys):
    _, out = run(tmp_path, name="first")
    shutil.copytree(out, tmp_path / "same")
    capsys.readouterr()
    run(tmp_path, "--iterations", "3", "--resume", "latest", "--lr", "0.01", name="first")
    assert "resumed with lr 0.001 -> 0.01, iterations 2 -> 3\n" in capsys.readouterr().out
    logged = [json.loads(line) for line in open(os.path.join(out, "resumes.jsonl"))]
    assert logged == [{"iteration": 2, "checkpoint": os.path.join(out, "checkpoints", "iter-000002"),
                       "changed": {"lr": [0.001, 0.01], "iterations": [2, 3]}}]
    history = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [h["iteration"] for h in history] == [1, 2, 3] and history[-1]["train/lr"] == 0.01
    # the optimizer steps at the new lr (torch's load_state_dict would restore the checkpoint's): resumed at the old
    # one, the third iteration's weights differ
    run(tmp_path, "--iterations", "3", "--resume", "latest", name="same")
    a = load_file(os.path.join(out, "checkpoints", "iter-000003", "lora", "pytorch_lora_weights.safetensors"))
    b = load_file(tmp_path / "same" / "checkpoints" / "iter-000003" / "lora" / "pytorch_lora_weights.safetensors")
    assert any(not torch.equal(a[k], b[k]) for k in a)
    # there the lr as it was; the folder changed (a copy of the run), logged too
    assert json.loads(open(tmp_path / "same" / "resumes.jsonl").read())["changed"] == {
        "iterations": [2, 3], "output_dir": [out, str(tmp_path / "same")]}
