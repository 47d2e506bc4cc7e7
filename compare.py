"""The toy world as a laboratory: the paper's experiments (Sec. 5: the headline comparison, the ablations of the
noise level and the SDE window) in miniature, each a named set of variants x seeds of `train.py --task tiny`.

  python compare.py list                        # the experiments, their variants, seeds and what is finished
  python compare.py run grid fair headline      # run experiments in order; finished runs are skipped
  python compare.py run grid --jobs 2           # two runs at a time (one thread each)
  python compare.py report grid                 # docs/lab/{grid.md, grid.png} (the table is printed too)

A variant fixes the experiment's axes (the method and lr, ratio clip, noise level a, window W, iterations); every
other setting is the tiny preset's. The axes' values are written out in full in every run's name, so a run means
the same thing after the preset changes, and two experiments that need the same run share it. Hyperparameters are
chosen on the validation split (toyworld.py; the `grid` experiment, seeds 0 and 1), each method's best by its mean
validation change; every other experiment is reported on the held-out split with fresh seeds (10, 11, 12), so a
choice never sees the images or the training seeds it is reported on.

Each finished run leaves two things: its folder under runs/lab/ (checkpoint, pictures, everything train.py writes)
and a small gzipped JSON under results/ (its metrics, its evaluations' summaries and per-image scores, the machine
it ran on), which is committed: a sweep killed at any point, or moved to another machine, picks up where it
stopped, and `report` needs only results/.

Shape legend: S seeds, I iterations, M evaluation images.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure

import toyworld

ROOT = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(ROOT, "train.py")

# ----------------------------------------------------------------------------------------------------------------
# 1. Variants and experiments
# ----------------------------------------------------------------------------------------------------------------

METHODS = {"flow-grpo": ["--algo", "flow-grpo"], "tp-grpo": ["--algo", "tp-grpo", "--tp-rule", "strict"],
           "tp-grpo-base": ["--algo", "tp-grpo", "--tp-rule", "base"], "incremental": ["--algo", "incremental"]}
COLORS = {"flow-grpo": "tab:gray", "tp-grpo": "tab:red", "tp-grpo-base": "tab:orange", "incremental": "tab:blue"}
# The axes and their values in the tiny preset when the laboratory was set up, pinned here (not read from the
# preset) so that a finished run's name keeps its meaning if the preset changes.
PRESET = {"lr": 1e-3, "clip_range": 1e-4, "noise_level": 0.7, "window": 5, "iterations": 30, "eval_every": 0}
FLAGS = {"lr": "--lr", "clip_range": "--clip-range", "noise_level": "--noise-level", "window": "--window",
         "iterations": "--iterations", "eval_every": "--eval-every"}
SPLIT_FLAGS = {"heldout": [], "validation": ["--eval-prompts", toyworld.VALIDATION_SETTINGS["eval_prompts"],
                                             "--eval-seed", str(toyworld.VALIDATION_SETTINGS["eval_seed"])]}
# The grid of the fair comparison: a window of each ladder, widened one rung at a time while a method's best
# setting sits at its edge (`grid_axes`).
LR_LADDER = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
CLIP_LADDER = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
GRID_START = {"lr": (3e-4, 1e-2), "clip_range": (1e-4, 1e-3)}  # (lowest, highest) before widening
GRID_METHODS = ("flow-grpo", "tp-grpo")
GRID_SEEDS, REPORT_SEEDS = (0, 1), (10, 11, 12)


@dataclass(frozen=True)
class Variant:
    """One setting of the axes: a method plus lr, ratio clip, noise level a, window W, iterations, evaluations, and
    the judge of window states (--completion)."""

    method: str
    lr: float = PRESET["lr"]
    clip_range: float = PRESET["clip_range"]
    noise_level: float = PRESET["noise_level"]
    window: int = PRESET["window"]
    iterations: int = PRESET["iterations"]
    eval_every: int = PRESET["eval_every"]
    completion: str = "ode"  # the paper's judge; docs/method.md, 'Cheaper judges'

    @property
    def name(self) -> str:
        """Every axis written out: 'tp-grpo_lr0.003_clip0.0001_a0.7_W5_it30' (+ '_ev20' with evaluations on the
        way, + '_ode2' / '_x0' with a cheaper judge)."""
        return (f"{self.method}_lr{self.lr:g}_clip{self.clip_range:g}_a{self.noise_level:g}_W{self.window}"
                f"_it{self.iterations}" + (f"_ev{self.eval_every}" if self.eval_every else "")
                + (f"_{self.completion.replace(':', '')}" if self.completion != "ode" else ""))

    def flags(self) -> list[str]:
        """The train.py flags of this variant (the preset gives the rest)."""
        axes = dataclasses.asdict(self)
        judge = [] if self.completion == "ode" else ["--completion", self.completion]
        return [*METHODS[self.method], *[a for k, f in FLAGS.items() for a in (f, f"{axes[k]:g}")], *judge]


@dataclass(frozen=True)
class Experiment:
    name: str
    doc: str
    split: str  # "validation" (choosing) or "heldout" (reporting)
    seeds: tuple[int, ...]
    variants: object  # (results folder) -> {label: Variant}; may read finished runs (the grid's choice)


def _ladder_window(ladder: tuple, lo: float, hi: float) -> list[float]:
    return [v for v in ladder if lo <= v <= hi]


def grid_axes(results: str) -> dict[str, list[float]]:
    """The grid's lr and clip values: GRID_START, widened by one rung of the ladder towards an edge where a
    method's best setting (on the finished grid) sits, repeatedly, until no best is at a widenable edge. Decided
    before any result was seen: the same grid for every method, widened for all of them."""
    bounds = dict(GRID_START)
    while True:
        axes = {k: _ladder_window(ladder, *bounds[k]) for k, ladder in (("lr", LR_LADDER), ("clip_range", CLIP_LADDER))}
        runs = {m: {(lr, c): Variant(m, lr=lr, clip_range=c) for lr in axes["lr"] for c in axes["clip_range"]}
                for m in GRID_METHODS}
        if not all(finished(results, "validation", v, GRID_SEEDS) for r in runs.values() for v in r.values()):
            return axes  # the current grid is not finished: nothing to widen yet
        widened = dict(bounds)
        for m in GRID_METHODS:
            best = max(runs[m], key=lambda key: mean_score(results, "validation", runs[m][key], GRID_SEEDS))
            for k, value, ladder in (("lr", best[0], LR_LADDER), ("clip_range", best[1], CLIP_LADDER)):
                i, lo, hi = ladder.index(value), ladder.index(widened[k][0]), ladder.index(widened[k][1])
                if i == lo and lo > 0:
                    widened[k] = (ladder[lo - 1], widened[k][1])
                if i == hi and hi < len(ladder) - 1:
                    widened[k] = (widened[k][0], ladder[hi + 1])
        if widened == bounds:
            return axes
        bounds = widened


def grid_variants(results: str) -> dict[str, Variant]:
    axes = grid_axes(results)
    return {Variant(m, lr=lr, clip_range=c).name: Variant(m, lr=lr, clip_range=c)
            for m in GRID_METHODS for lr in axes["lr"] for c in axes["clip_range"]}


def chosen(results: str, method: str) -> Variant:
    """The method's setting chosen on validation: the grid's best mean validation score over GRID_SEEDS.
    Flow-GRPO takes its own best; TP-GRPO, its base rule and the incremental ablation take TP-GRPO's (the paper's
    ablations share the method's settings)."""
    tuned = "flow-grpo" if method == "flow-grpo" else "tp-grpo"
    grid = [v for v in grid_variants(results).values() if v.method == tuned]
    missing = [v.name for v in grid if not finished(results, "validation", v, GRID_SEEDS)]
    if missing:
        raise SystemExit(f"error: the grid is not finished ({len(missing)} of {len(grid)} {tuned} settings missing, "
                         f"e.g. {missing[0]}); run `python compare.py run grid` first")
    best = max(grid, key=lambda v: mean_score(results, "validation", v, GRID_SEEDS))
    return dataclasses.replace(best, method=method)


