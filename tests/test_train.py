"""train.py and evaluate.py end to end on the random-weight tiny SD3 (16 px, CPU): each algorithm trains, LoRA
weights move and base weights do not, the saved LoRA loads into diffusers, resume is bit-exact, two processes
(gloo) stay in sync, stop together on an alarm (alarms.py) and agree with one process on advantages, evaluation
writes finite metrics (bad input: tests/test_bad_input.py; the alarms and the best checkpoint: tests/test_alarms.py)."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from diffusers import SD3Transformer2DModel
from peft.tuners.lora import LoraLayer
from PIL import Image
from safetensors.torch import load_file

import collectives
import config
import evaluate
import grpo
import models
import sampler as S
import toyworld
import train
import turning_points as tp
from policy import EMA, add_lora
from tests import train_worker  # noqa: F401 (registers the 'half_constant' reward)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ["--task", "tiny", "--model", "tiny", "--rewards", "jpeg_compressibility:1", "--resolution", "16",
        "--prompts-per-iter", "2", "--group-size", "4", "--sample-batch", "8", "--train-batch", "4",
        "--eval-samples", "8", "--report-to", "none", "--iterations", "2", "--max-sequence-length", "32",
        "--steps", "10", "--window", "9", "--eval-steps", "10",  # SD3.5-M's schedule (the tiny preset's is T = 6)
        "--lr", "1e-3", "--clip-range", "1e-4"]  # the settings these tests were written at (the toy preset's moved)


# The on-policy check's bound: train/first_ratio_dev = max |rho - 1| over the first micro-batch, which trains before
# any optimizer step. The training pass recomputes the rollout's velocities from the same inputs, but in micro-batches
# of another size (--train-batch, not --sample-batch), and MKL's matrix kernels may round by the batch's shape: on an
# AVX-512 Intel Xeon, and under MKL_CBWR=COMPATIBLE on this AMD EPYC, rho came out one float32 ulp from 1 (1.2e-7
# above, 6e-8 below), where the EPYC's default kernels give exactly 0. 1e-6 allows a few ulps; one optimizer step at
# these tests' lr moves rho by 3e-6 or more (train/ratio_max below), an off-policy pass (another timestep or dtype)
# by far more.
ON_POLICY = 1e-6


def run(tmp_path, *extra, name="run"):
    out = str(tmp_path / name)
    return train.main(config.parse_config(FAST + ["--output-dir", out, *extra])), out


def lora_file(out, iteration, sub="lora"):
    return load_file(os.path.join(out, "checkpoints", f"iter-{iteration:06d}", sub,
                                  "pytorch_lora_weights.safetensors"))


@pytest.mark.parametrize("completion,per_trajectory", [("x0", 10), ("ode:2", 19), ("mc:2", 100)])
def test_a_cheaper_judge_trains_at_its_cost(tmp_path, completion, per_trajectory):
    # T = 10, W = 9: x0 adds no evaluation to the rollout's 10; ode:2 adds one per window state (its second step);
    # mc:2 twice the full ODE judge's 45 (each continuation's first step is the rollout's velocity)
    _, out = run(tmp_path, "--completion", completion)
    history = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [h["cost/evals_per_trajectory"] for h in history] == [per_trajectory] * 2
    assert history[-1]["train/ratio_max"] > 1 + ON_POLICY and history[0]["train/first_ratio_dev"] <= ON_POLICY


@pytest.mark.parametrize("algo", ["tp-grpo", "flow-grpo", "incremental"])
def test_two_iterations_train_lora_only(tmp_path, algo):
    result, out = run(tmp_path, "--algo", algo)
    history = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [h["iteration"] for h in history] == [1, 2]
    assert all(torch.isfinite(torch.tensor(h["train/loss"])) for h in history)
    assert history[0]["cost/evals_per_trajectory"] == (10 if algo == "flow-grpo" else 55)
    # on-policy check: the first micro-batch is trained before any optimizer step, and the training pass recomputes
    # the rollout's velocities, so rho = exp(logp - logp_old) is 1 there up to float rounding (ON_POLICY)...
    assert all(h["train/first_ratio_dev"] <= ON_POLICY for h in history)
    assert max(h["train/ratio_max"] for h in history) > 1 + ON_POLICY  # ...while later micro-batches have moved
    trained = result["policy"]
    fresh = models.tiny_pipeline().transformer.state_dict()
    lora = {k: v for k, v in trained.named_parameters() if "lora_" in k}
    assert lora and all(v.requires_grad for v in lora.values())
    # gaussian init: lora_B starts at 0, so any nonzero lora_B entry was put there by the optimizer
    assert max(v.abs().max().item() for k, v in lora.items() if "lora_B" in k) > 1e-5
    for name, p in trained.named_parameters():
        if "lora_" not in name:
            assert not p.requires_grad
            assert torch.equal(p.detach(), fresh[name.replace(".base_layer", "")]), name
    # the pictures: the same 8 evaluation images (16 px, enlarged to GRID_CELL-pixel cells plus margins) before and
    # after training, which differ because the trained LoRA draws other images from the same noise; a drawn curve
    before, after = (np.asarray(Image.open(os.path.join(out, f"samples_{tag}.png"))) for tag in ("before", "after"))
    assert before.shape == after.shape and before.shape[1] == 8 * (evaluate.GRID_CELL + 6)
    assert (before != after).any()
    curve = np.asarray(Image.open(os.path.join(out, "reward_curve.png")).convert("RGB"))  # (H, W, 3)
    assert len(np.unique(curve.reshape(-1, 3), axis=0)) > 10  # lines and text, not a blank canvas


def _adapted(transformer) -> set[str]:
    return {name for name, m in transformer.named_modules() if isinstance(m, LoraLayer)}


@pytest.mark.parametrize("algo", ["tp-grpo", "flow-grpo"])
def test_the_judge_audit_changes_nothing_else_in_the_run(tmp_path, algo):
    _, off = run(tmp_path, "--algo", algo, "--judge-audit", "0", name="off")
    _, on = run(tmp_path, "--algo", algo, "--judge-audit", "1", "--audit-continuations", "3", name="on")
    h_off, h_on = ([json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))] for out in (off, on))
    for a, b in zip(h_off, h_on):
        audit = {k for k in b if k.startswith("judge/") or k == "time/audit_s"}
        assert audit and not any(k.startswith("judge/") for k in a)
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == \
            {k: v for k, v in b.items() if not k.startswith("time/") and k not in audit}
        # one group of G = 4: 3 continuations of each of 9 states (9 + 8 + ... + 1 steps after the shared first
        # velocity), + the 9 first velocities; Flow-GRPO's audit also ODE-completes the states itself (9 + ... + 1)
        assert b["judge/evals"] == 4 * (3 * 45 + 9 + (45 + 9 if algo == "flow-grpo" else 0))
    for tag in ("before", "after"):
        evaluations = [json.load(open(os.path.join(out, f"eval_{tag}.json"))) for out in (off, on)]
        assert evaluations[0] == evaluations[1]
    a, b = lora_file(off, 2), lora_file(on, 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_evaluation_on_the_way_may_score_the_first_images_alone_paired_with_them_before(tmp_path):
    _, out = run(tmp_path, "--eval-every", "1", "--eval-subset", "3", "--rewards", "brightness:1")
    before, on_the_way, after = (json.load(open(os.path.join(out, f"eval_{tag}.json")))
                                 for tag in ("before", "iter000001", "after"))
    assert [len(e["per_image"]["reward"]) for e in (before, on_the_way, after)] == [8, 3, 8]
    d = torch.tensor(on_the_way["per_image"]["reward"]) - torch.tensor(before["per_image"]["reward"][:3])  # (3,)
    assert on_the_way["eval/change"] == pytest.approx(d.mean().item(), abs=1e-6)
    assert on_the_way["eval/change_se"] == pytest.approx((d.std() / math.sqrt(3)).item(), abs=1e-6)


def test_lora_targets_are_the_demo_codes_191_joint_attention_projections_on_sd35m():
    with torch.device("meta"):  # SD3.5-M's 2.2B parameters as shapes only
        transformer = SD3Transformer2DModel(**models.SD35M_TRANSFORMER)
    add_lora(transformer, 32, 64, config.Config().lora_targets.split(","))
    both_streams = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
    # the last block is context_pre_only: its text stream has no output projection (to_add_out)
    expected = {f"transformer_blocks.{b}.attn.{m}" for b in range(24) for m in both_streams
                if (b, m) != (23, "to_add_out")}
    assert _adapted(transformer) == expected and len(expected) == 191  # blocks 0-12's attn2 stays frozen
    # bare suffixes (this project's old default) adapt attn2 and miss the text stream: 148 layers
    with torch.device("meta"):
        transformer = SD3Transformer2DModel(**models.SD35M_TRANSFORMER)
    add_lora(transformer, 32, 64, ["to_q", "to_k", "to_v", "to_out.0"])
    bare = _adapted(transformer)
    assert len(bare) == 148 and sum(".attn2." in name for name in bare) == 52
    # the tiny test model still gets adapters on both streams
    tiny = add_lora(models.tiny_pipeline().transformer, 32, 64, config.Config().lora_targets.split(","))
    assert len(_adapted(tiny)) == 15 and "transformer_blocks.0.attn.add_q_proj" in _adapted(tiny)


def test_spread_kept_deals_the_kept_rows_evenly_over_micro_batches():
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    assert torch.equal(train.spread_kept(order, torch.ones(12, dtype=torch.bool), 4), order)
    keep = torch.zeros(12, dtype=torch.bool)
    keep[[0, 3, 4, 5, 9]] = True
    out = train.spread_kept(order, keep, 4)
    assert sorted(out.tolist()) == list(range(12))  # a permutation: every row still runs (DDP)
    assert [int(keep[mb].sum()) for mb in out.split(4)] == [2, 2, 1]
    assert out[keep[out]].tolist() == order[keep[order]].tolist()  # kept rows in the random order drawn


def test_zero_advantage_filter_changes_nothing_else(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("constant: a red cube\na blue ball\n")
    half = ["--rewards", "half_constant:1", "--prompts", str(prompts)]
    _, on = run(tmp_path, *half, name="on")
    _, off = run(tmp_path, *half, "--drop-zero-adv", "false", name="off")
    h_on, h_off = ([json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))] for out in (on, off))
    # the constant prompt's group (4 of 8 trajectories) has advantage 0 at every step, whether dropped or not
    assert [h["train/zero_adv_frac"] for h in h_on + h_off] == [0.5] * 4
    # the first iteration's sampling and rewards are the same; the update is not (the dropped rows left its means)
    for key in ("reward/mean", "reward/std", "cost/transformer_evals", "reward/R0_mean"):
        assert h_on[0][key] == h_off[0][key], key
    assert h_on[0]["train/policy_loss"] != h_off[0]["train/policy_loss"]
    assert any(not torch.equal(a, b) for a, b in zip(lora_file(on, 2).values(), lora_file(off, 2).values()))
    # nothing to drop (continuous rewards): the filter on or off trains bit for bit the same weights
    _, on = run(tmp_path, "--iterations", "1", name="on_jpeg")
    _, off = run(tmp_path, "--iterations", "1", "--drop-zero-adv", "false", name="off_jpeg")
    assert json.loads(open(os.path.join(on, "metrics.jsonl")).readline())["train/zero_adv_frac"] == 0.0
    a, b = lora_file(on, 1), lora_file(off, 1)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_ema_follows_flow_grpos_warm_up_schedule():
    p = torch.nn.Parameter(torch.zeros(2))
    ema = EMA([p], decay=0.9, every=8)
    seen = []
    for s in range(24):  # optimizer step s sets the weights to s + 1
        p.data.fill_(s + 1.0)
        ema.step()
        seen.append(ema.shadow[0][0].item())
    # by hand: updates after s = 7, 15, 23 with decays min(0.9, 8/17), min(0.9, 16/25), min(0.9, 24/33)
    after7 = 8 / 17 * 0 + 9 / 17 * 8
    after15 = 16 / 25 * after7 + 9 / 25 * 16
    after23 = 24 / 33 * after15 + 9 / 33 * 24
    expected = [0.0] * 7 + [after7] * 8 + [after15] * 8 + [after23]
    assert seen == pytest.approx(expected, rel=1e-6)
    assert ema.decay_at(79) == pytest.approx(80 / 89) and ema.decay_at(80) == 0.9 and ema.decay_at(500) == 0.9
    # the share of the initial weights left after 80 optimizer steps: 7%, where 0.9 every 8 steps left 35%
    share = math.prod(ema.decay_at(s) for s in range(7, 80, 8))
    assert share == pytest.approx(0.0709, abs=1e-4)


def test_saved_lora_loads_into_diffusers_and_reproduces_the_policy(tmp_path):
    result, out = run(tmp_path, "--ema-decay", "0.5", "--ema-every", "1", "--lr", "3e-3")
    folder = os.path.join(out, "checkpoints", "iter-000002")
    prompts, seeds = ["two red squares", "one blue circle"], [1, 2]
    sampling = dict(steps=10, guidance_scale=4.5, resolution=16, max_sequence_length=32)
    pipe = models.tiny_pipeline()
    base = S.generate(pipe, prompts, seeds, **sampling)
    pipe.load_lora_weights(os.path.join(folder, "lora"))
    loaded = S.generate(pipe, prompts, seeds, **sampling)
    assert (loaded - base).abs().max() > 1e-4  # the LoRA changes the output...
    trained = models.tiny_pipeline()
    trained.transformer = result["policy"].eval()
    torch.testing.assert_close(loaded, S.generate(trained, prompts, seeds, **sampling), rtol=0, atol=1e-5)
    # ...and is exactly the trained policy; the EMA weights are saved beside it and differ from the live ones
    live, ema = lora_file(out, 2), lora_file(out, 2, "lora_ema")
    assert live.keys() == ema.keys() and any(not torch.equal(live[k], ema[k]) for k in live)


def test_resume_is_bit_exact(tmp_path):
    _, straight = run(tmp_path, "--iterations", "4", "--ema-decay", "0.9", "--ema-every", "1", name="straight")
    _, split = run(tmp_path, "--iterations", "2", "--ema-decay", "0.9", "--ema-every", "1", name="split")
    run(tmp_path, "--iterations", "4", "--ema-decay", "0.9", "--ema-every", "1", "--resume", "latest", name="split")
    for sub in ("lora", "lora_ema"):
        a, b = lora_file(straight, 4, sub), lora_file(split, 4, sub)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sub
    history = [json.loads(line)["iteration"] for line in open(os.path.join(split, "metrics.jsonl"))]
    assert history == [1, 2, 3, 4]
    # the loop's own state is safetensors / JSON; accelerate's optimizer and RNG states are the only pickles
    folder = os.path.join(split, "checkpoints", "iter-000002")
    files = set(os.listdir(folder))
    assert {"ema.safetensors", "progress.json", "model.safetensors", "lora", "lora_ema"} <= files
    assert {f for f in files if f.endswith((".pkl", ".bin", ".pt"))} == {"optimizer.bin", "random_states_0.pkl"}
    assert json.load(open(os.path.join(folder, "progress.json"))) == {"iteration": 2}
    assert int(load_file(os.path.join(folder, "ema.safetensors"))["steps"]) == 2 * 2  # 2 updates per iteration


def _launch_two(script_and_args, timeout=300):
    """`accelerate launch` with 2 gloo processes. A hang fails the test with every process's Python stack: the
    run gets its own process group, and on timeout SIGABRT makes faulthandler print each process's traceback."""
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT, PYTHONFAULTHANDLER="1")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", *script_and_args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        finally:
            try:  # the launcher's workers too, so that no orphan keeps the CPUs busy
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"two-process run hung for {timeout} s; the processes' stacks:\n{stderr[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def test_two_processes_train_in_sync(tmp_path):
    out = str(tmp_path / "ddp")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("constant: a red cube\na blue ball\n")
    # G = 3 members strided over 2 processes: one holds 2 members of the constant prompt's group, the other 1, so
    # the zero-advantage filter masks 2 of one process's 3 micro-batches and 1 of the other's; both must still
    # run the same backward passes, or DDP hangs
    # the judge audit on at every iteration: its group's members sit on both processes, which gather and agree.
    # The alarms: the constant prompt's group has no signal (reward/zero_std_groups 0.5), above --alarm-zero-std 0.4
    # once the window of 2 iterations is full, so --stop-on-alarm ends the 3-iteration run at 2 on both processes
    # (one stopping alone would hang the other), after keeping the best checkpoint (a save both take part in)
    proc = _launch_two([os.path.join(ROOT, "tests", "train_worker.py"), *FAST, "--rewards", "half_constant:1",
                        "--prompts", str(prompts), "--group-size", "3", "--sample-batch", "3", "--train-batch", "1",
                        "--updates-per-iter", "1", "--judge-audit", "1", "--audit-continuations", "2",
                        "--output-dir", out, "--iterations", "3", "--alarm-zero-std", "0.4", "--alarm-window", "2",
                        "--stop-on-alarm", "true", "--keep-best", "eval/reward"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "alarm at iteration 2: reward/zero_std_groups" in proc.stdout
    assert "--stop-on-alarm: the run ends at iteration 2" in proc.stdout
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["best", "iter-000002"]
    assert json.load(open(os.path.join(out, "checkpoints", "best", "best.json")))["iteration"] == 2
    # DDP keeps every process's weights identical by construction: each process's trained LoRA, bit for bit
    ranks = [load_file(os.path.join(out, f"trained_rank{r}.safetensors")) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys() and all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])
    assert max(v.abs().max() for k, v in ranks[0].items() if "lora_B" in k) > 0  # trained: lora_B starts at 0
    history = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert len(history) == 2 and history[0]["cost/transformer_evals"] == 55 * 6  # both processes counted
    assert [h["train/zero_adv_frac"] for h in history] == [0.5, 0.5]
    assert [(h["reward/zero_std_groups"], h["alarm/zero_std"]) for h in history] == [(0.5, 0.0), (0.5, 1.0)]
    # both processes' continuations counted: 3 members x (2 x (9 + 8 + ... + 1) + 9 first velocities) = 297
    assert [h["judge/evals"] for h in history] == [297, 297] and all("judge/resolved" in h for h in history)
    assert all(h["train/first_ratio_dev"] <= ON_POLICY for h in history)  # sampling batch 3, training batch 1
    # evaluate.py on that checkpoint, also on two processes (5 images: one process pads its share), scored by the
    # smooth `brightness` (tests/train_worker.py) to be compared with one process below
    ev = str(tmp_path / "eval")
    checkpoint = os.path.join(out, "checkpoints", "iter-000002")
    evaluation = ["--task", "tiny", "--model", "tiny", "--rewards", "brightness:1", "--checkpoint", checkpoint,
                  "--eval-samples", "5", "--eval-steps", "4"]
    proc = _launch_two([os.path.join(ROOT, "tests", "eval_worker.py"), *evaluation, "--output-dir", ev])
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.load(open(os.path.join(ev, "eval.json")))
    assert written["samples"] == 5 and all(torch.isfinite(torch.tensor(v)) for v in written.values()
                                           if isinstance(v, float))
    assert len(written["per_image"]["reward"]) == 5  # the padded duplicate dropped out
    assert os.path.getsize(os.path.join(ev, "grid.png")) > 0
    evaluate.main([*evaluation, "--output-dir", str(tmp_path / "ev1")])
    single = json.load(open(tmp_path / "ev1" / "eval.json"))["per_image"]["reward"]
    # the same 5 images, however many processes: sampled in batches of 5 here and of 3 there, so equal up to the
    # rounding of other batch shapes, a few float32 ulps of a brightness near 0.5 (6e-8 each)
    torch.testing.assert_close(torch.tensor(written["per_image"]["reward"]), torch.tensor(single), rtol=0, atol=1e-6)


class NcclLike:
    """An accelerator whose collectives take only tensors on its device, as NCCL's do (gloo, the CPU tests' backend,
    would take any); its device is the meta device, so that a CPU tensor is off it."""

    device = torch.device("meta")

    def gather(self, tensor):
        assert tensor.device == self.device, f"a {tensor.device} tensor handed to a collective on {self.device}"
        return tensor

    def reduce(self, tensor, op):
        return self.gather(tensor)


def test_collectives_hand_the_accelerator_tensors_on_its_device():
    acc = NcclLike()
    with pytest.raises(AssertionError, match="a cpu tensor"):
        acc.gather(torch.ones(2))  # what a direct call from train.py would do (tests/test_structure.py forbids it)
    assert collectives.gather(acc, torch.ones(2)).device == acc.device
    assert collectives.reduce_sum(acc, torch.ones(3, dtype=torch.float64)).device == acc.device


def test_groups_split_over_processes_get_single_process_advantages(tmp_path):
    proc = _launch_two([os.path.join(ROOT, "tests", "credit_worker.py"), str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    R = ranks[0]["R"]
    expected = {"flow-grpo": grpo.flow_grpo_advantages(R[:, -1], 4, 4)}
    for algo in ("tp-grpo", "incremental"):
        expected[algo] = grpo.per_timestep_advantages(tp.step_rewards(R, 4, algo)[0], 4)
    for algo, adv in expected.items():
        assert adv.abs().sum() > 0
        for r in ranks:
            torch.testing.assert_close(r[algo], adv[r["mine"]], rtol=0, atol=0)


def test_tiny_task_runs_from_the_shipped_toy_checkpoint_in_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the preset finds toy_model/ beside train.py, not in the working directory
    result = train.main(config.parse_config(
        ["--task", "tiny", "--iterations", "2", "--eval-samples", "16", "--prompts-per-iter", "2",
         "--group-size", "4", "--sample-batch", "8", "--train-batch", "4", "--report-to", "none"]))
    out = str(tmp_path / "runs" / "tiny")
    values = {}
    for tag in ("before", "after"):
        summary = result["summaries"][tag]
        assert 0 <= summary["eval/toy_strict"] <= 1 and 0 <= summary["eval/reward"] <= 1
        grid = Image.open(os.path.join(out, f"samples_{tag}.png"))
        assert grid.width >= 8 * 128  # 32-pixel images enlarged to legible cells, captions below
        written = json.load(open(os.path.join(out, f"eval_{tag}.json")))  # per image, for paired comparisons
        values[tag] = torch.tensor(written["per_image"]["reward"])  # (16,)
        assert len(values[tag]) == 16 and abs(values[tag].mean().item() - summary["eval/reward"]) < 1e-6
    d = values["after"] - values["before"]  # (16,) the same images before and after: a paired change
    after = result["summaries"]["after"]
    assert after["eval/change"] == pytest.approx(d.mean().item(), abs=1e-6)
    assert after["eval/change_se"] == pytest.approx(d.std().item() / 4, abs=1e-6)
    history = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert history[-1]["cost/evals_per_trajectory"] == 6 + 5 + 4 + 3 + 2 + 1  # T = 6, W = 5: rollout + completions
    assert 0 <= history[-1]["reward/mean"] <= 1
    # strict turning points are base ones with one more condition (Def. 5.1 vs Def. 4.1)
    assert all(0 <= h["steps/tp_rate_strict"] <= h["steps/tp_rate_base"] <= 1 for h in history)
    assert history[-1]["time/elapsed_s"] > history[0]["time/elapsed_s"] > 0
    assert os.path.getsize(os.path.join(out, "reward_curve.png")) > 0


@pytest.mark.parametrize("tamper", [False, True])
def test_shipped_heldout_values_stand_in_for_the_evaluation_before_training(tmp_path, capsys, tamper):
    # A copy of the toy checkpoint whose shipped values cover this run's evaluation (its first 40 images); the run
    # recomputes only the grid's 32 images, and evaluates everything when they disagree (tamper: one is off).
    model = tmp_path / "model"
    shutil.copytree(config.TOY_MODEL, model)
    saved = json.load(open(model / toyworld.HELDOUT_EVAL))
    saved["settings"]["eval_samples"] = 40
    saved["per_image"] = {k: v[:40] for k, v in saved["per_image"].items()}
    if tamper:
        saved["per_image"]["reward"][3] += 0.5
    json.dump(saved, open(model / toyworld.HELDOUT_EVAL, "w"))
    out = tmp_path / "run"
    train.main(config.parse_config(["--task", "tiny", "--model", str(model), "--iterations", "1", "--eval-samples",
                                   "40", "--prompts-per-iter", "2", "--group-size", "4", "--sample-batch", "8",
                                   "--train-batch", "4", "--output-dir", str(out), "--report-to", "none"]))
    before = json.load(open(out / "eval_before.json"))["per_image"]["reward"]
    shipped = torch.tensor(saved["per_image"]["reward"])  # (40,)
    printed = capsys.readouterr().out
    if tamper:
        assert "disagree" in printed and abs(before[3] - shipped[3].item()) == pytest.approx(0.5, abs=1e-5)
    else:
        assert "shipped values" in printed and torch.allclose(torch.tensor(before), shipped, atol=1e-6)
    # the fresh images agree with the shipped values either way, except the tampered one
    keep = torch.arange(40) != 3
    assert torch.allclose(torch.tensor(before)[keep], shipped[keep], atol=1e-5)
    # other evaluation settings than the shipped ones: no stand-in
    assert toyworld.shipped_heldout_values(config.parse_config(["--task", "tiny", "--model", str(model)])) is None
