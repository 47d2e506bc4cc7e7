"""The laboratory's pictures (lab/compare.py's reports): each experiment's curves against iterations, transformer
evaluations and seconds, the proxy and the gold along the way, the grid's matrix and the ablations' change against
a or W. Drawn from finished runs' results with lab/report.py's readings of them; `runs` is {label: (variant,
[result per seed])}.

Run: through `python -m lab.compare report ...`; tested by `python -m pytest tests/test_report.py`.

Shape legend: S seeds, I iterations, E evaluation points.
"""

from __future__ import annotations

import textwrap

from matplotlib.figure import Figure

from lab import report

COLORS = {"flow-grpo": "tab:gray", "tp-grpo": "tab:red", "tp-grpo-base": "tab:orange", "incremental": "tab:blue"}
# a method's further variants (another judge, window or noise level): its colour's darker and lighter kin, in order
SHADES = {"flow-grpo": ["black", "silver"], "tp-grpo": ["darkred", "tab:pink", "tab:purple"],
          "tp-grpo-base": ["saddlebrown", "gold"], "incremental": ["navy", "tab:cyan", "slateblue"]}
STYLES = ["-", "--", ":", "-."]


def looks(runs: dict) -> dict:
    """{label: (colour, line style)}: a method's first variant in its colour with a solid line, each further one in
    the next shade and line style, so that four judges of one method stay apart in print and on screen."""
    seen, out = {}, {}
    for label, (v, _) in runs.items():
        i = seen[v.method] = seen.get(v.method, -1) + 1
        shades = [COLORS[v.method], *SHADES[v.method]]
        out[label] = (shades[i % len(shades)], STYLES[i % len(STYLES)])
    return out


def proxy_gold_figure(runs: dict, path: str, title: str, proxy: str = "reward", gold: str = "toy") -> None:
    """The held-out proxy and gold at every evaluation point against iterations, +- SE over seeds, a panel each;
    each seed's own curve faint behind its mean (a drop of one seed, a collapse, shows as itself)."""
    fig = Figure(figsize=(10, 3.8), dpi=110)
    axes = fig.subplots(1, 2)
    look = looks(runs)
    for ax, (metric, name) in zip(axes, [(proxy, "proxy: the trained reward (ToyScore / 26)"),
                                         (gold, "gold: the programmatic score")]):
        for label, (v, seeds) in runs.items():
            color, style = look[label]
            its, scores = report._evals(seeds, metric)  # (E,), (S, E)
            ax.plot(its, scores.T, style, color=color, lw=0.7, alpha=0.3)
            ax.errorbar(its, scores.mean(0), yerr=report._se(scores), fmt="o" + style, color=color, capsize=3, ms=4,
                        label=f"{label} ({len(seeds)} seeds)")
        ax.set_xlabel("iteration")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    # wrapped: an experiment's description is longer than this figure is wide
    fig.suptitle(f"{textwrap.fill(title, 150)}\nheld-out evaluation, +- SE over seeds; faint: each seed", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def figure(runs: dict, path: str, title: str, alone: dict | None = None) -> None:
    """Training reward (5-iteration mean) and the evaluations (before, on the way, after), each +- SE over seeds,
    against iterations, transformer evaluations and wall seconds: as the runs measured them, or, given `alone`
    ({label: seconds per iteration measured alone} for every variant), iterations x those calibrated seconds."""
    fig = Figure(figsize=(14, 3.8), dpi=110)
    axes = fig.subplots(1, 3, sharey=True)
    look = looks(runs)
    calibrated = bool(alone) and all(label in alone for label in runs)
    seconds_label = ("seconds alone, calibrated (iterations x seconds per iteration)" if calibrated
                     else "seconds (sampling + rewards + training)")
    for ax, (xkey, xlabel) in zip(axes, [("iteration", "iteration"), ("evaluations", "transformer evaluations"),
                                         ("seconds", seconds_label)]):
        for label, (v, seeds) in runs.items():
            color, style = look[label]
            x = report._costs(seeds)[xkey]
            x = x.mean(0) if x.ndim == 2 else x  # (I+1,): seconds averaged over seeds
            if xkey == "seconds" and calibrated:
                x = report._costs(seeds)["iteration"] * alone[label]  # (I+1,)
            y = report._smooth(report._curve(seeds, "reward/mean"))  # (S, I)
            m, se = y.mean(0), report._se(y)
            ax.plot(x[1:], m, style, color=color, lw=1, alpha=0.8, label=f"{label} ({len(seeds)} seeds)")
            ax.fill_between(x[1:], m - se, m + se, color=color, alpha=0.15)
            its, scores = report._evals(seeds)  # (E,), (S, E)
            ax.errorbar(x[its], scores.mean(0), yerr=report._se(scores), fmt="o" + style, color=color, capsize=3, ms=4,
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


def audit_figure(runs: dict, path: str, title: str) -> None:
    """The judge audit over training: each variant's within-group correlation of its judge with the stochastic truth
    at s_0, and the sign agreement of resolved d_k, against iterations, mean +- SE over seeds (report.audit_curve)."""
    fig = Figure(figsize=(10, 3.8), dpi=110)
    axes = fig.subplots(1, 2)
    look = looks(runs)
    for ax, (key, name) in zip(axes, report.AUDIT):
        for label, (v, seeds) in runs.items():
            color, style = look[label]
            curve = {i: x for i, x in report.audit_curve(seeds, key).items() if x.numel()}
            ax.errorbar(list(curve), [x.mean().item() for x in curve.values()],
                        [report._se(x[:, None])[0].item() for x in curve.values()], fmt="o" + style,
                        color=color, capsize=3, ms=4, label=f"{label} ({len(seeds)} seeds)")
        ax.axhline(0.5 if key == "judge/sign_agree" else 0, color="black", lw=0.5)
        ax.set_xlabel("iteration")
        ax.set_ylabel(f"judge audit: {name}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    fig.suptitle(f"{title}\nthe judge against the stochastic truth on one audited group, +- SE over seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


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
        points = sorted((v.lr, report.change_stats(seeds)) for v, seeds in runs.values() if (v.method, v.clip_range) ==
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
    series = [(m, m, "-", sorted((getattr(v, axis) + (i - (len(methods) - 1) / 2) * step, report.change_stats(seeds))
                                 for v, seeds in runs.values() if v.method == m)) for i, m in enumerate(methods)]
    _change_figure(series, report.AXES[axis][1], "held-out change",
                   f"{title}\n+- SE over seeds", path)
