"""The laboratory's numbers and pictures (lab/compare.py's reports): over finished runs of one experiment, the score
change with its standard error over seeds and its paired standard error over the evaluation images, the
differences between methods (seed-paired, with a t interval: lab/stats.py), the grid's matrix, the evaluations along
the way and what each method spends to reach Flow-GRPO's best score (with a bootstrap that draws the same seeds for
every method), the ablations' change against a or W, and curves against iterations, transformer evaluations and
seconds. Pure functions of finished runs' results (lab/sweep.py's load_result: {"argv": train.py's flags, "rows":
metrics rows, "evals": {tag: summary with per-image scores}}); `runs` is {label: (variant, [result per seed])}, a
variant anything with compare.Variant's fields.

Seeds are blocks (lab/stats.py): a difference between two methods is the mean of the per-seed differences.

Run: through `python -m lab.compare report ...`; tested by `python -m pytest tests/test_compare.py`.

Shape legend: S seeds, I iterations, E evaluation points, M evaluation images.
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure

from lab.stats import crossing, direction, format_difference, nearest_rank, paired_difference, ratio_interval

COLORS = {"flow-grpo": "tab:gray", "tp-grpo": "tab:red", "tp-grpo-base": "tab:orange", "incremental": "tab:blue"}


def _se(x: torch.Tensor) -> torch.Tensor:
    """Standard error over seeds (dim 0); 0 for a single seed."""
    return x.std(0) / math.sqrt(x.shape[0]) if x.shape[0] > 1 else torch.zeros_like(x[0])


def seed_of(result: dict) -> int:
    """The training seed of a finished run (its --seed flag): what pairs two methods' runs."""
    return int(result["argv"][result["argv"].index("--seed") + 1])


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
    """Cumulative cost after iterations 0..I (0 = before training): {"iteration": (I+1,), "evaluations": (I+1,)
    (the same for every seed), "seconds": (S, I+1) per seed}. Seconds are sampling + rewards + training
    (evaluations left out)."""
    seconds = sum(_curve(seeds, f"time/{k}_s") for k in ("sample", "reward", "train"))  # (S, I)
    return {"iteration": torch.cat([torch.zeros(1), _curve(seeds, "iteration")[0]]),  # (I+1,)
            "evaluations": torch.cat([torch.zeros(1), torch.cumsum(_curve(seeds, "cost/transformer_evals")[0], 0)]),
            "seconds": torch.nn.functional.pad(torch.cumsum(seconds, 1), (1, 0))}  # (S, I+1)


def seconds_per_iteration(seeds: list[dict], warm_up: int = 1) -> float:
    """Sampling + rewards + training seconds of one iteration: the median over the runs' iterations after the
    first `warm_up` (whose first calls pay one-time costs)."""
    per = sum(_curve(seeds, f"time/{k}_s") for k in ("sample", "reward", "train"))  # (S, I)
    return per[:, warm_up:].median().item()


def _evals(seeds: list[dict], metric: str = "reward") -> tuple[torch.Tensor, torch.Tensor]:
    """Every evaluation point of the runs (before, on the way, after): iterations (E,) and scores (S, E)."""
    def at(tag, r):
        return 0 if tag == "before" else r["evals"][tag]["iteration"]
    tags = sorted(seeds[0]["evals"], key=lambda t: at(t, seeds[0]))
    its = torch.tensor([at(t, seeds[0]) for t in tags])  # (E,)
    return its, torch.tensor([[r["evals"][t][f"eval/{metric}"] for t in tags] for r in seeds])  # (S, E)


def change_stats(seeds: list[dict], metric: str = "reward", tag: str = "after") -> dict:
    """The score change `tag` - before: its mean and SE over seeds, its paired SE over images (the seed-averaged
    change of every image: what another draw of evaluation images could move it), and the change of each seed
    ({seed: change}, what a difference between methods pairs)."""
    before = torch.tensor([r["evals"]["before"]["per_image"][metric] for r in seeds])  # (S, M)
    after = torch.tensor([r["evals"][tag]["per_image"][metric] for r in seeds])  # (S, M)
    change = (after - before).mean(1)  # (S,)
    d = (after - before).mean(0)  # (M,)
    return {"before": before.mean().item(), "after": after.mean().item(), "after_se": _se(after.mean(1)[:, None])[0],
            "change": change.mean().item(), "change_se": float(_se(change[:, None])[0]),
            "image_se": (d.std() / math.sqrt(d.numel())).item(),
            "per_seed": {seed_of(r): c for r, c in zip(seeds, change.tolist())}}


