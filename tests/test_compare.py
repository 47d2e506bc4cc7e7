"""compare.py report on hand-written runs: the table's changes and standard errors against hand computation."""

import json
import math
import os
import types

import compare


def _write_run(folder, rewards, before, after, tp=None):
    """A finished run: metrics.jsonl with the training rewards, costs and turning-point rates (tp: strict, base,
    kept; None for Flow-GRPO), eval_before/after.json with per-image scores."""
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for it, r in enumerate(rewards, 1):
            row = {"iteration": it, "reward/mean": r, "cost/transformer_evals": 320, "time/sample_s": 2.0,
                   "time/reward_s": 0.5, "time/train_s": 1.5, "time/elapsed_s": 10.0 * it}
            if tp:
                row.update({"steps/tp_rate_strict": tp[0], "steps/tp_rate_base": tp[1], "steps/tp_kept": tp[2]})
            f.write(json.dumps(row) + "\n")
    for tag, values in (("before", before), ("after", after)):
        mean = sum(values) / len(values)
        row = {"eval/reward": mean, "eval/reward_se": 0.05, "eval/toy_strict": mean / 2,
               "eval/toy_strict_se": 0.01, "per_image": {"reward": values}}
        with open(os.path.join(folder, f"eval_{tag}.json"), "w") as f:
            json.dump(row, f)


def test_report_pairs_the_change_image_by_image(tmp_path):
    before = [0.5, 0.5, 1.0, 0.0]
    # two seeds of one method: image changes (+0.5, 0, 0, +0.5) and (+0.5, +0.5, -0.5, 0)
    _write_run(tmp_path / "flow-grpo-seed0", [0.6, 0.7], before, [1.0, 0.5, 1.0, 0.5])
    _write_run(tmp_path / "flow-grpo-seed1", [0.6, 0.8], before, [1.0, 1.0, 0.5, 0.0])
    table = compare.report(types.SimpleNamespace(out=str(tmp_path), docs=str(tmp_path / "docs")))
    row = [line for line in table.splitlines() if line.startswith("| flow-grpo")][0].split(" | ")
    # per seed: +0.25 and +0.125; mean +0.1875, SE over seeds = std([0.25, 0.125]) / sqrt(2) = 0.0625
    assert row[4] == "+0.188 +- 0.062"
    # seed-averaged per image: (+0.5, +0.25, -0.25, +0.25); SE over the 4 images = std / 2
    d = [0.5, 0.25, -0.25, 0.25]
    m = sum(d) / 4
    se = math.sqrt(sum((x - m) ** 2 for x in d) / 3) / 2
    assert row[5] == f"{se:.3f}"
    # the ratio divides by the larger SE (here the one over images, 0.156)
    assert row[6] == f"{m / se:+.1f}"
    # Flow-GRPO reaches its own final training reward; its run took 20 s
    assert row[8] == "-" and row[9] == "2 / 640 / 8" and row[10] == "20"
    assert (tmp_path / "docs" / "compare_curves.png").exists() and (tmp_path / "docs" / "compare_table.md").exists()


def test_report_rates_and_costs_to_reach_flow_grpos_final_reward(tmp_path):
    before = [0.5, 0.5]
    _write_run(tmp_path / "flow-grpo-seed0", [0.6, 0.6, 0.6], before, before)
    # TP-GRPO's 5-iteration trailing mean reaches 0.6 at iteration 2 ((0.5 + 0.7) / 2), after 2 x 4 s of its loop
    _write_run(tmp_path / "tp-grpo-seed0", [0.5, 0.7, 0.9], before, [1.0, 0.5], tp=(0.02, 0.05, 0.01))
    table = compare.report(types.SimpleNamespace(out=str(tmp_path), docs=str(tmp_path / "docs")))
    row = [line for line in table.splitlines() if line.startswith("| tp-grpo ")][0].split(" | ")
    assert row[8] == "2.0% / 5.0% / 1.0%" and row[9] == "2 / 640 / 8" and row[10] == "30"
