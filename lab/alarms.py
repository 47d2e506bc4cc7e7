"""The alarms of a long run (alarms.py) replayed on the laboratory's committed runs: would they have caught the late
collapses of toyscore-long, and stayed silent on the runs that did not collapse? The same pure functions as the
live run (alarms.collapse, drift, signals, best_index) on each run's evaluations in order (per-image proxy
'reward', which is ToyScore there, and gold 'toy') and its metrics rows, with the tiny preset's thresholds.

  python -m lab.alarms                   # lab/reports/alarms.md: one row per run (the table is printed too)
  python -m lab.alarms best RUN_DIR      # a live replay: its best checkpoint, scored by evaluate.py, against the
                                         # run's best evaluation (paired change over the same images)

The live replay of a collapsing run (TP-GRPO seed 10, which fell at 80-100), on the CPU kind its result was recorded
on (lab/results' machine field), keeping the best checkpoint by the gold:

  python train.py --task tiny --algo tp-grpo --tp-rule strict --lr 3e-3 --clip-range 1e-4 --noise-level 0.7 \
      --window 5 --rewards toyscore:1,toy:0 --iterations 100 --eval-every 20 --seed 10 --judge-audit 0 \
      --keep-best eval/toy --output-dir runs/replay --report-to none
  python evaluate.py --task tiny --rewards toyscore:1,toy:0 --reward-batch 64 --checkpoint runs/replay/checkpoints/best
  python -m lab.alarms best runs/replay --result \
      lab/results/heldout/tp-grpo_lr0.003_clip0.0001_a0.7_W5_it100_ev20_toyscore/seed10.json.gz

Tested by `python -m pytest tests/test_alarms.py` (on synthetic results).

Shape legend: E evaluation points, M evaluation images, I iterations.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import os

import torch

import alarms
import config
from lab import compare, sweep
from lab.report import late_loss, seed_of

LAB = os.path.dirname(os.path.abspath(__file__))
PROXY, GOLD = "reward", "toy"  # under ToyScore the trained reward is the proxy; the programmatic score is the gold
LATE, DROP = 60, 0.03  # the laboratory's late-drop rule (lab/README.md, 'The clip check'): a fall > 0.03 from 60 on


def evaluations(result: dict, metrics=(PROXY, GOLD)) -> list[tuple[int, dict]]:
    """A committed result's evaluations in order, as the live run keeps them: [(iteration, {metric: (M,)})]."""
    evals = sorted(result["evals"].values(), key=lambda e: e["iteration"])
    return [(e["iteration"], {m: torch.tensor([math.nan if x is None else x for x in e["per_image"][m]])
                              for m in metrics if m in e["per_image"]}) for e in evals]


def first_firing(evals: list, rule) -> int | None:
    """The first iteration at which `rule`(the evaluations so far) fires, judged after each evaluation as the live
    run does; None if never."""
    return next((evals[k][0] for k in range(1, len(evals)) if rule(evals[:k + 1])), None)


def replay(result: dict, cfg: config.Config) -> dict:
    """The alarms of one committed run under `cfg`'s thresholds: the first iteration each fires (None: never), the
    best evaluations by proxy and gold (as --keep-best would keep them), the late-drop stretch (the lab's rule) and the
    late losses."""
    evals, se = evaluations(result), cfg.alarm_se
    out = {"collapse_proxy": first_firing(evals, lambda e: alarms.collapse(e, PROXY, se)[0]),
           "collapse_gold": first_firing(evals, lambda e: alarms.collapse(e, GOLD, se)[0]),
           "drift": first_firing(evals, lambda e: alarms.drift(e, PROXY, [GOLD], se)[0])}
    rows, limits = result["rows"], alarms.thresholds(cfg)
    for name in alarms.SIGNALS:
        fired = (row["iteration"] for i, row in enumerate(rows)
                 if alarms.signals(rows[:i + 1], cfg.alarm_window, limits).get(name, (False,))[0])
        out[name] = next(fired, None)
    trained = evals[1:]  # --keep-best never keeps the policy before training
    for metric in (PROXY, GOLD):
        best = alarms.best_index(trained, metric)
        out[f"best_{metric}"] = (trained[best][0], trained[best][1][metric].nanmean().item())
    means = [v[PROXY].nanmean().item() for _, v in evals]
    out["late_drop"] = [f"{evals[k - 1][0]}-{evals[k][0]}" for k in range(1, len(evals))
                        if evals[k - 1][0] >= LATE and means[k - 1] - means[k] > DROP]
    out["late_loss"] = {m: late_loss([result], m)[seed_of(result)] for m in (PROXY, GOLD)}
    return out


def _at(iteration: int | None) -> str:
    return "-" if iteration is None else str(iteration)


COLUMNS = {"collapse_proxy": "collapse (proxy watched)", "collapse_gold": "collapse (gold watched)",
           "drift": "proxy and gold part ways", "zero_std": "zero-std groups", "clip_frac": "clip fraction",
           "kl": "approx KL"}