def _at_choice(methods, **axes):
    """Variants of `methods` at their chosen settings with some axes changed: (results) -> {label: Variant}."""
    return lambda results: {m: dataclasses.replace(chosen(results, m), **axes) for m in methods}


ALL = tuple(METHODS)
EXPERIMENTS = {e.name: e for e in [
    Experiment("methods", "the four methods at the tiny preset's settings (TP-GRPO's), seeds 0-2: the quick "
               "comparison", "heldout", (0, 1, 2), lambda results: {m: Variant(m) for m in ALL}),
    Experiment("grid", "Flow-GRPO and TP-GRPO over lr x ratio clip on the validation split, seeds 0 and 1: each "
               "method's setting is chosen here", "validation", GRID_SEEDS, grid_variants),
    Experiment("fair", "every method at its chosen setting and at the preset's, held-out, fresh seeds", "heldout",
               REPORT_SEEDS, lambda results: {**_at_choice(ALL)(results),
                                              **{f"{m} @preset": Variant(m) for m in ALL}}),
    Experiment("headline", "100 iterations at the chosen settings with a held-out evaluation every 20: the paper's "
               "sample-efficiency claim", "heldout", REPORT_SEEDS,
               _at_choice(("flow-grpo", "tp-grpo", "incremental"), iterations=100, eval_every=20)),
    Experiment("noise", "the noise level a in {0.4, 0.7, 1.0} at the chosen settings (the paper's Table of a)",
               "heldout", REPORT_SEEDS, lambda results: {f"{m} a={a:g}": v for a in (0.4, 0.7, 1.0) for m, v in
                                                         _at_choice(ALL, noise_level=a)(results).items()}),
    Experiment("window", "the SDE window: all 5 trained steps of T = 6 against the first 3", "heldout", REPORT_SEEDS,
               lambda results: {f"{m} W={w}": v for w in (5, 3) for m, v in
                                _at_choice(("flow-grpo", "tp-grpo", "incremental"), window=w)(results).items()}),
    Experiment("judges", "TP-GRPO with cheaper judges of the window states (docs/method.md, 'Cheaper judges') "
               "against the full ODE and Flow-GRPO", "heldout", REPORT_SEEDS,
               lambda results: {**{f"tp-grpo {c}": v for c in ("ode", "ode:3", "ode:2", "x0") for v in
                                   _at_choice(("tp-grpo",), completion=c)(results).values()},
                                "flow-grpo": chosen(results, "flow-grpo")}),
]}


