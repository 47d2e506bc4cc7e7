"""Watching a run (alarms.py): each alarm rule fires on a constructed sequence of evaluations or training rows and
stays silent on a rising one (by hand); the best checkpoint is replaced only on improvement, is a complete
checkpoint that resumes exactly and that evaluate.py scores as the run did; --stop-on-alarm ends the run cleanly; the
alarms and --keep-best change nothing else in a run; the laboratory's replay (lab/alarms.py) on synthetic results.
The two-process run (gloo) with an alarm that stops it: tests/test_train.py's test_two_processes_train_in_sync."""

import dataclasses
import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

import alarms
import checkpoint
import config
import evaluate
import train
from lab import alarms as lab_alarms
from tests.test_train import lora_file, run

T = torch.tensor


def _evals(*columns):
    """[(iteration, {"reward": (M,), "toy": (M,)})] from (iteration, reward values, toy values) triples."""
    return [(i, {"reward": T(r), "toy": T(g)}) for i, r, g in columns]


# ---- the rules, by hand ------------------------------------------------------------------------------------------


def test_paired_change_over_the_images_both_scored_with_nans_left_out():
    mean, se = alarms.paired(T([1.0, 2.0, 3.0, 9.0, math.nan]), T([2.0, 2.5, 3.0, 7.0, 1.0, 5.0]))
    d = T([1.0, 0.5, 0.0, -2.0])  # the first 5 images both scored, the NaN one out
    assert mean == pytest.approx(d.mean().item()) and se == pytest.approx((d.std() / 2).item())
    assert alarms.z_score(-0.5, 0.0) == -math.inf and alarms.z_score(0.0, 0.0) == 0.0


def test_the_best_is_replaced_only_on_improvement_ties_keep_the_earlier():
    means = [0.5, 0.7, 0.7, 0.6, 0.8, 0.8]
    evals = [(10 * i, {"reward": T([m - 0.1, m + 0.1])}) for i, m in enumerate(means)]
    running = [alarms.best_index(evals[:k + 1], "reward") for k in range(len(evals))]
    assert running == [0, 1, 1, 1, 4, 4]
    # an evaluation of the first images alone (--eval-subset) is compared on those: 0.9 beats 0.7 on image 0
    assert alarms.improves(T([0.6, 0.8]), T([0.9])) and not alarms.improves(T([0.6, 0.8]), T([0.5]))
    assert alarms.best_index([(0, {"toy": T([1.0])})], "reward") is None


def test_collapse_fires_below_the_best_by_more_than_alarm_se_paired_ses_and_not_on_a_rising_run():
    base, peak = [0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]
    fallen = [0.4, 0.45, 0.65, 0.6]  # d = -0.1, -0.15, -0.05, -0.2 against the peak
    d = T(fallen) - T(peak)
    z = (d.mean() / (d.std() / 2)).item()  # -3.87 paired SEs
    evals = _evals((0, base, base), (20, peak, peak), (40, fallen, fallen))
    fired, got, best = alarms.collapse(evals, "reward", 3.0)
    assert fired and got == pytest.approx(z) and best == 20
    assert not alarms.collapse(evals, "reward", 4.0)[0]  # 3.87 SEs: not beyond 4
    rising = _evals((0, base, base), (20, peak, peak), (40, [x + 0.01 * i for i, x in enumerate(peak)], peak))
    assert not alarms.collapse(rising, "reward", 3.0)[0]
    assert alarms.collapse(evals[:1], "reward", 3.0) == (False, pytest.approx(math.nan, nan_ok=True), None)
    # the evaluation before training is no best: a run below the base model from its start gained nothing to lose
    below = (20, {"reward": T(base) - T([0.1, 0.2, 0.1, 0.2])})
    assert alarms.collapse([evals[0], below], "reward", 3.0)[:2] == (False, pytest.approx(math.nan, nan_ok=True))
    assert alarms.collapse([evals[0], below, evals[1], evals[2]], "reward", 3.0)[2] == 20  # later peaks count


def test_drift_fires_when_the_proxy_rises_and_the_gold_falls_and_not_when_they_move_together():
    a = [0.2, 0.3, 0.4, 0.5]
    up, down = [0.3, 0.45, 0.45, 0.6], [0.1, 0.25, 0.2, 0.45]  # d = +.1 +.15 +.05 +.1 / -.1 -.05 -.2 -.05
    fired, z = alarms.drift(_evals((20, a, a), (40, up, down)), "reward", ["toy"], 2.5)
    # by hand: the proxy +0.1 with SE sqrt(0.005 / 3) / 2 = 0.0204 (+4.9 SEs), the gold -0.1 with SE 0.0354 (-2.83)
    assert fired and z["reward"] == pytest.approx(0.1 / (math.sqrt(0.005 / 3) / 2), rel=1e-5)
    assert z["toy"] == pytest.approx(-0.1 / (math.sqrt(0.015 / 3) / 2), rel=1e-5)
    assert not alarms.drift(_evals((20, a, a), (40, up, down)), "reward", ["toy"], 2.9)[0]  # the gold short of it
    assert not alarms.drift(_evals((20, a, a), (40, up, up)), "reward", ["toy"], 2.0)[0]  # both rise
    assert not alarms.drift(_evals((20, up, up), (40, a, down)), "reward", ["toy"], 2.0)[0]  # both fall: a collapse
    assert not alarms.drift(_evals((20, a, a), (40, up, down)), "reward", [], 2.0)[0]  # no gold evaluated


