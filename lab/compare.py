"""The toy world as a laboratory: the paper's experiments (Sec. 5: the headline comparison, the ablations of the
noise level and the SDE window) in miniature, each a named set of variants x seeds of `train.py --task tiny`.

  python -m lab.compare list                    # the experiments, their variants, seeds and what is finished
  python -m lab.compare run grid fair headline  # run experiments in order; finished runs are skipped
  python -m lab.compare run grid --jobs 2       # two runs at a time (one thread each)
  python -m lab.compare report grid             # lab/reports/{grid.md, grid.png} (the table is printed too; report.py)

A variant fixes the experiment's axes (the method and lr, ratio clip, noise level a, window W, iterations); every
other setting is the tiny preset's. The axes' values are written out in full in every run's name, so a run means
the same thing after the preset changes, and two experiments that need the same run share it. Hyperparameters are
chosen on the validation split (toyworld.py; the `grid` experiment, seeds 0 and 1), each method's best by its mean
validation change; every other experiment is reported on the held-out split with fresh seeds (10, 11, 12), so a
choice never sees the images or the training seeds it is reported on.

Each finished run leaves its folder under runs/lab/ and a small result under lab/results/, which is committed: a sweep
picks up where it stopped, and `report` needs only lab/results/ (lab/sweep.py).

Shape legend: S seeds, I iterations, M evaluation images.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass

from lab import figures, report, sweep
from lab.sweep import finished, load_experiment, mean_score

LAB = os.path.dirname(os.path.abspath(__file__))

# ----------------------------------------------------------------------------------------------------------------
# 1. Variants and experiments
# ----------------------------------------------------------------------------------------------------------------

METHODS = {"flow-grpo": ["--algo", "flow-grpo"], "tp-grpo": ["--algo", "tp-grpo", "--tp-rule", "strict"],
           "tp-grpo-base": ["--algo", "tp-grpo", "--tp-rule", "base"], "incremental": ["--algo", "incremental"]}
# The axes and their values in the tiny preset when the laboratory was set up (the shared default: lr and clip
# then chosen for TP-GRPO by hand; the grid has since moved the preset to lr 3e-3, clip 1e-5), pinned here (not
# read from the preset) so that a finished run's name keeps its meaning when the preset changes.
PRESET = {"lr": 1e-3, "clip_range": 1e-4, "noise_level": 0.7, "window": 5, "iterations": 30, "eval_every": 0}
FLAGS = {"lr": "--lr", "clip_range": "--clip-range", "noise_level": "--noise-level", "window": "--window",
         "iterations": "--iterations", "eval_every": "--eval-every"}
# The training reward: the programmatic score, or the learned ToyScore with the programmatic score as gold beside it
# (weight 0: reported, eval/toy_change; lab/toyscore.py)
REWARDS = {"toy": [], "toyscore": ["--rewards", "toyscore:1,toy:0"]}
# The grid of the fair comparison: a window of each ladder, widened one rung at a time while a method's best
# setting sits at its edge (`grid_axes`).
LR_LADDER = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
# The clip ladder first ended at 1e-5 (the authors' SD3.5-M value); both methods' bests landed there, and a best at
# an edge extends the grid, so it was lengthened to 1e-7 before any run below 1e-5 (lab/reports/grid.md).
CLIP_LADDER = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
GRID_START = {"lr": (3e-4, 1e-2), "clip_range": (1e-4, 1e-3)}  # (lowest, highest) before widening
GRID_METHODS = ("flow-grpo", "tp-grpo")
GRID_SEEDS, REPORT_SEEDS = (0, 1), (10, 11, 12)
SIX_SEEDS = (10, 11, 12, 13, 14, 15)  # the confirmatory round's seeds (lab/README.md): 10-12 and three fresh ones
FRESH_SEEDS = (13, 14, 15)
# the reports' metrics: the trained reward's per-image score ("reward"), or the programmatic score ("toy"), the
# gold beside a learned proxy
METRICS = {"toy": "gold: the programmatic score (eval/toy)", "reward": "proxy: the trained reward (eval/reward)"}
GOLD_AND_PROXY = ("toy", "reward")


@dataclass(frozen=True)
class Variant:
    """One setting of the axes: a method plus lr, ratio clip, noise level a, window W, iterations, evaluations, the
    judge of window states (--completion) and the training reward (REWARDS)."""

    method: str
    lr: float = PRESET["lr"]
    clip_range: float = PRESET["clip_range"]
    noise_level: float = PRESET["noise_level"]
    window: int = PRESET["window"]
    iterations: int = PRESET["iterations"]
    eval_every: int = PRESET["eval_every"]
    completion: str = "ode"  # the paper's judge; docs/method.md, 'Cheaper judges'
    reward: str = "toy"  # the programmatic score, or "toyscore" (REWARDS)
    audit: int = 0  # --judge-audit: every this many iterations (0: off, pinned for the experiments before it existed)
    eval_subset: int = 0  # --eval-subset: the evaluations on the way score only the first this many images (0: all)

    @property
    def name(self) -> str:
        """Every axis written out: 'tp-grpo_lr0.003_clip0.0001_a0.7_W5_it30' (+ '_ev20' with evaluations on the
        way, + '_ode2' / '_x0' / '_mc4' with another judge, + '_toyscore' trained on ToyScore, + '_audit10' with the
        judge audit)."""
        return (f"{self.method}_lr{self.lr:g}_clip{self.clip_range:g}_a{self.noise_level:g}_W{self.window}"
                f"_it{self.iterations}" + (f"_ev{self.eval_every}" if self.eval_every else "")
                + (f"_{self.completion.replace(':', '')}" if self.completion != "ode" else "")
                + (f"_{self.reward}" if self.reward != "toy" else "") + (f"_audit{self.audit}" if self.audit else "")
                + (f"_sub{self.eval_subset}" if self.eval_subset else ""))

    def flags(self) -> list[str]:
        """The train.py flags of this variant (the preset gives the rest)."""
        axes = dataclasses.asdict(self)
        judge = [] if self.completion == "ode" else ["--completion", self.completion]
        return [*METHODS[self.method], *[a for k, f in FLAGS.items() for a in (f, f"{axes[k]:g}")], *judge,
                *REWARDS[self.reward], "--judge-audit", str(self.audit),
                *(["--eval-subset", str(self.eval_subset)] if self.eval_subset else [])]


@dataclass(frozen=True)
class Experiment:
    name: str
    doc: str
    split: str  # "validation" (choosing) or "heldout" (reporting)
    seeds: tuple[int, ...]
    variants: object  # (results folder) -> {label: Variant}; may read finished runs (the grid's choice)
    axis: str = ""  # the Variant field an ablation varies: its report adds the change against it (report.axis_table)
    contrasts: tuple = ()  # pre-registered (label A, label B) pairs: seed-paired A - B (report.contrast_table)
    fresh: tuple = ()  # seeds also reported alone (the confirmatory round's new seeds)
    metrics: tuple = ("reward",)  # what the tables report: the trained reward, or the gold and then the proxy
    alone: bool = False  # a timing experiment: its runs go one at a time (--jobs is ignored)


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
                         f"e.g. {missing[0]}); run `python -m lab.compare run grid` first")
    best = max(grid, key=lambda v: mean_score(results, "validation", v, GRID_SEEDS))
    return dataclasses.replace(best, method=method)


def _at_choice(methods, **axes):
    """Variants of `methods` at their chosen settings with some axes changed: (results) -> {label: Variant}."""
    return lambda results: {m: dataclasses.replace(chosen(results, m), **axes) for m in methods}


ALL = tuple(METHODS)
# The pre-registered contrasts (lab/README.md, 'The confirmatory round'): each a seed-paired difference A - B of the
# held-out change after training, tested with a two-sided paired t interval at 95% (report.contrast_table).
FAIR = (("tp-grpo", "flow-grpo"), ("tp-grpo", "incremental"), ("tp-grpo", "tp-grpo-base"), ("incremental", "flow-grpo"))
JUDGES = (("tp-grpo x0", "tp-grpo ode"), ("tp-grpo ode:3", "tp-grpo ode"), ("tp-grpo ode:2", "tp-grpo ode"),
          ("tp-grpo x0", "flow-grpo"))
HEADLINE = (("tp-grpo", "flow-grpo"), ("incremental", "tp-grpo"), ("tp-grpo x0", "flow-grpo"),
            ("tp-grpo x0", "tp-grpo"), ("incremental x0", "tp-grpo x0"))


def _headline(results: str) -> dict[str, Variant]:
    """Flow-GRPO, TP-GRPO and incremental at their chosen settings, and the last two with the cheap judge x0."""
    full = _at_choice(("flow-grpo", "tp-grpo", "incremental"), iterations=100, eval_every=20)(results)
    cheap = _at_choice(("tp-grpo", "incremental"), iterations=100, eval_every=20, completion="x0")(results)
    return {**full, **{f"{m} x0": v for m, v in cheap.items()}}


def _headline_seconds(results: str) -> dict[str, Variant]:
    """The headline's variants, and TP-GRPO with the judges mc:1 and mc:4 (the judge round's), for 10 iterations
    without evaluations on the way: their seconds per iteration."""
    truer = {f"tp-grpo {c}": dataclasses.replace(chosen(results, "tp-grpo"), completion=c) for c in ("mc:1", "mc:4")}
    return {label: dataclasses.replace(v, iterations=10, eval_every=0)
            for label, v in {**_headline(results), **truer}.items()}


# The replication round and the judge round (lab/README.md, 'The replication round and the judge round'), run
# together: disjoint fresh seeds, every run the same way (an evaluation every 10 iterations on the first 256
# held-out images, all 1024 before and after; the judge audit every 10)
ROUND = dict(eval_every=10, eval_subset=256, audit=10)
REPLICATION_SEEDS, JUDGE_ROUND_SEEDS = tuple(range(40, 52)), tuple(range(30, 36))
REPLICATION = (("tp-grpo x0", "flow-grpo"), ("incremental x0", "flow-grpo"), ("incremental x0", "tp-grpo x0"))
EQUIVALENCE = ("incremental x0", "tp-grpo x0", 0.05)  # A, B, margin: two one-sided tests at 5% each (90% interval)
JUDGE_ROUND = (("tp-grpo mc:4", "tp-grpo ode"), ("tp-grpo mc:1", "tp-grpo ode"), ("tp-grpo x0", "tp-grpo ode"),
               ("tp-grpo ode", "flow-grpo"), ("tp-grpo mc:4", "flow-grpo"))
JUDGE_ROUND_POINT = 50  # the pre-registered intermediate evaluation point of the judge round


def _replication(results: str) -> dict[str, Variant]:
    """Flow-GRPO, and TP-GRPO and incremental with the one-step judge x0, at their chosen settings, 150 iterations."""
    return {label: dataclasses.replace(chosen(results, m), completion=c, iterations=150, **ROUND)
            for label, m, c in (("flow-grpo", "flow-grpo", "ode"), ("tp-grpo x0", "tp-grpo", "x0"),
                                ("incremental x0", "incremental", "x0"))}


def _judge_round(results: str) -> dict[str, Variant]:
    """TP-GRPO (strict) with the judges ode, x0, mc:1 and mc:4, and Flow-GRPO, at the fair comparison's settings, 100
    iterations."""
    judged = {f"tp-grpo {c}": dataclasses.replace(chosen(results, "tp-grpo"), completion=c, iterations=100, **ROUND)
              for c in ("ode", "x0", "mc:1", "mc:4")}
    return {**judged, "flow-grpo": dataclasses.replace(chosen(results, "flow-grpo"), iterations=100, **ROUND)}


def toyscore_star(results: str, method: str) -> list[Variant]:
    """The small check on validation under ToyScore (lab/README.md, 'ToyScore'): the method's chosen setting on the
    programmatic reward (`chosen`: lr 3e-3, clip 1e-5) and its four ladder neighbours, one axis at a time."""
    centre = dataclasses.replace(chosen(results, method), reward="toyscore")
    star = [centre]
    for axis, ladder in (("lr", LR_LADDER), ("clip_range", CLIP_LADDER)):
        i = ladder.index(getattr(centre, axis))
        star += [dataclasses.replace(centre, **{axis: ladder[j]}) for j in (i - 1, i + 1) if 0 <= j < len(ladder)]
    return star


def chosen_toyscore(results: str, method: str) -> Variant:
    """The method's setting under ToyScore: the best of `toyscore_star` by the mean validation eval/reward (the
    proxy: what a practitioner without the gold would choose by) over GRID_SEEDS; Flow-GRPO its own, the others
    TP-GRPO's, as `chosen`. The centre winning says the current choice still fits."""
    tuned = "flow-grpo" if method == "flow-grpo" else "tp-grpo"
    star = toyscore_star(results, tuned)
    missing = [v.name for v in star if not finished(results, "validation", v, GRID_SEEDS)]
    if missing:
        raise SystemExit(f"error: the ToyScore check is not finished ({len(missing)} of {len(star)} {tuned} "
                         f"settings missing, e.g. {missing[0]}); run `python -m lab.compare run toyscore-check` first")
    return dataclasses.replace(max(star, key=lambda v: mean_score(results, "validation", v, GRID_SEEDS)),
                               method=method)