def table(runs: dict[str, list[dict]], cfg: config.Config) -> str:
    """One row per run ({label: [result per seed]}), then per alarm: in the runs with a late drop, whether it fired
    before the evaluation that ends the drop, at it, or not by then; in the others, whether it fired at all."""
    lines = ["| run | seed | late drop (proxy > 0.03 from 60) | late loss proxy / gold | collapse (proxy) | "
             "collapse (gold) | drift | zero-std / clip / KL | kept by gold: iteration, gold |",
             "|---|---|---|---|---|---|---|---|---|"]
    tally = {name: [0, 0, 0, 0] for name in COLUMNS}  # dropped: earlier, at the drop's end, not by then; others: fired
    dropped = 0
    for label, seeds in runs.items():
        for r in seeds:
            x = replay(r, cfg)
            end = int(x["late_drop"][0].split("-")[1]) if x["late_drop"] else None
            dropped += end is not None
            for name, t in tally.items():
                at = x[name]
                if end is None:
                    t[3] += at is not None
                else:
                    t[0 if at is not None and at < end else 1 if at == end else 2] += 1
            signal = " / ".join(_at(x[name]) for name in alarms.SIGNALS)
            lines.append(f"| {label} | {seed_of(r)} | {', '.join(x['late_drop']) or '-'} | "
                         f"{x['late_loss'][PROXY]:.3f} / {x['late_loss'][GOLD]:.3f} | {_at(x['collapse_proxy'])} | "
                         f"{_at(x['collapse_gold'])} | {_at(x['drift'])} | {signal} | "
                         f"{x['best_toy'][0]}: {x['best_toy'][1]:.3f} |")
    total = sum(len(seeds) for seeds in runs.values())
    lines += ["", f"| alarm | {dropped} runs with a late drop: fired before the evaluation that ends it / at it / not "
                  f"by then | {total - dropped} runs without: fired |", "|---|---|---|"]
    lines += [f"| {COLUMNS[name]} | {t[0]} / {t[1]} / {t[2]} | {t[3]} |" for name, t in tally.items()]
    lines.append(f"\nThresholds: --alarm-se {cfg.alarm_se:g}; the training-signal alarms on the mean of "
                 f"{cfg.alarm_window} iterations: --alarm-zero-std {cfg.alarm_zero_std:g}, --alarm-clip-frac "
                 f"{cfg.alarm_clip_frac:g}, --alarm-kl {cfg.alarm_kl:g} (the tiny preset's).")
    return "\n".join(lines)


def committed_runs(results: str) -> dict[str, list[dict]]:
    """Every finished run of toyscore-long, and toyscore-clip's at clip 1e-5 (its others are toyscore-long's)."""
    runs = {label: seeds for label, (_, seeds) in
            sweep.load_experiment(results, compare.EXPERIMENTS["toyscore-long"]).items()}
    clip = sweep.load_experiment(results, compare.EXPERIMENTS["toyscore-clip"])
    runs.update({label: seeds for label, (_, seeds) in clip.items() if label.endswith("clip 1e-5")})
    return runs


def report(results: str, out: str) -> str:
    cfg = config.parse_config(["--task", "tiny"])
    text = ("### The alarms replayed on the committed ToyScore runs\n\n"
            "Each run's committed evaluations (every 20 iterations, 1024 held-out images) and metrics rows judged "
            "in order by alarms.py's rules with the tiny preset's thresholds (`python -m lab.alarms`). Columns: the "
            "stretch where the held-out proxy falls by more than 0.03 from iteration 60 on (the laboratory's "
            "late-drop rule); the late loss (best evaluation from 20 on minus the last); the first iteration at "
            "which each alarm fires (- never): collapse with the proxy watched (the default: the first training "
            "reward) and with the gold watched (`--keep-best eval/toy`), drift (proxy up and gold down since the "
            "previous evaluation), and the training-signal alarms; the evaluation `--keep-best eval/toy` keeps.\n\n"
            + table(committed_runs(results), cfg) + "\n")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    return text


def best_check(run_dir: str, result: str = "") -> str:
    """A live run's best checkpoint against its best evaluation: the paired change of evaluate.py's score of
    checkpoints/best (its eval/eval.json) against the run's own evaluation at that iteration (eval_<tag>.json) and,
    given the committed `result` of the same run, against that result's evaluation there (a bit-exact replay gives
    0)."""
    best = json.load(open(os.path.join(run_dir, "checkpoints", alarms.BEST, "best.json")))
    metric = best["metric"].removeprefix("eval/")
    scored = torch.tensor(json.load(open(os.path.join(run_dir, "checkpoints", alarms.BEST, "eval", "eval.json")))
                          ["per_image"][metric], dtype=torch.float64)
    own = {e["iteration"]: e for e in (json.load(open(p)) for p in glob.glob(os.path.join(run_dir, "eval_*.json")))}
    evals = [(i, {metric: torch.tensor(e["per_image"][metric], dtype=torch.float64)}) for i, e in sorted(own.items())]
    top = alarms.best_index(evals[1:], metric) + 1
    lines = [f"kept: iteration {best['iteration']}, {best['metric']} {best['value']:.4f}; the run's best evaluation: "
             f"iteration {evals[top][0]}, {evals[top][1][metric].mean():.4f}; evaluate.py on checkpoints/best: "
             f"{scored.mean():.4f}"]
    change, se = alarms.paired(evals[top][1][metric], scored)
    lines.append(f"evaluate.py - the run's best evaluation: {change:+.6f} +- {se:.6f} (paired SE)")
    if result:
        with gzip.open(result, "rt") as f:
            committed = dict(evaluations(json.load(f), (metric,)))
        change, se = alarms.paired(committed[best["iteration"]][metric].double(), scored)
        lines.append(f"evaluate.py - the committed run's evaluation at iteration {best['iteration']}: {change:+.6f} "
                     f"+- {se:.6f} (paired SE)")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", default="report", choices=["report", "best"])
    p.add_argument("run_dir", nargs="?", help="best: the live run's output folder")
    p.add_argument("--result", default="", help="best: the committed result of the same run (lab/results/...)")
    p.add_argument("--results", default=os.path.join(LAB, "results"))
    p.add_argument("--out", default=os.path.join(LAB, "reports", "alarms.md"))
    args = p.parse_args()
    if args.command == "best":
        if not args.run_dir:
            p.error("best needs the run's output folder: python -m lab.alarms best RUN_DIR")
        print(best_check(args.run_dir, args.result))
    else:
        print(report(args.results, args.out))


if __name__ == "__main__":
    main()
