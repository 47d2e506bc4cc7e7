"""Credit assignment of TP-GRPO: incremental rewards, turning points and balanced aggregated rewards.

Paper (arXiv 2602.06422): Sec. 4.1 (step-wise incremental rewards), Sec. 4.2 (turning points, Def. 4.1; the first
step, Remark 4.2), the stricter turning point (Def. 5.1), the aggregated long-term reward (Sec. 4) and its balanced
replacement. The formulas we implement, in our words, are docs/method.md, 'Turning points' to 'Worked examples';
the names below follow it.

Input: the rewards of the ODE completions of one rollout's window states, R (N, W+1): R[:, 0] = R_0 = R(s_0), the
reward of the completion of s_0 (the state where the SDE window starts), R[:, k] = R_k = R(s_k) (s_k: the state after
window step k), R[:, W] = R_sde (the final image's). Steps are 1-based in the paper and in the comments; step k lives
in column k-1 of every (N, W) tensor.

Shape legend: B prompts, G group size, N = B*G trajectories in B groups of G consecutive rows (as grpo.py takes
them), W window steps.
  R (N, W+1) | d, c, r_agg, rewards, masks (N, W) | Delta (N,)

Run: pure tensor functions (any device, float32 or float64 kept as given); tested by
`python -m pytest tests/test_turning_points.py`. train.py calls `step_rewards` (which checks R once, then the
formulas below run unchecked) and logs the turning-point rate per step from `detect_turning_points`. The checks of
the arguments sit at the end of the file.

Why the strict rule exists, with numbers: docs/method.md, 'Example 2: why the strict rule exists'. In one line:
the base rule can credit a step that raised the reward with a negative r_agg (the collapse after it folded in);
the strict rule also asks sign(d_k) sign(R_sde - R_k) > 0, and then r_agg_k = d_k + (R_sde - R_k) has the sign
of d_k and |r_agg_k| > |d_k|: a strict turning point's credit is only ever amplified, never flipped.
"""

import torch

# the methods whose step rewards come from the completions (Flow-GRPO has none: grpo.flow_grpo_advantages)
CREDITS = ("tp-grpo", "incremental")
RULES = ("strict", "base")


def incremental_rewards(R):
    """d (N, W): the reward change caused by each window step."""
    # Sec. 4.1, the paper's r_t: d_k = R_k - R_{k-1} (positive = the step raised the reward)
    return R[:, 1:] - R[:, :-1]  # (N, W)


def global_trend(R):
    """Delta (N,): the reward change over the whole window."""
    # Delta = R_sde - R_0
    return R[:, -1] - R[:, 0]  # (N,)


def trend_agreement(R):
    """c (N, W) in {-1, 0, +1}: does step k move the reward the way the whole window does?"""
    # c_k = sign(d_k) * sign(Delta), sign(0) = 0 (a flat step or a flat window agrees with nothing)
    return torch.sign(incremental_rewards(R)) * torch.sign(global_trend(R))[:, None]  # (N, W)


def aggregated_rewards(R):
    """r_agg (N, W): the long-term reward of step k, everything that happened from step k on."""
    # r_agg_k = R_sde - R_{k-1} = d_k + d_{k+1} + ... + d_W (telescoping)
    return R[:, -1:] - R[:, :-1]  # (N, W)


def detect_turning_points(R, rule="strict"):
    """Turning points before balancing, (N, W) bool. Training logs their rate per step."""
    _check_choice(rule, RULES, "rule")
    d = incremental_rewards(R)  # (N, W)
    c = trend_agreement(R)  # (N, W)
    # Def. 4.1 (k >= 2): c_{k-1} < 0 and c_k > 0. Remark 4.2: step 1 has no predecessor; it is a turning point
    # iff c_1 > 0, i.e. as if a step 0 had gone against the trend.
    prev_against = torch.cat([torch.ones_like(c[:, :1], dtype=torch.bool), c[:, :-1] < 0], dim=1)  # (N, W)
    tp = prev_against & (c > 0)  # (N, W)
    if rule == "strict":
        # Def. 5.1: additionally sign(d_k) * sign(R_sde - R_k) > 0. For step 1 this alone is the strict rule
        # (it implies c_1 > 0). At k = W, R_sde - R_W = 0: the last step is never a strict turning point.
        after = R[:, -1:] - R[:, 1:]  # (N, W) R_sde - R_k
        tp = tp & (torch.sign(d) * torch.sign(after) > 0)  # (N, W)
    return tp