def toyscore_choice(results: str) -> str:
    """One line for the check's report: each tuned method's choice under ToyScore, and whether it is the centre."""
    lines = []
    for m in GRID_METHODS:
        pick, centre = chosen_toyscore(results, m), toyscore_star(results, m)[0]
        lines.append(f"{m}: lr {pick.lr:g}, clip {pick.clip_range:g}"
                     + (" (the centre: the choice on the programmatic reward still fits)" if pick == centre else
                        f" (not the centre, lr {centre.lr:g} and clip {centre.clip_range:g})"))
    return "The choice by the mean validation proxy over seeds " + ", ".join(map(str, GRID_SEEDS)) + ": " \
        + "; ".join(lines) + "."


TOYSCORE = (("tp-grpo", "flow-grpo"), ("tp-grpo", "incremental"), ("tp-grpo", "tp-grpo-base"),
            ("incremental", "flow-grpo"), ("tp-grpo x0", "tp-grpo"))
TOYSCORE_LONG = (("tp-grpo", "flow-grpo"), ("incremental", "tp-grpo"), ("incremental", "flow-grpo"))
# The clip check (lab/README.md, 'The clip check'): each step-wise method at Flow-GRPO's clip 1e-5 against its own
# toyscore-long run at 1e-4 (same seeds: a pair), and TP-GRPO at 1e-5 against Flow-GRPO
TOYSCORE_CLIP = (("tp-grpo clip 1e-5", "tp-grpo clip 1e-4"), ("incremental clip 1e-5", "incremental clip 1e-4"),
                 ("tp-grpo clip 1e-5", "flow-grpo"))