def test_a_signal_alarm_judges_the_mean_of_the_last_window_iterations_not_one_noisy_iteration():
    limits = {"zero_std": 0.5, "clip_frac": 0.4, "kl": None}  # the KL off
    rows = [{"reward/zero_std_groups": z, "train/clip_frac": c, "train/approx_kl": 1.0}
            for z, c in [(0.0, 0.3), (0.9, 0.3), (0.0, 0.3), (0.6, 0.5), (0.6, 0.5), (0.6, 0.5)]]
    seen = [alarms.signals(rows[:i + 1], 3, limits) for i in range(len(rows))]
    assert all(set(s) == {"zero_std", "clip_frac"} for s in seen)
    # the 0.9 alone: window means 0.3 and (0.9 + 0 + 0.6) / 3 = 0.5, not above 0.5; three 0.6 in a row: 0.6
    assert [s["zero_std"][0] for s in seen] == [False, False, False, False, False, True]
    assert [s["clip_frac"][0] for s in seen] == [False, False, False, False, True, True]  # (0.3 + 0.5 + 0.5) / 3
    assert math.isnan(seen[1]["zero_std"][1]) and seen[5]["zero_std"][1] == pytest.approx(0.6)
    cfg = config.parse_config(["--task", "tiny", "--alarm-kl", "0"])
    assert alarms.thresholds(cfg)["kl"] is None and alarms.thresholds(cfg)["zero_std"] == cfg.alarm_zero_std


def test_the_watched_metric_and_the_golds_come_from_the_flags():
    cfg = config.parse_config(["--task", "tiny", "--rewards", "toyscore:1,toy:0"])
    assert alarms.watched_metric(cfg) == "toyscore" and alarms.gold_metrics(cfg) == ["toy"]
    assert alarms.watched_metric(dataclasses.replace(cfg, keep_best="eval/toy")) == "toy"


# ---- the live run (tests/test_train.py's tiny random SD3) --------------------------------------------------------


