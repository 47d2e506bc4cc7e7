"""compare.py report on hand-written runs: the table's changes and standard errors against hand computation."""

import json
import math
import os
import types

import compare


def _write_run(folder, rewards, before, after):
    """A finished run: metrics.jsonl with the training rewards, eval_before/after.json with per-image scores."""
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for it, r in enumerate(rewards, 1):
            f.write(json.dumps({"iteration": it, "reward/mean": r, "cost/transformer_evals": 320}) + "\n")
    for tag, values in (("before", before), ("after", after)):
        mean = sum(values) / len(values)
        row = {"eval/toy_partial": mean, "eval/toy_partial_se": 0.05, "eval/toy_strict": mean / 2,
               "eval/toy_strict_se": 0.01, "per_image": {"toy_partial": values}}
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
    assert (tmp_path / "docs" / "compare_iterations.png").exists() and (tmp_path / "docs" / "compare_table.md").exists()