def _toyscore_clip(results: str) -> dict[str, Variant]:
    """toyscore-long's runs (TP-GRPO and incremental at clip 1e-4, Flow-GRPO at 1e-5) and the step-wise methods
    again at clip 1e-5, everything else the same."""
    long = EXPERIMENTS["toyscore-long"].variants(results)
    twins = {f"{m} clip {c}": dataclasses.replace(long[m], clip_range=float(c))
             for m in ("tp-grpo", "incremental") for c in ("1e-4", "1e-5")}
    return {**twins, "flow-grpo": long["flow-grpo"]}

EXPERIMENTS = {e.name: e for e in [
    Experiment("methods", "the four methods at the shared default (lr 1e-3, clip 1e-4), seeds 0-2: the old quick "
               "comparison", "heldout", (0, 1, 2), lambda results: {m: Variant(m) for m in ALL}),
    Experiment("grid", "Flow-GRPO and TP-GRPO over lr x ratio clip on the validation split, seeds 0 and 1: each "
               "method's setting is chosen here", "validation", GRID_SEEDS, grid_variants),
    Experiment("fair", "every method at its chosen setting, held-out, fresh seeds", "heldout", SIX_SEEDS,
               _at_choice(ALL), contrasts=FAIR, fresh=FRESH_SEEDS),
    Experiment("default", "every method at the shared default (lr 1e-3, clip 1e-4), held-out, fresh seeds: what "
               "tuning one method only does", "heldout", REPORT_SEEDS,
               lambda results: {f"{m} @default": Variant(m) for m in ALL}),
    Experiment("headline", "100 iterations at the chosen settings with a held-out evaluation every 20: the paper's "
               "sample-efficiency claim, and the cheap judge x0 at Flow-GRPO's transformer cost", "heldout",
               SIX_SEEDS, _headline, contrasts=HEADLINE, fresh=FRESH_SEEDS),
    Experiment("headline-seconds", "the headline's variants and TP-GRPO with mc:1 and mc:4 for 10 iterations, one "
               "run at a time with nothing else on the machine: seconds per iteration of sampling + rewards + "
               "training, the calibrated seconds axis", "validation", (0, 1, 2), _headline_seconds, alone=True),
    Experiment("replication", "the recommendation replicated: Flow-GRPO, TP-GRPO x0 and incremental x0 on twelve fresh "
               "seeds, 150 iterations, a held-out evaluation every 10 (first 256 images), the judge audit on",
               "heldout", REPLICATION_SEEDS, _replication, contrasts=REPLICATION),
    Experiment("judge-round", "is a truer judge worth its cost: TP-GRPO with ode, x0, mc:1, mc:4 and Flow-GRPO, six "
               "fresh seeds, 100 iterations, a held-out evaluation every 10 (first 256 images), the judge audit on",
               "heldout", JUDGE_ROUND_SEEDS, _judge_round, contrasts=JUDGE_ROUND),
    Experiment("noise", "the noise level a in {0.4, 0.7, 1.0} at the chosen settings (the paper's Table of a)",
               "heldout", REPORT_SEEDS, lambda results: {f"{m} a={a:g}": v for a in (0.4, 0.7, 1.0) for m, v in
                                                         _at_choice(ALL, noise_level=a)(results).items()},
               "noise_level"),
    Experiment("window", "the SDE window: all 5 trained steps of T = 6 against the first 3", "heldout", REPORT_SEEDS,
               lambda results: {f"{m} W={w}": v for w in (5, 3) for m, v in
                                _at_choice(("flow-grpo", "tp-grpo", "incremental"), window=w)(results).items()},
               "window"),
    Experiment("judges", "TP-GRPO with cheaper judges of the window states (docs/method.md, 'Cheaper judges') "
               "against the full ODE and Flow-GRPO", "heldout", SIX_SEEDS,
               lambda results: {**{f"tp-grpo {c}": v for c in ("ode", "ode:3", "ode:2", "x0") for v in
                                   _at_choice(("tp-grpo",), completion=c)(results).values()},
                                "flow-grpo": chosen(results, "flow-grpo")}, contrasts=JUDGES, fresh=FRESH_SEEDS),
    Experiment("toyscore-check", "trained on the learned ToyScore (lab/toyscore.py): Flow-GRPO and TP-GRPO at "
               "their choice on the programmatic reward and its four ladder neighbours (lr and clip one rung each "
               "way), validation, seeds 0 and 1: does the choice still fit?", "validation", GRID_SEEDS,
               lambda results: {v.name: v for m in GRID_METHODS for v in toyscore_star(results, m)},
               metrics=GOLD_AND_PROXY),  # the choice is by the proxy; the gold beside it says what that choice costs
    Experiment("toyscore", "every method trained on ToyScore at its setting chosen by toyscore-check, and TP-GRPO "
               "with the cheap judge x0; held-out, the programmatic score as gold beside the proxy", "heldout",
               SIX_SEEDS, lambda results: {**{m: chosen_toyscore(results, m) for m in ALL},
                                           "tp-grpo x0": dataclasses.replace(chosen_toyscore(results, "tp-grpo"),
                                                                             completion="x0")},
               contrasts=TOYSCORE, metrics=GOLD_AND_PROXY),
    Experiment("toyscore-long", "100 iterations on ToyScore with a held-out evaluation every 20: proxy and gold "
               "along the way (does a method over-optimise the proxy?)", "heldout", SIX_SEEDS,
               lambda results: {m: dataclasses.replace(chosen_toyscore(results, m), iterations=100, eval_every=20)
                                for m in ("flow-grpo", "tp-grpo", "incremental")}, contrasts=TOYSCORE_LONG,
               metrics=GOLD_AND_PROXY),
    Experiment("toyscore-clip", "the clip check: TP-GRPO and incremental on ToyScore for 100 iterations at "
               "Flow-GRPO's clip 1e-5, each paired with its clip-1e-4 run of toyscore-long (is the late collapse the "
               "method or the clip?)", "heldout", SIX_SEEDS, _toyscore_clip, contrasts=TOYSCORE_CLIP,
               metrics=GOLD_AND_PROXY),
]}