# ----------------------------------------------------------------------------------------------------------------
# 2. Runs and their results
# ----------------------------------------------------------------------------------------------------------------

def result_path(results: str, split: str, variant: Variant, seed: int) -> str:
    return os.path.join(results, split, variant.name, f"seed{seed}.json.gz")


def finished(results: str, split: str, variant: Variant, seeds) -> bool:
    return all(os.path.exists(result_path(results, split, variant, s)) for s in seeds)


def load_result(results: str, split: str, variant: Variant, seed: int) -> dict:
    with gzip.open(result_path(results, split, variant, seed), "rt") as f:
        return json.load(f)


def mean_score(results: str, split: str, variant: Variant, seeds) -> float:
    """The evaluation score after training (eval/reward), mean over seeds: what the grid chooses by."""
    return sum(load_result(results, split, variant, s)["evals"]["after"]["eval/reward"] for s in seeds) / len(seeds)


def machine() -> dict:
    """Where a run ran: results differ in the last digits between CPUs (float rounding), so each result says."""
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        cpu = names[0] if names else cpu
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": os.environ.get("OMP_NUM_THREADS", ""),
            "torch": torch.__version__, "commit": commit.stdout.strip(), "date": time.strftime("%Y-%m-%d %H:%M")}


def harvest(folder: str, out_path: str, argv: list[str], jobs: int) -> None:
    """A finished run folder -> its small result: metrics rows, every evaluation's summary with the per-image
    score and strict accuracy (the paired standard errors need them), the command and the machine."""
    rows = [json.loads(line) for line in open(os.path.join(folder, "metrics.jsonl"))]
    evals = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("eval_") and name.endswith(".json"):
            e = json.load(open(os.path.join(folder, name)))
            per_image = {k: v for k, v in e.pop("per_image").items() if k in ("reward", "toy_strict")}
            evals[name[5:-5]] = {**e, "per_image": per_image}
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    tmp = out_path + ".part"
    with gzip.open(tmp, "wt") as f:
        json.dump({"argv": argv, "machine": dict(machine(), concurrent_runs=jobs), "rows": rows, "evals": evals}, f)
    os.replace(tmp, out_path)  # a result exists only whole


