"""The laboratory's statistics (lab/report.py's tables use them): Student's t, the seed-paired difference between two
methods with its t interval, the two one-sided tests of equivalence, and the reach of a target score (where a curve
first crosses it, interpolated, and the ratio of two costs with a bootstrap interval). Pure functions of numbers.

Seeds are blocks: for one seed every method starts from the same LoRA initialisation and sees the same prompts,
noise and shuffling (train.py seeds them from (seed, iteration, prompt, member)), so a difference between two
methods is the mean of the per-seed differences, with the paired standard error sd(d) / sqrt(n) and a t interval
with n - 1 degrees of freedom (`paired_difference`).

Run: through `python -m lab.compare report ...`; tested by `python -m pytest tests/test_report.py`.

Shape legend: K bootstrap draws, X points of a curve.
"""

from __future__ import annotations

import math

import torch


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with an integer number of degrees of freedom, exactly: Abramowitz & Stegun
    26.7.3-4, P(|T| < x) as a finite series in theta = atan(x / sqrt(df))."""
    theta = math.atan(abs(x) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    term, series = 1.0, 1.0
    if df % 2:  # odd df: (2 / pi) (theta + sin cos (1 + 2/3 cos^2 + (2 4)/(3 5) cos^4 + ... up to cos^(df - 3)))
        for k in range(1, (df - 1) // 2):
            term *= 2 * k / (2 * k + 1) * c2
            series += term
        inside = 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * series if df > 1 else 0.0))
    else:  # even df: sin (1 + 1/2 cos^2 + (1 3)/(2 4) cos^4 + ... up to cos^(df - 2))
        for k in range(1, df // 2):
            term *= (2 * k - 1) / (2 * k) * c2
            series += term
        inside = math.sin(theta) * series
    return 0.5 + math.copysign(inside / 2, x)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t (df degrees of freedom), by bisection on t_cdf (to 1e-10)."""
    lo, hi = -1e6, 1e6
    while hi - lo > 1e-10 * max(1.0, abs(hi)):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def paired_difference(a: dict[int, float], b: dict[int, float], level: float = 0.95) -> dict:
    """A - B over the seeds both have ({seed: value} each): d_s = a_s - b_s, its mean, the paired standard error
    sd(d) / sqrt(n), and the two-sided t interval mean +- t((1 + level) / 2, n - 1) SE. `resolved`: the interval
    excludes 0. With one common seed there is no spread to measure: SE and interval are NaN, never resolved."""
    d = torch.tensor([a[s] - b[s] for s in sorted(a.keys() & b.keys())], dtype=torch.float64)  # (n,)
    n = d.numel()
    mean = d.mean().item() if n else math.nan
    se = (d.std() / math.sqrt(n)).item() if n > 1 else math.nan
    half = t_quantile((1 + level) / 2, n - 1) * se if n > 1 else math.nan
    return {"n": n, "df": n - 1, "mean": mean, "se": se, "lo": mean - half, "hi": mean + half, "level": level,
            "resolved": n > 1 and (mean - half > 0 or mean + half < 0)}


def equivalence(a: dict, b: dict, margin: float) -> dict:
    """Two one-sided tests of A - B against +-margin at 5% each, seed-paired: equivalent when the 90% t interval
    of the paired difference lies inside (-margin, +margin) (the interval that holds 0 says only "not resolved";
    this says "no larger than the margin")."""
    c = paired_difference(a, b, level=0.90)
    return c | {"margin": margin, "equivalent": c["n"] > 1 and -margin < c["lo"] and c["hi"] < margin}


def format_difference(c: dict) -> str:
    """'+0.029 +- 0.041 (95%: -0.076 to +0.134, 5 df)': the mean, its paired SE and its t interval."""
    if c["n"] < 2:
        return "-" if c["n"] == 0 else f"{c['mean']:+.3f} (1 seed: no interval)"
    return (f"{c['mean']:+.3f} +- {c['se']:.3f} ({100 * c.get('level', 0.95):.0f}%: {c['lo']:+.3f} to {c['hi']:+.3f}, "
            f"{c['df']} df)")


def nearest_rank(values: torch.Tensor, q: float) -> float:
    """The q-quantile by nearest rank: the ceil(q m)-th smallest of m values (an observed value, no interpolation)."""
    return values.sort().values[max(math.ceil(q * values.numel()), 1) - 1].item()


def crossing(its: torch.Tensor, curves: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each curve (K, X), its points at iterations its (X,) increasing, first reaches its target (K,): the
    iteration (K,) interpolated linearly between the last point below and the first at or above, and that first
    point's index (K,) (the grid value); NaN and -1 where never. At index 0 there is no point before: its iteration
    (a held-out curve starts with the evaluation before training, iteration 0, so later crossings always have one)."""
    hit = curves >= target[:, None]  # (K, X)
    e = torch.where(hit.any(1), hit.float().argmax(1), -1)  # (K,) the first point at or above the target, or -1
    at, before = e.clamp(min=0), (e - 1).clamp(min=0)  # (K,) each: e and e - 1 (both 0 where e is 0 or -1)
    y1, y0 = (curves.gather(1, i[:, None])[:, 0] for i in (at, before))  # (K,) each
    # x = x_{e-1} + (target - y_{e-1}) / (y_e - y_{e-1}) (x_e - x_{e-1}): y_e >= target > y_{e-1}, so the fraction
    # is in (0, 1] and the denominator positive; at e = 0 the two points are one and the fraction is moot (1)
    fraction = torch.where(e > 0, (target - y0) / torch.where(e > 0, y1 - y0, 1.0), 1.0)  # (K,)
    x = its[before] + fraction * (its[at] - its[before])  # (K,)
    return torch.where(e >= 0, x, math.nan), e


def ratio_interval(method: torch.Tensor, flow: torch.Tensor) -> dict:
    """The 95% interval of method / Flow-GRPO over bootstrap draws, both costs (K,) from the same draws of seeds (NaN
    where never reached): the 2.5% and 97.5% nearest ranks. A draw where the method never reaches is an infinite
    ratio (it pushes the upper end up, to inf past 2.5% of draws, where dropping it would flatter the method); so is
    one where Flow-GRPO's best is its score before training (cost 0; it reaches its own best in every draw).
    `resolved`: "cheaper" when the upper end is below 1, "dearer" when the lower end is above 1."""
    r = (method / flow).nan_to_num(math.inf, math.inf)  # (K,): NaN (never, or 0 / 0) counts as +inf
    lo, hi = nearest_rank(r, 0.025), nearest_rank(r, 0.975)  # 0.025 K, 0.975 K: whole in floats for K <= 20000
    return {"lo": lo, "hi": hi, "resolved": "cheaper" if hi < 1 else "dearer" if lo > 1 else ""}


def direction(c: dict) -> str:
    """'up' or 'down' where the paired t interval excludes 0 on that side, 'flat' where it holds 0 (or, with one
    seed, is NaN)."""
    return "up" if c["lo"] > 0 else "down" if c["hi"] < 0 else "flat"