def balance_turning_points(turning_points, r_agg, G):
    """Keep, per prompt group (G consecutive rows), as many positive as negative replacements: (N, W) bool of kept
    turning points.

    Candidates are the turning points with r_agg != 0 (r_agg = 0 keeps d_k anyway). If a group has candidates
    of both signs, each side keeps only its m = min(n_pos, n_neg) with the largest |r_agg|; ties go to the
    earlier row, then the earlier step. A group whose candidates all share one sign keeps them all.
    """
    # DEVIATION: per prompt group, ranked by |r_agg|; the demo code balances per GPU batch, ranked by |Delta|
    # (docs/deviations.md, 'Balancing per prompt group, ranked by |r_agg|').
    _check_mask(turning_points, r_agg)
    _check_group_size(G, r_agg.shape[0])
    value = r_agg.tolist()  # N x W floats, exactly the tensor's values: the ranking below is the tensor's
    candidates = {}  # group -> its candidates (row, step), in row-major order: the order that breaks ties
    for i, k in (turning_points & (r_agg != 0)).nonzero().tolist():
        candidates.setdefault(i // G, []).append((i, k))
    kept = torch.zeros_like(turning_points)  # (N, W)
    # Balanced replacement, per group (docs/method.md, 'Balanced replacement'). Worked example, one group:
    #     candidate (row, step)     (0,1)  (0,3)  (1,2)  (2,1)  (2,4)
    #     r_agg                     +0.3   -0.2   +0.5   -0.6   -0.1
    #   n_pos = 2, n_neg = 3, m = 2: each side keeps its two largest |r_agg|, so (2,4) is dropped (it keeps d_k).
    for cells in candidates.values():
        positive = [(i, k) for i, k in cells if value[i][k] > 0]
        negative = [(i, k) for i, k in cells if value[i][k] < 0]
        m = min(len(positive), len(negative))  # m = 0: one side is empty, keep all (the demo code does this too)
        for side in (positive, negative):
            ranked = sorted(side, key=lambda c: -abs(value[c[0]][c[1]]))  # stable: ties keep row-major order
            for i, k in ranked[:m] if m > 0 else ranked:
                kept[i, k] = True
    return kept


def step_rewards(R, G, algo="tp-grpo", rule="strict"):
    """Per-step rewards (N, W) of the methods with completions, the mask (N, W) bool of turning points whose reward
    was replaced, and the turning points `rule` detects before balancing (N, W) bool (training logs their rate).
    R (N, W+1) holds B groups of G consecutive rows.

    algo "tp-grpo": r_k = r_agg_k at kept turning points, d_k elsewhere; "incremental": r_k = d_k (the ablation
    without turning points; its mask is all False, but its detected turning points are returned too: how often
    they happen is worth seeing whichever method trains). `rule` ("strict" = Def. 5.1, the paper's headline
    variant; "base" = Def. 4.1) decides which are detected. R is checked here, once, for every formula below.
    """
    _check_choice(algo, CREDITS, "algo")
    _check_choice(rule, RULES, "rule")
    R = _check_rewards(R)
    d = incremental_rewards(R)  # (N, W)
    detected = detect_turning_points(R, rule)  # (N, W)
    if algo == "incremental":
        return d, torch.zeros_like(detected), detected  # (N, W) x 3
    r_agg = aggregated_rewards(R)  # (N, W)
    kept = balance_turning_points(detected, r_agg, G)  # (N, W)
    # r_k = r_agg_k if step k is a kept turning point (and r_agg_k != 0, ensured by balancing), else d_k
    return torch.where(kept, r_agg, d), kept, detected  # (N, W) x 3


def render_group(R, rewards, mask, detected=None, digits=2):
    """Text table of one group for logs and the README (worked example 3).

    R (n, W+1), rewards (n, W), mask (n, W) bool as returned by step_rewards for the group's rows;
    detected (n, W) bool, optional: the turning points before balancing, to show the ones balancing dropped.
    Per trajectory: R per step (column 0 = R_0), d, and the assigned reward r, with `*` at kept turning
    points (r = r_agg) and `o` at dropped ones (r = d).
    """
    R = _check_rewards(R)
    n, W = R.shape[0], R.shape[1] - 1
    for name, x in (("rewards", rewards), ("mask", mask), ("detected", detected)):
        if x is not None and tuple(x.shape) != (n, W):
            raise ValueError(f"{name} must have shape ({n}, {W}) to match R {tuple(R.shape)}, got {tuple(x.shape)}")
    d, delta = incremental_rewards(R).tolist(), global_trend(R).tolist()  # n x W, n
    dropped = torch.zeros_like(mask) if detected is None else detected & ~mask  # (n, W)
    marks = [["*" if m else "o" if x else " " for m, x in zip(*rows)] for rows in zip(mask.tolist(), dropped.tolist())]
    width = max(len(f"{v:+.{digits}f}") for v in R.flatten().tolist() + rewards.flatten().tolist())

    def cells(values, row_marks=None, skip_step_0=True):
        row_marks = row_marks or [" "] * len(values)
        text = [f"{v:+.{digits}f}".rjust(width) + m for v, m in zip(values, row_marks)]
        return " ".join([" " * (width + 1)] * skip_step_0 + text)

    label = " " * (len(f"T{n - 1}") + 1)
    lines = [label + "step " + " ".join(str(k).rjust(width) + " " for k in range(W + 1))]
    for i in range(n):
        lines.append(f"T{i}".ljust(len(label)) + "R    " + cells(R[i].tolist(), skip_step_0=False)
                     + f"  Delta {delta[i]:+.{digits}f}")
        lines.append(label + "d    " + cells(d[i]))
        lines.append(label + "r    " + cells(rewards[i].tolist(), marks[i]))
    legend = "* kept turning point, r = r_agg = R_sde - R_{k-1}"
    lines.append(legend + ("" if detected is None else "   o turning point dropped by balancing, r = d"))
    return "\n".join(line.rstrip() for line in lines)


# ----------------------------------------------------------------------------------------------------------------
# Checks of the arguments: one line naming what does not fit
# ----------------------------------------------------------------------------------------------------------------


def _check_choice(value, valid, name):
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not valid; use one of {', '.join(map(repr, valid))}")


def _check_rewards(R):
    """Validate R (N, W+1); float32/float64 pass unchanged, float16/bfloat16 are upcast to float32."""
    if not isinstance(R, torch.Tensor) or R.dim() != 2 or R.shape[1] < 2:
        shape = tuple(R.shape) if isinstance(R, torch.Tensor) else type(R).__name__
        raise ValueError(f"R must be a (N, W+1) tensor with W >= 1 (columns R_0..R_sde), got {shape}")
    if not R.is_floating_point():
        raise ValueError(f"R must be a float tensor, got {R.dtype}; convert it with R.float()")
    if R.dtype in (torch.float16, torch.bfloat16):
        # Reward differences of a few 1e-3 round away in half precision: work in float32.
        R = R.float()  # (N, W+1)
    if not bool(torch.isfinite(R).all()):
        raise ValueError("R contains NaN or inf; check the reward function's outputs")
    return R


def _check_group_size(G, n):
    if not isinstance(G, int) or G < 1 or n % G:
        raise ValueError(f"the group size G = {G!r} must be a positive integer dividing the {n} rows (groups of G "
                         f"consecutive rows)")


def _check_mask(turning_points, r_agg):
    if turning_points.shape != r_agg.shape or turning_points.dim() != 2 or turning_points.dtype != torch.bool:
        raise ValueError(f"turning_points must be a bool (N, W) mask shaped like r_agg {tuple(r_agg.shape)}, "
                         f"got {turning_points.dtype} {tuple(turning_points.shape)}")