def _rows(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def _per_image(out, tag, metric="reward"):
    return T(json.load(open(os.path.join(out, f"eval_{tag}.json")))["per_image"][metric])


TAGS = {0: "before", 1: "iter000001", 2: "iter000002", 3: "after"}
WATCHED = ["--iterations", "3", "--eval-every", "1", "--save-every", "1"]
# every signal alarm's threshold crossed (the KL's from the first full window of 2), and a collapse at any fall
LOUD = ["--alarm-window", "2", "--alarm-kl", "1e-30", "--alarm-clip-frac", "0", "--alarm-zero-std", "0",
        "--alarm-se", "1e-6", "--keep-best", "eval/reward"]


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """Two runs of 3 iterations evaluated after each: alarms at their defaults, and loud (LOUD) with --keep-best."""
    tmp = tmp_path_factory.mktemp("watched")
    return run(tmp, *WATCHED, name="quiet")[1], run(tmp, *WATCHED, *LOUD, name="loud")[1]


def test_the_alarms_and_keep_best_change_nothing_else_in_the_run(watched):
    quiet, loud = watched
    rows_q, rows_l = _rows(quiet), _rows(loud)
    assert [r["alarm/kl"] for r in rows_q] == [0, 0, 0] and [r["alarm/kl"] for r in rows_l] == [0, 1, 1]
    for a, b in zip(rows_q, rows_l):
        assert {k for k in a if k.startswith("alarm/")} == {k for k in b if k.startswith("alarm/")}
        assert {k: v for k, v in a.items() if not k.startswith(("time/", "alarm/"))} == \
            {k: v for k, v in b.items() if not k.startswith(("time/", "alarm/", "best/"))}
    for tag in TAGS.values():
        assert json.load(open(os.path.join(quiet, f"eval_{tag}.json"))) == \
            json.load(open(os.path.join(loud, f"eval_{tag}.json")))
    a, b = lora_file(quiet, 3), lora_file(loud, 3)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    files = [set(os.listdir(os.path.join(out, "checkpoints"))) for out in (quiet, loud)]
    assert files[1] - files[0] == {"best"} and files[0] == {"iter-000001", "iter-000002", "iter-000003"}
    # 'latest' still means the newest iter-NNNNNN
    assert checkpoint.complete_checkpoints(os.path.join(loud, "checkpoints"))[-1] == "iter-000003"


def test_the_best_checkpoint_is_the_running_best_replaced_only_on_improvement(watched):
    _, loud = watched
    rows = _rows(loud)
    values = {it: _per_image(loud, tag) for it, tag in TAGS.items()}  # (8,) each
    # by hand: the trained policy's best so far (a later evaluation only if its mean is higher), and each later
    # evaluation's collapse statistic against the best before it (none at the first: nothing gained yet)
    best = [1]
    assert "alarm/collapse_z" not in rows[0] and rows[0]["alarm/collapse"] == 0
    for it in (2, 3):
        d = values[it].double() - values[best[-1]].double()
        assert rows[it - 1]["alarm/collapse_z"] == pytest.approx((d.mean() / d.std() * math.sqrt(8)).item())
        assert rows[it - 1]["alarm/collapse"] == float(d.mean() < 0)  # --alarm-se 1e-6: any fall
        best.append(it if values[it].mean() > values[best[-1]].mean() else best[-1])
    assert [r["best/iteration"] for r in rows] == best
    kept = json.load(open(os.path.join(loud, "checkpoints", "best", "best.json")))
    assert kept == {"tag": TAGS[best[-1]], "iteration": best[-1], "metric": "eval/reward",
                    "value": pytest.approx(values[best[-1]].mean().item())}
    folder = os.path.join(loud, "checkpoints", "best")
    a, b = lora_file(loud, best[-1]), load_file(os.path.join(folder, "lora", "pytorch_lora_weights.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # that iteration's policy, bit for bit
    # a complete checkpoint, written whole: its manifest covers every file, nothing half-written left beside it
    assert checkpoint.check_checkpoint(folder) == ""
    assert {"model.safetensors", "optimizer.bin", "progress.json", "alarms.json", "best.json", "lora"} <= \
        set(os.listdir(folder))
    assert not [d for d in os.listdir(os.path.dirname(folder)) if d.endswith((".tmp", ".old"))]


def test_the_best_checkpoint_resumes_exactly(watched, tmp_path):
    _, loud = watched
    best = json.load(open(os.path.join(loud, "checkpoints", "best", "best.json")))["iteration"]
    until = ["--iterations", str(best + 1)]
    # resumed from best/ and from the same iteration's periodic checkpoint: the same training state
    _, a = run(tmp_path, *WATCHED, *LOUD, *until, "--resume", os.path.join(loud, "checkpoints", "best"), name="a")
    _, b = run(tmp_path, *WATCHED, *LOUD, *until, "--resume", os.path.join(loud, "checkpoints", f"iter-{best:06d}"),
               name="b")
    x, y = lora_file(a, best + 1), lora_file(b, best + 1)
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    assert [{k: v for k, v in r.items() if not k.startswith("time/")} for r in _rows(a)] == \
        [{k: v for k, v in r.items() if not k.startswith("time/")} for r in _rows(b)]
    if best < 3:  # and as the straight run went on: its alarms' history came with the checkpoint
        z = lora_file(loud, best + 1)
        assert all(torch.equal(x[k], z[k]) for k in x)
        straight = _rows(loud)[best]
        assert {k: v for k, v in _rows(a)[0].items() if k.startswith("alarm/")} == \
            {k: v for k, v in straight.items() if k.startswith("alarm/")}


def test_stop_on_alarm_ends_the_run_cleanly_with_the_best_checkpoint_on_disk(tmp_path, capsys):
    result, out = run(tmp_path, "--iterations", "4", "--alarm-window", "2", "--alarm-kl", "1e-30", "--keep-best",
                      "eval/reward", "--stop-on-alarm", "true")
    printed = capsys.readouterr().out
    assert "alarm at iteration 2: train/approx_kl" in printed
    assert "--stop-on-alarm: the run ends at iteration 2" in printed
    assert [r["alarm/kl"] for r in _rows(out)] == [0.0, 1.0]  # judged once two iterations filled the window
    assert set(result["summaries"]) == {"before", "iter000002"}  # the alarm's evaluation is the run's last
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["best", "iter-000002"]
    assert os.path.exists(os.path.join(out, "eval_iter000002.json")) and not os.path.exists(
        os.path.join(out, "eval_after.json"))
    assert json.load(open(os.path.join(out, "checkpoints", "best", "best.json")))["iteration"] == 2  # its one


def test_the_toy_replay_keeps_a_best_that_evaluate_scores_as_the_run_did(tmp_path):
    # lab/alarms.py's live replay, 2 iterations and 16 images: TP-GRPO on ToyScore with the gold kept by
    out = str(tmp_path / "replay")
    small = ["--iterations", "2", "--eval-every", "1", "--eval-samples", "16", "--prompts-per-iter", "2",
             "--group-size", "4", "--sample-batch", "8", "--train-batch", "4"]
    train_cfg = config.parse_config(["--task", "tiny", "--algo", "tp-grpo", "--lr", "3e-3", "--clip-range", "1e-4",
                                     "--rewards", "toyscore:1,toy:0", "--seed", "10", "--judge-audit", "0",
                                     "--keep-best", "eval/toy", "--output-dir", out, "--report-to", "none", *small])
    train.main(train_cfg)
    best = os.path.join(out, "checkpoints", "best")
    evaluate.main(["--task", "tiny", "--rewards", "toyscore:1,toy:0", "--reward-batch", "64", "--eval-samples", "16",
                   "--checkpoint", best])
    kept = json.load(open(os.path.join(best, "best.json")))
    scored = T(json.load(open(os.path.join(best, "eval", "eval.json")))["per_image"]["toy"])
    torch.testing.assert_close(scored, _per_image(out, kept["tag"], "toy"), rtol=0, atol=1e-6)
    lines = lab_alarms.best_check(out).splitlines()
    assert lines[1].startswith("evaluate.py - the run's best evaluation: +0.000000 +- 0.000000")


# ---- the laboratory's replay on synthetic results ------------------------------------------------------------------


def _result(seed, proxy, gold, kl_late=1e-9, M=64):
    """A committed result's shape (lab/sweep.py's harvest): evaluations at 0, 20, ..., 100 whose per-image values are
    the given means plus a fixed spread, and 100 rows with approx_kl at `kl_late` from iteration 91."""
    spread = torch.linspace(-0.05, 0.05, M)
    evals = {}
    for e, (p, g) in enumerate(zip(proxy, gold)):
        tag = "before" if e == 0 else "after" if e == len(proxy) - 1 else f"iter{20 * e:06d}"
        per_image = {"reward": (p + spread).tolist(), "toy": (g + spread.flip(0)).tolist()}
        evals[tag] = {"iteration": 20 * e, "eval/reward": p, "eval/toy": g, "per_image": per_image}
    rows = [{"iteration": i, "reward/zero_std_groups": 0.0, "train/clip_frac": 0.2,
             "train/approx_kl": kl_late if i > 90 else 1e-9} for i in range(1, 101)]
    return {"argv": ["--seed", str(seed)], "rows": rows, "evals": evals}


def test_the_lab_replay_finds_where_a_synthetic_run_collapses_and_stays_silent_on_a_rising_one():
    cfg = config.parse_config(["--task", "tiny"])
    collapsing = _result(10, [0.1, 0.2, 0.3, 0.35, 0.37, 0.25], [0.4, 0.6, 0.7, 0.72, 0.65, 0.4], kl_late=1e-6)
    x = lab_alarms.replay(collapsing, cfg)
    # proxy up 0.02 and gold down 0.07 at 80 (the paired SE is 0 with the same spread each time), both down at 100
    assert x["drift"] == 80 and x["collapse_gold"] == 80 and x["collapse_proxy"] == 100
    # the KL's window mean (k 1e-6 + (10 - k) 1e-9) / 10 passes 2e-7 with k = 2 iterations of 1e-6: at 92
    assert (cfg.alarm_window, cfg.alarm_kl) == (10, 2e-7) and x["kl"] == 92
    assert x["zero_std"] is None and x["clip_frac"] is None
    assert x["late_drop"] == ["80-100"] and x["best_toy"] == (60, pytest.approx(0.72))
    assert x["late_loss"] == {"reward": pytest.approx(0.12), "toy": pytest.approx(0.32)}
    rising = _result(11, [0.1, 0.2, 0.3, 0.35, 0.37, 0.38], [0.4, 0.6, 0.7, 0.72, 0.73, 0.75])
    y = lab_alarms.replay(rising, cfg)
    assert all(y[name] is None for name in ("collapse_proxy", "collapse_gold", "drift", *alarms.SIGNALS))
    assert y["late_drop"] == [] and y["best_toy"][0] == 100
    text = lab_alarms.table({"tp-grpo": [collapsing, rising]}, cfg)
    assert "| tp-grpo | 10 | 80-100 | 0.120 / 0.320 | 100 | 80 | 80 | - / - / 92 | 60: 0.720 |" in text
    # the collapsing run's alarms against the end of its drop (100), the rising run's: none
    for row in ("| collapse (proxy watched) | 0 / 1 / 0 | 0 |", "| collapse (gold watched) | 1 / 0 / 0 | 0 |",
                "| proxy and gold part ways | 1 / 0 / 0 | 0 |", "| zero-std groups | 0 / 0 / 1 | 0 |",
                "| approx KL | 1 / 0 / 0 | 0 |"):
        assert row in text, row