# ----------------------------------------------------------------------------------------------------------------
# 2. Runs (lab/sweep.py: launched, harvested, resumable)
# ----------------------------------------------------------------------------------------------------------------

def run(names: list[str], results: str, runs: str, jobs: int = 1) -> None:
    """Run every unfinished (variant, seed) of the named experiments in order (sweep.run_experiment)."""
    for name in names:
        sweep.run_experiment(name, EXPERIMENTS[name], results, runs, jobs)


# ----------------------------------------------------------------------------------------------------------------
# 3. Reports: a table and curves for any experiment, the grid's matrix, the headline's cost to reach a score
# ----------------------------------------------------------------------------------------------------------------

def seconds_alone(results: str) -> dict[tuple[str, str], dict]:
    """{(method, judge): {"median": seconds per iteration measured alone over every run of `headline-seconds`,
    "per_run": each run's}} ({} before it has run): what an iteration of that method and judge costs."""
    runs = load_experiment(results, EXPERIMENTS["headline-seconds"])
    return {(v.method, v.completion): {"median": report.seconds_per_iteration(seeds),
                                       "per_run": [report.seconds_per_iteration([r]) for r in seeds]}
            for v, seeds in runs.values()}


def calibrated(results: str, runs: dict) -> dict[str, float] | None:
    """{label: seconds per iteration alone} for the experiment's runs (`seconds_alone`, by method and judge)."""
    alone = seconds_alone(results)
    return {label: alone[v.method, v.completion]["median"] for label, (v, _) in runs.items()
            if (v.method, v.completion) in alone}