def contrast_table(runs: dict, contrasts: tuple, fresh: tuple = (), metric: str = "reward") -> str:
    """The pre-registered contrasts (compare.Experiment.contrasts: (label A, label B) pairs): A - B of the change
    after training, seed-paired, with its t interval and whether it is resolved (the interval excludes 0); then
    the same on the `fresh` seeds alone (descriptive: the seeds the first round had not seen)."""
    head = "| A - B (change after training) | seeds | mean +- paired SE (95% t interval, df) | resolved |"
    lines = [head + (f" seeds {fresh[0]}-{fresh[-1]} alone |" if fresh else ""),
             "|" + "---|" * (4 + bool(fresh))]
    for a, b in contrasts:
        if a not in runs or b not in runs:
            continue
        sa, sb = (change_stats(runs[x][1], metric)["per_seed"] for x in (a, b))
        c = paired_difference(sa, sb)
        row = f"| {a} - {b} | {c['n']} | {format_difference(c)} | {'yes' if c['resolved'] else 'no'} |"
        if fresh:
            row += f" {format_difference(paired_difference(*({k: x[k] for k in fresh if k in x} for x in (sa, sb))))} |"
        lines.append(row)
    return "\n".join(lines)


def evals_contrast_table(runs: dict, contrasts: tuple, metric: str = "reward") -> str:
    """The contrasts at every evaluation point (score there - before, seed-paired): when a gap opens or closes."""
    first = next(iter(runs.values()))[1]
    tags = sorted(first[0]["evals"], key=lambda t: 0 if t == "before" else first[0]["evals"][t]["iteration"])[1:]
    its = [first[0]["evals"][t]["iteration"] for t in tags]
    lines = ["| A - B, seed-paired (95% t interval, df) | " + " | ".join(f"iteration {i}" for i in its) + " |",
             "|---|" + "---|" * len(its)]
    for a, b in contrasts:
        if a in runs and b in runs:
            cells = [format_difference(paired_difference(*(change_stats(runs[x][1], metric, tag)["per_seed"]
                                                          for x in (a, b)))) for tag in tags]
            lines.append(f"| {a} - {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(runs: dict, metric: str = "reward") -> str:
    """One row per variant: its axes, seeds, `metric`'s score before / after / change with both SEs, strict
    accuracy, turning-point rates, transformer evaluations per trajectory and seconds per run."""
    lines = ["| variant | lr | clip | a | W | iterations | seeds | before | after | change +- SE over seeds | paired "
             "SE over images | change / SE | strict after | turning points (strict / base / kept) | evaluations per "
             "trajectory | seconds per run |", "|" + "---|" * 16]
    for label, (v, seeds) in runs.items():
        c = change_stats(seeds, metric)
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


def evals_table(runs: dict, metric: str = "reward") -> str:
    """The evaluations along the way: each variant's held-out `metric` +- SE over seeds at every evaluation point."""
    its = _evals(next(iter(runs.values()))[1], metric)[0]  # (E,)
    lines = ["| score +- SE over seeds | " + " | ".join("before" if i == 0 else f"iteration {i}" for i in its.tolist())
             + " |", "|---|" + "---|" * len(its)]
    for label, (_, seeds) in runs.items():
        scores = _evals(seeds, metric)[1]  # (S, E)
        lines.append(f"| {label} | " + " | ".join(f"{m:.3f} +- {e:.3f}" for m, e in zip(scores.mean(0).tolist(),
                                                                                      _se(scores).tolist())) + " |")
    return "\n".join(lines)


def _cost_at(cumulative: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A cumulative cost (..., I+1) indexed by iteration (_costs') at fractional iterations x (...), linear between
    the whole iterations around x (the cost per iteration is nearly constant); NaN in x (never reached) stays NaN."""
    lo = x.nan_to_num(0).floor().long().clamp(0, cumulative.shape[-1] - 1)  # (...)
    hi = (lo + 1).clamp(max=cumulative.shape[-1] - 1)  # (...)
    c0, c1 = (cumulative.gather(-1, i[..., None])[..., 0] for i in (lo, hi))  # (...) each
    return c0 + (x - lo) * (c1 - c0)


def reach_table(runs: dict, kind: str = "eval", samples: int = 1000, alone: dict | None = None) -> str:
    """What each method spends to reach Flow-GRPO's best score, alone and against Flow-GRPO's spend. `kind` "eval":
    the held-out score at the evaluation points (mean over seeds, from the one before training); "train": the
    5-iteration mean of the training reward at every iteration. Where: the crossing interpolated between the points
    around it (`crossing`), beside the grid value, the first point at or above (20 iterations apart, a miss by 0.001
    moves it by 20). Costs at the crossing (`_cost_at`): transformer evaluations and seconds (sampling + rewards +
    training) as the runs measured them, and, given `alone` ({label: seconds per iteration measured one run at a
    time}, taken as exact), the crossing times it. Uncertainty: a bootstrap over seeds in which one draw of seeds
    (with replacement, `samples` times, a fixed generator) serves every method and Flow-GRPO's target alike, as
    seeds are shared: the crossing's 10th-90th percentile (nearest rank) over the draws that reach and the share that
    never do; each cost's ratio to Flow-GRPO's (all seeds) with its 95% interval over the same draws
    (`ratio_interval`). Only the seeds every method has finished take part."""
    flow = next((label for label, (v, _) in runs.items() if v.method == "flow-grpo"), None)
    if flow is None:
        return ""
    common = sorted(set.intersection(*({seed_of(r) for r in seeds} for _, seeds in runs.values())))
    aligned = {label: (v, sorted((r for r in seeds if seed_of(r) in common), key=seed_of))
               for label, (v, seeds) in runs.items()}

    def curve(seeds):  # (S, X) scores in float64 and the iteration (X,) of each point
        if kind == "eval":
            its, scores = _evals(seeds)
            return scores.double(), its
        smooth = _smooth(_curve(seeds, "reward/mean"))  # (S, I)
        return smooth.double(), torch.arange(1, smooth.shape[1] + 1)

    n = len(common)
    g = torch.Generator().manual_seed(0)
    draws = {"all": torch.arange(n)[None], "boot": torch.randint(n, (samples, n), generator=g)}  # (K, n) each
    target = {k: curve(aligned[flow][1])[0][d].mean(1).max(1).values for k, d in draws.items()}  # (K,) each
    spent = {}  # {label: {"all" / "boot": {axis: (K,) in each draw, NaN where it never reaches}}}
    for label, (v, seeds) in aligned.items():
        (scores, its), cost = curve(seeds), _costs(seeds)
        spent[label] = {}
        for k, d in draws.items():
            x, e = crossing(its, scores[d].mean(1), target[k])  # (K,) each
            spent[label][k] = {"iteration": x, "grid": torch.where(e >= 0, its[e.clamp(min=0)].double(), math.nan),
                               "evaluations": _cost_at(cost["evaluations"].double().expand(len(x), -1), x),  # (K,)
                               # each drawn seed's seconds at the crossing, then their mean: (K, n) -> (K,)
                               "seconds": _cost_at(cost["seconds"].double()[d], x[:, None].expand(-1, n)).mean(1),
                               "alone": x * (alone or {}).get(label, math.nan)}  # (K,)
    axes = [("evaluations", "transformer evaluations", "{:,.0f}"), ("seconds", "seconds", "{:.0f}"),
            ("alone", "seconds alone, calibrated", "{:.0f}")][:3 if alone else 2]
    lines = [f"{'held-out score' if kind == 'eval' else 'training reward (5-iteration mean)'}: Flow-GRPO's best "
             f"{float(target['all'][0]):.3f} (seeds {', '.join(map(str, common))}); the crossing interpolated between "
             f"evaluation points, costs there; / Flow-GRPO: the ratio to Flow-GRPO's cost (95% interval over {samples} "
             "joint draws of seeds, a draw never reaching = inf)", "",
             "| method | reaches it at iteration (grid; 10-90%; never) | "
             + " | ".join(f"{title} | / Flow-GRPO" for _, title, _ in axes) + " |",
             "|---|---|" + "---|---|" * len(axes)]
    for label, mine in spent.items():
        point, boot = mine["all"], mine["boot"]
        reached = boot["iteration"][boot["iteration"].isfinite()]  # (K',)
        spread = f"{nearest_rank(reached, 0.1):.0f}-{nearest_rank(reached, 0.9):.0f}" if reached.numel() else "-"
        at = (f"{point['iteration'][0]:.0f} (grid {point['grid'][0]:.0f}; " if point["grid"][0].isfinite()
              else "not reached (")
        cells = [label, f"{at}10-90% {spread}; never {100 * (1 - reached.numel() / samples):.0f}%)"]
        for axis, _, fmt in axes:
            if axis == "alone" and label not in alone:
                cells += ["not measured", "-"]
                continue
            cells.append(fmt.format(point[axis][0].item()) if point[axis][0].isfinite() else "not reached")
            if label == flow or (axis == "alone" and flow not in alone):
                cells.append("-")
                continue
            ratio = (point[axis][0] / spent[flow]["all"][axis][0]).nan_to_num(math.inf).item()  # (): never = inf
            iv = ratio_interval(boot[axis], spent[flow]["boot"][axis])
            cells.append(f"{ratio:.2f} ({iv['lo']:.2f}-{iv['hi']:.2f}" + (f", resolved {iv['resolved']})"
                                                                          if iv["resolved"] else ")"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def drift_table(runs: dict, proxy: str = "reward", gold: str = "toy") -> str:
    """Over-optimisation: for each variant and each stretch between consecutive evaluation points, how the proxy
    (the trained reward) and the gold moved, each the mean over seeds of the per-seed change with its paired t
    interval (the same run at both points), and the reading: **over-optimises** where the proxy's interval lies
    above 0 and the gold's below 0 (the pre-registered test), otherwise each one's direction (up, down, or flat
    where its interval holds 0): "proxy up, gold flat" is not over-optimisation, "both down" is a collapse."""
    lines = ["| variant | iterations | proxy change (95% t interval, df) | gold change (95% t interval, df) "
             "| reading |", "|---|---|---|---|---|"]
    for label, (_, seeds) in runs.items():
        its, p = _evals(seeds, proxy)  # (E,), (S, E)
        g, ids = _evals(seeds, gold)[1], [seed_of(r) for r in seeds]  # (S, E), S seeds
        for e in range(1, len(its)):
            cp, cg = (paired_difference(dict(zip(ids, x[:, e].tolist())), dict(zip(ids, x[:, e - 1].tolist())))
                      for x in (p, g))
            dp, dg = direction(cp), direction(cg)
            reading = ("**over-optimises**" if (dp, dg) == ("up", "down") else f"both {dp}" if dp == dg
                       else f"proxy {dp}, gold {dg}")
            lines.append(f"| {label} | {int(its[e - 1])}-{int(its[e])} | {format_difference(cp)} | "
                         f"{format_difference(cg)} | {reading} |")
    return "\n".join(lines)


def proxy_gold_figure(runs: dict, path: str, title: str, proxy: str = "reward", gold: str = "toy") -> None:
    """The held-out proxy and gold at every evaluation point against iterations, +- SE over seeds, a panel each;
    each seed's own curve faint behind its mean (a drop of one seed, a collapse, shows as itself)."""
    fig = Figure(figsize=(10, 3.8), dpi=110)
    axes = fig.subplots(1, 2)
    styles = ["-", "--", ":", "-."]
    for ax, (metric, name) in zip(axes, [(proxy, "proxy: the trained reward (ToyScore / 26)"),
                                         (gold, "gold: the programmatic score")]):
        seen = {}
        for label, (v, seeds) in runs.items():
            style = styles[seen.get(v.method, 0) % len(styles)]
            seen[v.method] = seen.get(v.method, 0) + 1
            its, scores = _evals(seeds, metric)  # (E,), (S, E)
            ax.plot(its, scores.T, style, color=COLORS[v.method], lw=0.7, alpha=0.3)
            ax.errorbar(its, scores.mean(0), yerr=_se(scores), fmt="o" + style, color=COLORS[v.method], capsize=3,
                        ms=4, label=f"{label} ({len(seeds)} seeds)")
        ax.set_xlabel("iteration")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title}\nheld-out evaluation, +- SE over seeds; faint: each seed", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def figure(runs: dict, path: str, title: str, alone: dict | None = None) -> None:
    """Training reward (5-iteration mean) and the evaluations (before, on the way, after), each +- SE over seeds,
    against iterations, transformer evaluations and wall seconds: as the runs measured them, or, given `alone`
    ({label: seconds per iteration measured alone} for every variant), iterations x those calibrated seconds."""
    fig = Figure(figsize=(14, 3.8), dpi=110)
    axes = fig.subplots(1, 3, sharey=True)
    styles = ["-", "--", ":", "-."]
    calibrated = bool(alone) and all(label in alone for label in runs)
    seconds_label = ("seconds alone, calibrated (iterations x seconds per iteration)" if calibrated
                     else "seconds (sampling + rewards + training)")
    for ax, (xkey, xlabel) in zip(axes, [("iteration", "iteration"), ("evaluations", "transformer evaluations"),
                                         ("seconds", seconds_label)]):
        seen = {}  # variants of each method drawn so far: the next one takes the next line style
        for label, (v, seeds) in runs.items():
            color, style = COLORS[v.method], styles[seen.get(v.method, 0) % len(styles)]
            seen[v.method] = seen.get(v.method, 0) + 1
            x = _costs(seeds)[xkey]
            x = x.mean(0) if x.ndim == 2 else x  # (I+1,): seconds averaged over seeds
            if xkey == "seconds" and calibrated:
                x = _costs(seeds)["iteration"] * alone[label]  # (I+1,)
            y = _smooth(_curve(seeds, "reward/mean"))  # (S, I)
            m, se = y.mean(0), _se(y)
            ax.plot(x[1:], m, style, color=color, lw=1, alpha=0.8, label=f"{label} ({len(seeds)} seeds)")
            ax.fill_between(x[1:], m - se, m + se, color=color, alpha=0.15)
            its, scores = _evals(seeds)  # (E,), (S, E)
            ax.errorbar(x[its], scores.mean(0), yerr=_se(scores), fmt="o" + style, color=color, capsize=3, ms=4,
                        lw=1.5)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    learned = any(v.reward == "toyscore" for v, _ in runs.values())
    axes[0].set_ylabel("proxy: ToyScore / 26 (the trained reward)" if learned else "toy score")
    axes[0].legend(fontsize=6)
    fig.suptitle(f"{title}\nthin lines: training reward (5-iteration mean); dots: evaluation score; +- SE over seeds",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


AXES = {"noise_level": ("a", "noise level a"), "window": ("W", "SDE window W")}  # the ablations' axes: symbol, name


def axis_table(runs: dict, axis: str) -> str:
    """An ablation: each method's change +- SE over seeds (rows) at each value of one axis (columns: the noise
    level a or the window W); then TP-GRPO (strict) minus each other method at each value, seed-paired, with its
    t interval (`paired_difference`)."""
    at = {(v.method, getattr(v, axis)): {**change_stats(seeds), "seeds": len(seeds)} for v, seeds in runs.values()}
    methods, values = list(dict.fromkeys(m for m, _ in at)), sorted({x for _, x in at})
    full = max(c["seeds"] for c in at.values())
    of = lambda n: f" ({n} of {full} seeds)" if n < full else ""  # noqa: E731
    lines = ["| change +- SE over seeds | " + " | ".join(f"{AXES[axis][0]} = {x:g}" for x in values) + " |",
             "|---|" + "---|" * len(values)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(f"{at[m, x]['change']:+.3f} +- {at[m, x]['change_se']:.3f}"
                                              + of(at[m, x]["seeds"]) if (m, x) in at else "-" for x in values) + " |")
    for m in [m for m in methods if m != "tp-grpo" and "tp-grpo" in methods]:
        cells = []
        for x in values:
            if ("tp-grpo", x) in at and (m, x) in at:
                c = paired_difference(at["tp-grpo", x]["per_seed"], at[m, x]["per_seed"])
                cells.append(format_difference(c) + of(c["n"]))
            else:
                cells.append("-")
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