def run(names: list[str], results: str, runs: str, jobs: int = 1) -> None:
    """Run every unfinished (variant, seed) of the experiments in order, `jobs` processes at a time. The list of
    runs is recomputed after each wave: the grid widens itself, and later experiments read its choice."""
    for name in names:
        exp = EXPERIMENTS[name]
        while True:
            # seed-major: a whole first seed of every variant before the next seed (a sweep cut short still covers
            # every variant)
            todo = [(v, s) for s in exp.seeds for v in dict.fromkeys(exp.variants(results).values())
                    if not finished(results, exp.split, v, [s])]
            if not todo:
                print(f"{name}: every run finished")
                break
            print(f"{name}: {len(todo)} runs to go")
            _run_wave(todo, exp.split, results, runs, jobs)


def _run_wave(todo: list, split: str, results: str, runs: str, jobs: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1") if jobs == 1 else "1")
    active = []
    try:
        _launch(todo, split, results, runs, jobs, env, active)
    except BaseException:  # a failed run or Ctrl-C: stop the others too (their folders are redone next time)
        for proc, *_ in active:
            proc.kill()
        raise


def _launch(todo: list, split: str, results: str, runs: str, jobs: int, env: dict, active: list) -> None:
    for i, (variant, seed) in enumerate(todo):
        folder = os.path.join(runs, split, variant.name, f"seed{seed}")
        argv = ["--task", "tiny", *variant.flags(), *SPLIT_FLAGS[split], "--seed", str(seed), "--output-dir", folder,
                "--report-to", "none"]
        print(f"[{i + 1}/{len(todo)}] python train.py " + " ".join(argv), flush=True)
        # a process per run: every run starts from the same fresh state, as when launched by hand
        log = open(os.path.join(_mkdir(folder), "train.log"), "w")
        proc = subprocess.Popen([sys.executable, TRAIN, *argv], stdout=log, stderr=subprocess.STDOUT, env=env)
        active.append((proc, folder, result_path(results, split, variant, seed), argv, log))
        while len(active) >= jobs or (i == len(todo) - 1 and active):
            active[:] = _reap(active, jobs)


def _reap(active: list, jobs: int) -> list:
    time.sleep(0.2)
    still = []
    for proc, folder, out, argv, log in active:
        if proc.poll() is None:
            still.append((proc, folder, out, argv, log))
            continue
        log.close()
        if proc.returncode:
            raise SystemExit(f"error: train.py failed ({proc.returncode}) in {folder}; see {folder}/train.log")
        harvest(folder, out, argv, jobs)
        print(f"  done: {out}", flush=True)
    return still


def _mkdir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


# ----------------------------------------------------------------------------------------------------------------
# 3. Reports: a table and curves for any experiment, the grid's matrix, the headline's cost to reach a score
# ----------------------------------------------------------------------------------------------------------------

def _se(x: torch.Tensor) -> torch.Tensor:
    """Standard error over seeds (dim 0); 0 for a single seed."""
    return x.std(0) / math.sqrt(x.shape[0]) if x.shape[0] > 1 else torch.zeros_like(x[0])


def _smooth(x: torch.Tensor, k: int = 5) -> torch.Tensor:
    """Trailing moving average over iterations (the training reward is noisy): (S, I) -> (S, I)."""
    c = torch.cumsum(torch.nn.functional.pad(x, (1, 0)), 1)  # (S, I+1)
    idx = torch.arange(1, x.shape[1] + 1)
    lo = (idx - k).clamp(min=0)
    return (c[:, idx] - c[:, lo]) / (idx - lo)


def _curve(seeds: list[dict], key: str) -> torch.Tensor:
    n = min(len(r["rows"]) for r in seeds)
    return torch.tensor([[float(row.get(key, math.nan)) for row in r["rows"][:n]] for r in seeds])  # (S, I)


def _costs(seeds: list[dict]) -> dict[str, torch.Tensor]:
    """Cumulative cost after iterations 0..I (0 = before training), mean over seeds: {"iteration", "evaluations",
    "seconds"} each (I+1,). Seconds are sampling + rewards + training (evaluations left out)."""
    seconds = sum(_curve(seeds, f"time/{k}_s") for k in ("sample", "reward", "train"))  # (S, I)
    pad = lambda x: torch.cat([torch.zeros(1), x])  # noqa: E731
    return {"iteration": pad(_curve(seeds, "iteration")[0]),
            "evaluations": pad(torch.cumsum(_curve(seeds, "cost/transformer_evals")[0], 0)),
            "seconds": pad(torch.cumsum(seconds, 1).mean(0))}


def _evals(seeds: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every evaluation point of the runs (before, on the way, after): iterations (E,) and scores (S, E)."""
    def at(tag, r):
        return 0 if tag == "before" else r["evals"][tag]["iteration"]
    tags = sorted(seeds[0]["evals"], key=lambda t: at(t, seeds[0]))
    its = torch.tensor([at(t, seeds[0]) for t in tags])  # (E,)
    return its, torch.tensor([[r["evals"][t]["eval/reward"] for t in tags] for r in seeds])  # (S, E)


def load_experiment(results: str, exp: Experiment) -> dict[str, tuple[Variant, list[dict]]]:
    """{label: (variant, [result per finished seed])} of the variants with at least one finished seed."""
    out = {}
    for label, v in exp.variants(results).items():
        done = [load_result(results, exp.split, v, s) for s in exp.seeds if finished(results, exp.split, v, [s])]
        if done:
            out[label] = (v, done)
    return out


def change_stats(seeds: list[dict]) -> dict[str, float]:
    """The score change after - before: its mean and SE over seeds, and its paired SE over images (the seed-averaged
    change of every image: what another draw of evaluation images could move it)."""
    before = torch.tensor([r["evals"]["before"]["per_image"]["reward"] for r in seeds])  # (S, M)
    after = torch.tensor([r["evals"]["after"]["per_image"]["reward"] for r in seeds])  # (S, M)
    change = (after - before).mean(1)  # (S,)
    d = (after - before).mean(0)  # (M,)
    return {"before": before.mean().item(), "after": after.mean().item(), "after_se": _se(after.mean(1)[:, None])[0],
            "change": change.mean().item(), "change_se": float(_se(change[:, None])[0]),
            "image_se": (d.std() / math.sqrt(d.numel())).item()}


def table(runs: dict) -> str:
    """One row per variant: its axes, seeds, score before / after / change with both SEs, strict accuracy,
    turning-point rates, transformer evaluations per trajectory and seconds per run."""
    lines = ["| variant | lr | clip | a | W | iterations | seeds | before | after | change +- SE over seeds | paired "
             "SE over images | change / SE | strict after | turning points (strict / base / kept) | evaluations per "
             "trajectory | seconds per run |", "|" + "---|" * 16]
    for label, (v, seeds) in runs.items():
        c = change_stats(seeds)
        strict = torch.tensor([r["evals"]["after"]["eval/toy_strict"] for r in seeds])  # (S,)
        rates = [_curve(seeds, f"steps/{k}").nanmean().item() for k in ("tp_rate_strict", "tp_rate_base", "tp_kept")]
        tps = "-" if v.method == "flow-grpo" else " / ".join(f"{100 * r:.1f}%" for r in rates)
        per_traj = _curve(seeds, "cost/evals_per_trajectory").mean().item()
        run_s = torch.tensor([r["rows"][-1]["time/elapsed_s"] for r in seeds]).mean().item()
        lines.append(f"| {label} | {v.lr:g} | {v.clip_range:g} | {v.noise_level:g} | {v.window} | {v.iterations} | "
                     f"{len(seeds)} | {c['before']:.3f} | {c['after']:.3f} +- {c['after_se']:.3f} | "
                     f"{c['change']:+.3f} +- {c['change_se']:.3f} | {c['image_se']:.3f} | "
                     f"{c['change'] / max(c['change_se'], c['image_se'], 1e-12):+.1f} | {strict.mean():.3f} | {tps} | "
                     f"{per_traj:.0f} | {run_s:.0f} |")
    return "\n".join(lines)


def grid_table(results: str, runs: dict) -> str:
    """Per method, validation change +- SE over seeds at every (lr, clip); the best setting with every seed finished
    in bold (the choice is made once the whole grid is: `chosen`)."""
    lines = []
    for m in GRID_METHODS:
        mine = {(v.lr, v.clip_range): seeds for v, seeds in runs.values() if v.method == m}
        if not mine:
            continue
        lrs, clips = sorted({k[0] for k in mine}), sorted({k[1] for k in mine})
        complete = [k for k in mine if len(mine[k]) == len(GRID_SEEDS)]  # the choice needs every grid seed
        best = max(complete, key=lambda k: change_stats(mine[k])["change"]) if complete else None
        lines += [f"**{m}** (validation change +- SE over seeds; rows lr, columns ratio clip)", "",
                  "| lr | " + " | ".join(f"clip {c:g}" for c in clips) + " |", "|---|" + "---|" * len(clips)]
        for lr in lrs:
            cells = []
            for c in clips:
                if (lr, c) not in mine:
                    cells.append("-")
                    continue
                st = change_stats(mine[(lr, c)])
                cell = f"{st['change']:+.3f} +- {st['change_se']:.3f}" + (
                    "" if len(mine[(lr, c)]) == len(GRID_SEEDS) else f" ({len(mine[(lr, c)])} seed)")
                cells.append(f"**{cell}**" if (lr, c) == best else cell)
            lines.append(f"| {lr:g} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def reach_table(runs: dict, samples: int = 1000) -> str:
    """What each method spends to reach Flow-GRPO's best score: the first evaluation point (held-out, mean over
    seeds) and the first iteration (5-iteration mean of the training reward, mean over seeds) at or above
    Flow-GRPO's best, in iterations, transformer evaluations and seconds. The uncertainty comes from resampling
    the seeds of both methods with replacement (`samples` times, a fixed generator): the 10th-90th percentile of
    the iterations to reach, and how often it is not reached at all."""
    flow = next((seeds for v, seeds in runs.values() if v.method == "flow-grpo"), None)
    if flow is None:
        return ""
    g = torch.Generator().manual_seed(0)

    def first_reach(curve: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # (K, X), (K,) -> (K,) or -1
        hit = curve >= target[:, None]  # (K, X)
        return torch.where(hit.any(1), hit.float().argmax(1), torch.tensor(-1))

    lines = ["| method | held-out: Flow-GRPO's best | reached at iteration (10-90%, not reached) | evaluations | "
             "seconds | training reward: Flow-GRPO's best | reached at iteration (10-90%, not reached) | "
             "evaluations | seconds |", "|" + "---|" * 9]
    for label, (v, seeds) in runs.items():
        cells = [label]
        cost = _costs(seeds)
        for kind in ("eval", "train"):
            if kind == "eval":
                its, mine, theirs = _evals(seeds)[0], _evals(seeds)[1], _evals(flow)[1]  # (E,), (S, E), (S', E')
            else:
                mine, theirs = _smooth(_curve(seeds, "reward/mean")), _smooth(_curve(flow, "reward/mean"))  # (S, I)
                its = torch.arange(1, mine.shape[1] + 1)
            target = theirs.mean(0).max()
            at = int(first_reach(mine.mean(0)[None], target[None])[0])
            pick = lambda n: torch.randint(n, (samples, n), generator=g)  # noqa: E731
            boot_target = theirs[pick(theirs.shape[0])].mean(1).max(1).values  # (samples,)
            boot = first_reach(mine[pick(mine.shape[0])].mean(1), boot_target)  # (samples,)
            reached = boot[boot >= 0].float()
            spread = (f"{int(its[int(reached.quantile(0.1))])}-{int(its[int(reached.quantile(0.9))])}"
                      if reached.numel() else "-")
            miss = f"{100 * (boot < 0).float().mean():.0f}%"
            if at < 0:
                cells += [f"{target:.3f}", f"not reached ({spread}, {miss})", "-", "-"]
            else:
                it = int(its[at])
                cells += [f"{target:.3f}", f"{it} ({spread}, {miss})", f"{int(cost['evaluations'][it]):,}",
                          f"{float(cost['seconds'][it]):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(runs: dict, path: str, title: str) -> None:
    """Training reward (5-iteration mean) and the evaluations (before, on the way, after), each +- SE over seeds,
    against iterations, transformer evaluations and wall seconds."""
    fig = Figure(figsize=(14, 3.8), dpi=110)
    axes = fig.subplots(1, 3, sharey=True)
    styles = ["-", "--", ":", "-."]
    for ax, (xkey, xlabel) in zip(axes, [("iteration", "iteration"), ("evaluations", "transformer evaluations"),
                                         ("seconds", "seconds (sampling + rewards + training)")]):
        seen = {}  # variants of each method drawn so far: the next one takes the next line style
        for label, (v, seeds) in runs.items():
            color, style = COLORS[v.method], styles[seen.get(v.method, 0) % len(styles)]
            seen[v.method] = seen.get(v.method, 0) + 1
            x = _costs(seeds)[xkey]  # (I+1,)
            y = _smooth(_curve(seeds, "reward/mean"))  # (S, I)
            m, se = y.mean(0), _se(y)
            ax.plot(x[1:], m, style, color=color, lw=1, alpha=0.8, label=f"{label} ({len(seeds)} seeds)")
            ax.fill_between(x[1:], m - se, m + se, color=color, alpha=0.15)
            its, scores = _evals(seeds)  # (E,), (S, E)
            ax.errorbar(x[its], scores.mean(0), yerr=_se(scores), fmt="o" + style, color=color, capsize=3, ms=4,
                        lw=1.5)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("toy score")
    axes[0].legend(fontsize=6)
    fig.suptitle(f"{title}\nthin lines: training reward (5-iteration mean); dots: evaluation score; +- SE over seeds",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def grid_figure(runs: dict, path: str) -> None:
    """The grid: validation change against lr, a line per (method, ratio clip), +- SE over seeds."""
    fig = Figure(figsize=(6.5, 4), dpi=110)
    ax = fig.subplots()
    for (m, clip), style in zip([(m, c) for m in GRID_METHODS for c in sorted({v.clip_range for v, _ in
                                                                                runs.values()})], ["-", "--"] * 8):
        points = sorted((v.lr, change_stats(seeds)) for v, seeds in runs.values() if (v.method, v.clip_range) ==
                        (m, clip))
        if points:
            ax.errorbar([p[0] for p in points], [p[1]["change"] for p in points], [p[1]["change_se"] for p in points],
                        fmt="o" + style, color=COLORS[m], capsize=3, label=f"{m}, clip {clip:g}")
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("validation change after 30 iterations")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("grid: +- SE over seeds (one seed: no bar)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def report(names: list[str], results: str, docs: str) -> str:
    """docs/<experiment>.md (tables) and docs/<experiment>.png (curves) for each experiment; returns the text."""
    os.makedirs(docs, exist_ok=True)
    texts = []
    for name in names:
        exp = EXPERIMENTS[name]
        runs = load_experiment(results, exp)
        if not runs:
            raise SystemExit(f"error: no finished runs of '{name}' under {results}; run `python compare.py run {name}`")
        parts = [f"### {name}: {exp.doc}", "", f"Split: {exp.split}; seeds {', '.join(map(str, exp.seeds))}.", ""]
        if name == "grid":
            parts += [grid_table(results, runs), ""]
        parts += [table(runs), ""]
        if name == "headline":
            parts += [reach_table(runs), ""]
        machines = {f"{r['machine']['cpu']}, {r['machine']['cores']} cores" for _, seeds in runs.values()
                    for r in seeds}
        parts.append(f"Machine: {'; '.join(sorted(machines))}.")
        text = "\n".join(parts)
        with open(os.path.join(docs, f"{name}.md"), "w") as f:
            f.write(text + "\n")
        if name == "grid":
            grid_figure(runs, os.path.join(docs, "grid.png"))
        else:
            figure(runs, os.path.join(docs, f"{name}.png"), f"{name}: {exp.doc}")
        texts.append(text)
    print("\n\n".join(texts))
    return "\n\n".join(texts)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for cmd, text in (("list", "the experiments and what is finished"), ("run", "run experiments (in order)"),
                      ("report", "tables and curves of experiments")):
        s = sub.add_parser(cmd, help=text)
        s.add_argument("experiments", nargs="*" if cmd != "run" else "+",
                       help=f"{' | '.join(EXPERIMENTS)}" + (" (default: all)" if cmd != "run" else ""))
        s.add_argument("--results", default=os.path.join(ROOT, "results"), help="finished runs' small results")
        if cmd == "run":
            s.add_argument("--runs", default="runs/lab", help="the run folders")
            s.add_argument("--jobs", type=int, default=1, help="runs at a time (each on one thread when > 1)")
        if cmd == "report":
            s.add_argument("--docs", default=os.path.join(ROOT, "docs", "lab"), help="where tables and PNGs go")
    args = p.parse_args()
    names = args.experiments or list(EXPERIMENTS)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        p.error(f"unknown experiment '{unknown[0]}'; choose from {', '.join(EXPERIMENTS)}")
    if args.command == "run":
        run(names, args.results, args.runs, args.jobs)
    elif args.command == "report":
        report(names, args.results, args.docs)
    else:
        for name in names:
            exp = EXPERIMENTS[name]
            try:
                variants = exp.variants(args.results)
            except SystemExit as e:
                print(f"{name} ({exp.split}): waits for the grid ({e})")
                continue
            print(f"{name} ({exp.split}, seeds {list(exp.seeds)}): {exp.doc}")
            for label, v in variants.items():
                done = sum(finished(args.results, exp.split, v, [s]) for s in exp.seeds)
                print(f"  {label:<22} {v.name:<48} {done}/{len(exp.seeds)} finished")


if __name__ == "__main__":
    main()