def write_reports(names: list[str], results: str, reports: str) -> str:
    """<reports>/<experiment>.md (tables) and <experiment>.png (curves) for each experiment; returns the text."""
    os.makedirs(reports, exist_ok=True)
    texts = []
    for name in names:
        exp = EXPERIMENTS[name]
        runs = load_experiment(results, exp)
        if not runs:
            raise SystemExit(f"error: no finished runs of '{name}' under {results}; "
                             f"run `python -m lab.compare run {name}`")
        parts = [f"### {name}: {exp.doc}", "", f"Split: {exp.split}; seeds {', '.join(map(str, exp.seeds))}.", ""]
        if name == "grid":
            parts += [report.grid_table(runs, GRID_METHODS, len(GRID_SEEDS)), ""]
        if name == "toyscore-check" and len(runs) == len(exp.variants(results)):
            parts += [toyscore_choice(results), ""]
        for metric in exp.metrics:
            if len(exp.metrics) > 1:
                parts += [f"#### {METRICS[metric]}", ""]
            parts += [report.table(runs, metric), ""]
            if exp.contrasts:
                parts += ["Pre-registered contrasts (lab/README.md):", "",
                          report.contrast_table(runs, exp.contrasts, exp.fresh, metric), ""]
            if any(v.eval_every for v, _ in runs.values()):
                parts += [report.evals_table(runs, metric), "",
                          report.evals_contrast_table(runs, exp.contrasts, metric), ""]
        alone = calibrated(results, runs) if name in ("headline", "replication", "judge-round") else None
        if alone is not None:
            parts += [report.reach_table(runs, "eval", alone=alone), "", report.reach_table(runs, "train", alone=alone),
                      ""]
        if name == "headline-seconds":
            parts += [report.seconds_table(runs), ""]
        if name == "toyscore-clip":
            parts += ["#### The clip check (pre-registered: the late loss on the gold, pooled)", "",
                      report.clip_check_table(runs, TOYSCORE_CLIP[:2]), ""]
        if name == "replication":
            parts += [report.equivalence_line(runs, *EQUIVALENCE), ""]
        if name in ("judge-round", "replication"):
            parts += ["#### The judge audit over training", "", report.audit_table(runs), ""]
        if len(exp.metrics) > 1 and any(v.eval_every for v, _ in runs.values()):
            parts += ["#### Over-optimisation: the proxy and the gold between evaluation points", "",
                      report.drift_table(runs), ""]
        if exp.axis:
            parts += [report.axis_table(runs, exp.axis), ""]
        machines = {f"{r['machine']['cpu']}, {r['machine']['cores']} cores" for _, seeds in runs.values()
                    for r in seeds}
        parts.append(f"Machine: {'; '.join(sorted(machines))}.")
        text = "\n".join(parts)
        with open(os.path.join(reports, f"{name}.md"), "w") as f:
            f.write(text + "\n")
        if name == "grid":
            figures.grid_figure(runs, GRID_METHODS, os.path.join(reports, "grid.png"))
        elif exp.axis:
            figures.axis_figure(runs, exp.axis, os.path.join(reports, f"{name}.png"), f"{name}: {exp.doc}")
        elif len(exp.metrics) > 1 and any(v.eval_every for v, _ in runs.values()):
            figures.proxy_gold_figure(runs, os.path.join(reports, f"{name}.png"), f"{name}: {exp.doc}")
        else:
            figures.figure(runs, os.path.join(reports, f"{name}.png"), f"{name}: {exp.doc}", alone=alone)
        if name in ("judge-round", "replication"):
            figures.audit_figure(runs, os.path.join(reports, f"{name}-audit.png"), f"{name}: the judge audit")
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
        s.add_argument("--results", default=os.path.join(LAB, "results"), help="finished runs' small results")
        if cmd == "run":
            s.add_argument("--runs", default="runs/lab", help="the run folders")
            s.add_argument("--jobs", type=int, default=1, help="runs at a time (each on one thread when > 1)")
        if cmd == "report":
            s.add_argument("--reports", default=os.path.join(LAB, "reports"), help="where tables and PNGs go")
    args = p.parse_args()
    names = args.experiments or list(EXPERIMENTS)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        p.error(f"unknown experiment '{unknown[0]}'; choose from {', '.join(EXPERIMENTS)}")
    if args.command == "run":
        run(names, args.results, args.runs, args.jobs)
    elif args.command == "report":
        write_reports(names, args.results, args.reports)
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
