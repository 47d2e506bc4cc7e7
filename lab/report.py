"""The laboratory's numbers (lab/compare.py's reports; the pictures are lab/figures.py's): over finished runs of one
experiment, the score change with its standard error over seeds and its paired standard error over the images, the
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

from lab.stats import (crossing, direction, equivalence, format_difference, nearest_rank, paired_difference,
                       ratio_interval)

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
    """Every evaluation point of the runs (before, on the way, after): iterations (E,) and scores (S, E). Where the
    points scored different numbers of images (--eval-subset on the way), every score is the mean over the images
    all of them scored, the first ones."""
    def at(tag, r):
        return 0 if tag == "before" else r["evals"][tag]["iteration"]
    tags = sorted(seeds[0]["evals"], key=lambda t: at(t, seeds[0]))
    its = torch.tensor([at(t, seeds[0]) for t in tags])  # (E,)
    scored = {len(r["evals"][t].get("per_image", {}).get(metric, ())) for r in seeds for t in tags}  # images
    if len(scored) == 1:  # every point scored the same images: its summary
        return its, torch.tensor([[r["evals"][t][f"eval/{metric}"] for t in tags] for r in seeds])  # (S, E)
    m = min(scored)
    return its, torch.tensor([[r["evals"][t]["per_image"][metric][:m] for t in tags] for r in seeds]).mean(2)


def change_stats(seeds: list[dict], metric: str = "reward", tag: str = "after") -> dict:
    """The score change `tag` - before: its mean and SE over seeds, its paired SE over images (the seed-averaged
    change of every image: what another draw of evaluation images could move it), and the change of each seed
    ({seed: change}, what a difference between methods pairs)."""
    after = torch.tensor([r["evals"][tag]["per_image"][metric] for r in seeds])  # (S, M)
    # the same images before (its first M: an evaluation on the way may score only those, --eval-subset)
    before = torch.tensor([r["evals"]["before"]["per_image"][metric][:after.shape[1]] for r in seeds])  # (S, M)
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


def seconds_table(runs: dict) -> str:
    """Each variant's seconds per iteration measured alone: the median over all its runs' iterations after the first
    (`seconds_per_iteration`), each run's own median beside it (their spread), and the phases' medians."""
    lines = ["| variant | seconds per iteration (median) | each run's | sampling / rewards / training |",
             "|---|---|---|---|"]
    for label, (_, seeds) in runs.items():
        phases = [_curve(seeds, f"time/{k}_s")[:, 1:].median().item() for k in ("sample", "reward", "train")]
        lines.append(f"| {label} | {seconds_per_iteration(seeds):.2f} | "
                     + ", ".join(f"{seconds_per_iteration([r]):.2f}" for r in seeds) + " | "
                     + " / ".join(f"{x:.2f}" for x in phases) + " |")
    return "\n".join(lines)


def equivalence_line(runs: dict, a: str, b: str, margin: float, metric: str = "reward") -> str:
    """The pre-registered equivalence test of A and B's change after training (`stats.equivalence`)."""
    if a not in runs or b not in runs:
        return ""
    e = equivalence(*(change_stats(runs[x][1], metric)["per_seed"] for x in (a, b)), margin)
    return (f"Equivalence of {a} and {b} after training (two one-sided tests at 5% each against +-{margin}): "
            f"{a} - {b} = {format_difference(e)}: " + ("equivalent" if e["equivalent"] else "not shown equivalent")
            + f" (the 90% interval {'lies' if e['equivalent'] else 'does not lie'} inside +-{margin}).")


AUDIT = (("judge/corr_0", "correlation at s_0"), ("judge/sign_agree", "sign agreement"))


def audit_curve(seeds: list[dict], key: str) -> dict[int, torch.Tensor]:
    """{iteration: (S',) the audit statistic `key` of every seed that logged it there} over the audited iterations
    (a seed whose audit left the statistic out, nothing to count, is left out of that iteration)."""
    its = sorted({row["iteration"] for r in seeds for row in r["rows"] if "judge/resolved" in row})
    return {i: torch.tensor([row[key] for r in seeds for row in r["rows"] if row["iteration"] == i and key in row])
            for i in its}


def audit_table(runs: dict) -> str:
    """The judge audit over training: for each variant, the judge's within-group correlation with the stochastic
    truth at s_0 (judge/corr_0) and the sign agreement of resolved d_k (judge/sign_agree) at every audit, mean +-
    SE over seeds (`audit_curve`)."""
    its = sorted({i for _, seeds in runs.values() for i in audit_curve(seeds, AUDIT[0][0])})
    lines = ["| variant | statistic | " + " | ".join(f"iteration {i}" for i in its) + " |",
             "|---|---|" + "---|" * len(its)]
    for label, (_, seeds) in runs.items():
        for key, name in AUDIT:
            curve = audit_curve(seeds, key)
            cells = [f"{x.mean():.2f} +- {_se(x[:, None])[0]:.2f}" if (x := curve.get(i, torch.zeros(0))).numel()
                     else "-" for i in its]
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def late_loss(seeds: list[dict], metric: str = "toy") -> dict[int, float]:
    """{seed: the run's best score over its evaluation points after training began minus its last}: what a run
    lost after its peak (0 for a run still at its best)."""
    its, scores = _evals(seeds, metric)  # (E,), (S, E)
    return {seed_of(r): (s[its > 0].max() - s[-1]).item() for r, s in zip(seeds, scores)}


def late_drops(seeds: list[dict], metric: str = "reward", start: int = 60, threshold: float = 0.03) -> int:
    """How many runs' score falls by more than `threshold` within a stretch between evaluation points that starts
    at iteration `start` or later (the clip check's late-drop rule)."""
    its, scores = _evals(seeds, metric)  # (E,), (S, E)
    falls = (scores[:, :-1] - scores[:, 1:])[:, its[:-1] >= start]  # (S, stretches from `start` on)
    return int((falls > threshold).any(1).sum())


def clip_check_table(runs: dict, pairs: tuple) -> str:
    """The clip check (lab/README.md, 'The clip check'): for each (clip 1e-5, clip 1e-4) pair of labels, the late
    drops at each clip and the late loss (`late_loss`) clip 1e-5 minus clip 1e-4, seed-paired, on the gold and
    the proxy; then the same pooled over the pairs (each (pair, seed) one paired difference)."""
    lines = ["| method | late drops (proxy), clip 1e-5 / 1e-4 | late loss, 1e-5 - 1e-4: gold (primary) | proxy |",
             "|---|---|---|---|"]
    pooled = {metric: ({}, {}) for metric in ("toy", "reward")}
    for i, (a, b) in enumerate(p for p in pairs if p[0] in runs and p[1] in runs):
        cells = [a.split(" clip")[0], f"{late_drops(runs[a][1])} of {len(runs[a][1])} / "
                                      f"{late_drops(runs[b][1])} of {len(runs[b][1])}"]
        for metric, (pa, pb) in pooled.items():
            la, lb = late_loss(runs[a][1], metric), late_loss(runs[b][1], metric)
            cells.append(format_difference(paired_difference(la, lb)))
            pa.update({(i, s): x for s, x in la.items()})
            pb.update({(i, s): x for s, x in lb.items()})
        lines.append("| " + " | ".join(cells) + " |")
    if len(lines) > 3:
        cells = [format_difference(paired_difference(pa, pb)) for pa, pb in pooled.values()]
        lines.append(f"| pooled ({len(pooled['toy'][0])} pairs) | - | " + " | ".join(cells) + " |")
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
