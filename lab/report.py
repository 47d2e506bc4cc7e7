"""The laboratory's numbers and pictures (lab/compare.py's reports): over finished runs of one experiment, the score
change with its standard error over seeds and its paired standard error over the evaluation images, the grid's
matrix, the headline's evaluations along the way and what each method spends to reach Flow-GRPO's best score (with
a bootstrap over seeds), the ablations' change against a or W, and curves against iterations, transformer
evaluations and seconds. Pure functions of finished runs' results (compare.load_result:
{"rows": metrics rows, "evals": {tag: summary with per-image scores}}); `runs` is {label: (variant, [result per
seed])}, a variant anything with compare.Variant's fields.

Run: through `python -m lab.compare report ...`; tested by `python -m pytest tests/test_compare.py`.

Shape legend: S seeds, I iterations, E evaluation points, M evaluation images.
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure

COLORS = {"flow-grpo": "tab:gray", "tp-grpo": "tab:red", "tp-grpo-base": "tab:orange", "incremental": "tab:blue"}


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


def grid_table(runs: dict, methods: tuple, seeds: int) -> str:
    """Per method, validation change +- SE over seeds at every (lr, clip); the best setting with all `seeds`
    finished in bold (compare.chosen makes the choice once the whole grid is)."""
    lines = []
    for m in methods:
        mine = {(v.lr, v.clip_range): seeds for v, seeds in runs.values() if v.method == m}
        if not mine:
            continue
        lrs, clips = sorted({k[0] for k in mine}), sorted({k[1] for k in mine})
        complete = [k for k in mine if len(mine[k]) == seeds]  # the choice needs every grid seed
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
                    "" if len(mine[(lr, c)]) == seeds else f" ({len(mine[(lr, c)])} seed)")
                cells.append(f"**{cell}**" if (lr, c) == best else cell)
            lines.append(f"| {lr:g} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def evals_table(runs: dict) -> str:
    """The evaluations along the way: each variant's held-out score +- SE over seeds at every evaluation point."""
    its = _evals(next(iter(runs.values()))[1])[0]  # (E,)
    lines = ["| score +- SE over seeds | " + " | ".join("before" if i == 0 else f"iteration {i}" for i in its.tolist())
             + " |", "|---|" + "---|" * len(its)]
    for label, (_, seeds) in runs.items():
        scores = _evals(seeds)[1]  # (S, E)
        lines.append(f"| {label} | " + " | ".join(f"{m:.3f} +- {e:.3f}" for m, e in zip(scores.mean(0).tolist(),
                                                                                      _se(scores).tolist())) + " |")
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


AXES = {"noise_level": ("a", "noise level a"), "window": ("W", "SDE window W")}  # the ablations' axes: symbol, name


def axis_table(runs: dict, axis: str) -> str:
    """An ablation: each method's change +- SE over seeds (rows) at each value of one axis (columns: the noise
    level a or the window W); then each other method's difference from TP-GRPO (strict) at each value, +- the SE
    of a difference of independent means (two methods' runs share seeds, not trajectories)."""
    at = {(v.method, getattr(v, axis)): {**change_stats(seeds), "seeds": len(seeds)} for v, seeds in runs.values()}
    methods, values = list(dict.fromkeys(m for m, _ in at)), sorted({x for _, x in at})
    full = max(c["seeds"] for c in at.values())
    fmt = lambda mean, se, n: f"{mean:+.3f} +- {se:.3f}" + (f" ({n} of {full} seeds)" if n < full else "")  # noqa: E731
    lines = ["| change +- SE over seeds | " + " | ".join(f"{AXES[axis][0]} = {x:g}" for x in values) + " |",
             "|---|" + "---|" * len(values)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(fmt(at[m, x]["change"], at[m, x]["change_se"], at[m, x]["seeds"])
                                              if (m, x) in at else "-" for x in values) + " |")
    for m in [m for m in methods if m != "tp-grpo" and "tp-grpo" in methods]:
        # difference of two methods' mean changes; its SE = sqrt(SE_1^2 + SE_2^2)
        cells = [fmt(at["tp-grpo", x]["change"] - at[m, x]["change"],
                     math.hypot(at["tp-grpo", x]["change_se"], at[m, x]["change_se"]),
                     min(at["tp-grpo", x]["seeds"], at[m, x]["seeds"]))
                 if ("tp-grpo", x) in at and (m, x) in at else "-" for x in values]
        lines.append(f"| tp-grpo minus {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _change_figure(series: list, xlabel: str, ylabel: str, title: str, path: str, log: bool = False) -> None:
    """Change +- SE over seeds against one axis: `series` is [(label, method, line style, [(x, change_stats)])]."""
    fig = Figure(figsize=(6.5, 4), dpi=110)
    ax = fig.subplots()
    for label, m, style, points in series:
        ax.errorbar([p[0] for p in points], [p[1]["change"] for p in points], [p[1]["change_se"] for p in points],
                    fmt="o" + style, color=COLORS[m], capsize=3, label=label)
    ax.axhline(0, color="black", lw=0.5)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def grid_figure(runs: dict, methods: tuple, path: str) -> None:
    """The grid: validation change against lr, a line per (method, ratio clip), +- SE over seeds."""
    series = []
    for (m, clip), style in zip([(m, c) for m in methods for c in sorted({v.clip_range for v, _ in
                                                                                runs.values()})], ["-", "--"] * 8):
        points = sorted((v.lr, change_stats(seeds)) for v, seeds in runs.values() if (v.method, v.clip_range) ==
                        (m, clip))
        if points:
            series.append((f"{m}, clip {clip:g}", m, style, points))
    _change_figure(series, "learning rate", "validation change after 30 iterations",
                   "grid: +- SE over seeds (one seed: no bar)", path, log=True)


def axis_figure(runs: dict, axis: str, path: str, title: str) -> None:
    """An ablation: held-out change against the axis, a line per method, +- SE over seeds; the methods' points
    are set slightly apart along the axis so that their error bars do not hide each other."""
    methods = list(dict.fromkeys(v.method for v, _ in runs.values()))
    step = 0.015 * (max(getattr(v, axis) for v, _ in runs.values()) - min(getattr(v, axis) for v, _ in runs.values()))
    series = [(m, m, "-", sorted((getattr(v, axis) + (i - (len(methods) - 1) / 2) * step, change_stats(seeds))
                                 for v, seeds in runs.values() if v.method == m)) for i, m in enumerate(methods)]
    _change_figure(series, AXES[axis][1], "held-out change",
                   f"{title}\n+- SE over seeds", path)
