"""Tests for turning_points.py: the worked examples of docs/method.md ('Worked examples') and hand-computed cases,
properties on seeded random groups, and everything against a plain-Python oracle written from the wording of
Def. 4.1, Remark 4.2, Def. 5.1 and docs/method.md, 'Turning points' to 'Per-step rewards of the three methods', whose
balancing enumerates every choice of kept turning points (a different algorithm from the per-group ranking of
turning_points.balance_turning_points)."""

import itertools

import pytest
import torch

from turning_points import (aggregated_rewards, balance_turning_points, detect_turning_points, global_trend,
                            incremental_rewards, render_group, step_rewards, trend_agreement)

T = torch.tensor
EX1 = [0.50, 0.40, 0.45, 0.60, 0.70]
EX2 = [0.0, 2.0, 1.5, 1.8, 0.1]
EX3 = [[0.5, 0.4, 0.45, 0.6, 0.7], [0.5, 0.6, 0.65, 0.7, 0.9], [0.5, 0.6, 0.55, 0.45, 0.3]]
EX3_REWARDS = [[-0.10, 0.05, 0.15, 0.10], [0.40, 0.05, 0.05, 0.20], [0.10, -0.30, -0.10, -0.15]]


def close(a, b):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------- oracle


def sign(x):
    return (x > 0) - (x < 0)


def oracle(R, group, rule):
    """Plain Python, one trajectory / one group at a time, straight from docs/method.md's wording ('Turning
    points' to 'Per-step rewards of the three methods'). Returns (tp, kept, rewards)."""
    N, W = len(R), len(R[0]) - 1
    tp = [[False] * W for _ in range(N)]
    for i, r in enumerate(R):
        delta = sign(r[W] - r[0])
        c = [sign(r[k] - r[k - 1]) * delta for k in range(1, W + 1)]
        for k in range(1, W + 1):
            keeps_moving = sign(r[k] - r[k - 1]) * sign(r[W] - r[k]) > 0
            if k == 1:  # Remark 4.2
                tp[i][0] = keeps_moving if rule == "strict" else c[0] > 0
            else:  # Def. 4.1, plus Def. 5.1 for strict
                tp[i][k - 1] = c[k - 2] < 0 and c[k - 1] > 0 and (rule == "base" or keeps_moving)
    kept = [[False] * W for _ in range(N)]
    for g in set(group):
        # r_agg_k = R_sde - R_{k-1}: column k-1 of R's first W columns
        r_agg = {(i, k): R[i][W] - R[i][k] for i in range(N) if group[i] == g for k in range(W) if tp[i][k]}
        sides = [[c for c, r in r_agg.items() if r > 0], [c for c, r in r_agg.items() if r < 0]]
        m = min(len(s) for s in sides)
        for side in sides:
            # of every choice of m (all of them when the other side is empty), the one whose every member outranks
            # every candidate it leaves out: a larger |r_agg|, on a tie the earlier trajectory, then the earlier step
            outranks = lambda a, b: (-abs(r_agg[a]), a) < (-abs(r_agg[b]), b)  # noqa: E731
            choices = [kept_ for kept_ in itertools.combinations(side, m if m else len(side))
                       if all(outranks(a, b) for a in kept_ for b in side if b not in kept_)]
            assert len(choices) == 1  # the rule always names exactly one set
            for i, k in choices[0]:
                kept[i][k] = True
    rewards = [[R[i][W] - R[i][k] if kept[i][k] else R[i][k + 1] - R[i][k] for k in range(W)] for i in range(N)]
    return tp, kept, rewards


def random_groups(seed, quantized, n_groups=40, G=8, W=6):
    """Rows of n_groups groups of G consecutive rows, and G. quantized: 4 reward levels, float32 (exact
    differences, many ties and sign(0)); else continuous float64."""
    gen = torch.Generator().manual_seed(seed)
    if quantized:
        R = torch.randint(0, 4, (n_groups * G, W + 1), generator=gen).float() / 4  # (N, W+1)
    else:
        R = torch.rand(n_groups * G, W + 1, generator=gen, dtype=torch.float64)  # (N, W+1)
    return R, G


def group_ids(R, G):
    """The prompt group of every row (N,): the oracle's and the property tests' view of G consecutive rows."""
    return torch.arange(R.shape[0]) // G


CASES = [(seed, q, rule) for seed in range(12) for q in (False, True) for rule in ("strict", "base")]


# ------------------------------------------------------------------------------------- worked examples


def test_worked_example_1_both_rules():
    R = T([EX1])
    close(global_trend(R), [0.20])
    close(incremental_rewards(R), [[-0.10, 0.05, 0.15, 0.10]])
    assert trend_agreement(R).tolist() == [[-1, 1, 1, 1]]
    for rule in ("strict", "base"):
        rewards, mask, _ = step_rewards(R, 1, rule=rule)
        assert detect_turning_points(R, rule).tolist() == [[False, True, False, False]]
        assert mask.tolist() == [[False, True, False, False]]
        close(aggregated_rewards(R)[0, 1], 0.30)
        close(rewards, [[-0.10, 0.30, 0.15, 0.10]])


def test_worked_example_2_base_credits_a_rising_step_negatively_strict_does_not():
    R = T([EX2])
    close(global_trend(R), [0.1])
    close(incremental_rewards(R), [[2.0, -0.5, 0.3, -1.7]])
    assert trend_agreement(R).tolist() == [[1, -1, 1, -1]]
    rewards, mask, _ = step_rewards(R, 1, rule="base")
    assert mask.tolist() == [[True, False, True, False]]
    close(rewards, [[0.1, -0.5, -1.4, -1.7]])
    rewards, mask, _ = step_rewards(R, 1, rule="strict")
    assert not detect_turning_points(R, "strict").any() and not mask.any()
    close(rewards, incremental_rewards(R))


def test_worked_example_3_balancing_keeps_the_larger_positive():
    R = T(EX3)
    assert detect_turning_points(R, "strict").tolist() == [[False, True, False, False], [True, False, False, False],
                                                           [False, True, False, False]]
    rewards, mask, _ = step_rewards(R, 3, rule="strict")
    assert mask.tolist() == [[False, False, False, False], [True, False, False, False], [False, True, False, False]]
    close(rewards, EX3_REWARDS)


def test_each_group_of_G_consecutive_rows_is_balanced_on_its_own():
    # Group 0: example 3. Group 1: example 2 and example 1 twice, under the base rule: candidates EX2 step 1
    # (+0.1) and step 3 (-1.4), each EX1 step 2 (+0.3). Three positive, one negative: m = 1, so the negative and the
    # first EX1 row's +0.3 (a tie with the second: the earlier row) are kept; EX2's +0.1 falls back to d_1 = +2.
    R = T([*EX3, EX2, EX1, EX1])
    rewards, mask, _ = step_rewards(R, 3, rule="base")
    close(rewards[:3], step_rewards(T(EX3), 3, rule="base")[0])
    close(rewards[3:], [[2.0, -0.5, -1.4, -1.7], [-0.10, 0.30, 0.15, 0.10], [-0.10, 0.05, 0.15, 0.10]])
    # Example 3 under "base": T1 step 2 (+0.30), T2 step 1 (+0.40), T3 step 2 (-0.30) -> T1 falls back again.
    assert mask[:3].tolist() == [[False] * 4, [True, False, False, False], [False, True, False, False]]
    # balanced as one group of six, the two groups' candidates would compete (5 positive, 2 negative: m = 2), and
    # example 3's T0 (+0.30, the earliest of three ties behind T1's +0.40) would be kept
    assert step_rewards(R, 6, rule="base")[1][0, 1] and not mask[0, 1]


# ------------------------------------------------------------------------------------------ properties


@pytest.mark.parametrize("seed,quantized,rule", CASES)
def test_matches_the_python_oracle(seed, quantized, rule):
    R, G = random_groups(seed, quantized)
    tp, kept, rewards = oracle(R.tolist(), group_ids(R, G).tolist(), rule)
    assert detect_turning_points(R, rule).tolist() == tp
    got_rewards, got_mask, _ = step_rewards(R, G, rule=rule)
    assert got_mask.tolist() == kept
    assert got_rewards.dtype == R.dtype
    assert torch.equal(got_rewards, torch.tensor(rewards, dtype=R.dtype))  # bit-exact: same float ops


@pytest.mark.parametrize("seed,quantized,rule", CASES)
def test_turning_point_properties(seed, quantized, rule):
    R, _ = random_groups(seed, quantized)
    d, delta, r_agg = incremental_rewards(R), global_trend(R), aggregated_rewards(R)
    tp = detect_turning_points(R, rule)
    assert tp.any()
    assert not (tp & ~detect_turning_points(R, "base")).any()  # strict is a subset of base
    assert (torch.sign(d[tp]) == torch.sign(delta)[:, None].expand_as(d)[tp]).all()  # goes with the trend
    assert (torch.sign(d[tp]) != 0).all()
    if rule == "strict":
        assert (torch.sign(r_agg[tp]) == torch.sign(d[tp])).all()
        assert (r_agg[tp].abs() > d[tp].abs()).all()
    rev_cumsum = d.flip(1).cumsum(1).flip(1)  # (N, W) sum_{j >= k} d_j
    torch.testing.assert_close(r_agg, rev_cumsum, atol=1e-6, rtol=0)
    flat = delta == 0
    if quantized:
        assert flat.any()  # the case is exercised
    assert not tp[flat].any()  # Delta = 0: sign(0) never makes a turning point


@pytest.mark.parametrize("seed,quantized,rule", CASES)
def test_balancing_properties(seed, quantized, rule):
    R, G = random_groups(seed, quantized)
    r_agg, d = aggregated_rewards(R), incremental_rewards(R)
    tp = detect_turning_points(R, rule)
    rewards, kept, _ = step_rewards(R, G, rule=rule)
    group = group_ids(R, G)
    assert not (kept & ~tp).any()
    assert torch.equal(rewards, torch.where(kept, r_agg, d))
    assert (r_agg[kept] != 0).all()
    dropped_any = False
    for g in group.unique():
        rows = group == g
        cand, keep, mag = (tp & (r_agg != 0))[rows], kept[rows], r_agg[rows].abs()
        side = r_agg[rows] > 0
        n_pos, n_neg = (cand & side).sum(), (cand & ~side).sum()
        if n_pos and n_neg:
            assert (keep & side).sum() == (keep & ~side).sum() == min(n_pos, n_neg)
        else:
            assert torch.equal(keep, cand)
        for s in (side, ~side):
            drop = cand & s & ~keep
            dropped_any |= bool(drop.any())
            if drop.any():
                assert mag[keep & s].min() >= mag[drop].max()
    assert dropped_any  # balancing actually did something in these data


def test_ties_in_r_agg_occur_and_break_by_row_then_step():
    R, _ = random_groups(0, quantized=True)
    r_agg = aggregated_rewards(R)
    cand = detect_turning_points(R, "base") & (r_agg != 0)
    assert r_agg[cand].abs().unique().numel() < cand.sum()  # equal |r_agg| among candidates: ties happen
    # One group, two positive candidates of equal |r_agg| and one negative: the earlier row wins.
    R = T([[0.0, 0.5, 1.0], [0.0, 0.5, 1.0], [0.0, -0.5, -1.0]])
    _, mask, _ = step_rewards(R, 3, rule="strict")
    assert mask.tolist() == [[True, False], [False, False], [True, False]]


def test_vectorized_is_equivariant_under_reordering_groups_and_their_members():
    R, G = random_groups(3, quantized=False)  # continuous: no ties, so no tie-break order involved
    gen = torch.Generator().manual_seed(1)
    B = R.shape[0] // G
    # (B, G) row indices: the groups in another order, and each group's members shuffled among themselves
    rows = torch.randperm(B, generator=gen)[:, None] * G + torch.stack([torch.randperm(G, generator=gen)
                                                                        for _ in range(B)])
    perm = rows.flatten()  # (N,) still groups of G consecutive rows
    rewards, mask, _ = step_rewards(R, G)
    p_rewards, p_mask, _ = step_rewards(R[perm], G)
    assert torch.equal(p_rewards, rewards[perm]) and torch.equal(p_mask, mask[perm])


@pytest.mark.parametrize("quantized", [False, True])
def test_incremental_is_d_and_flow_grpo_has_no_step_rewards(quantized):
    R, G = random_groups(7, quantized)
    with pytest.raises(ValueError, match="algo='flow-grpo'"):  # its credit is grpo.flow_grpo_advantages
        step_rewards(R, G, algo="flow-grpo")
    rewards, mask, _ = step_rewards(R, G, algo="incremental", rule="base")
    assert torch.equal(rewards, R[:, 1:] - R[:, :-1]) and not mask.any()


@pytest.mark.parametrize("algo", ["tp-grpo", "incremental"])
@pytest.mark.parametrize("rule", ["strict", "base"])
def test_step_rewards_return_the_detected_turning_points(algo, rule):
    R, G = random_groups(11, quantized=True)
    _, kept, detected = step_rewards(R, G, algo=algo, rule=rule)
    assert torch.equal(detected, detect_turning_points(R, rule)) and detected.any()
    assert not (kept & ~detected).any()  # balancing only ever drops detected turning points
    if algo == "tp-grpo":
        assert kept.any() and kept.sum() <= detected.sum()


def test_zero_aggregated_reward_keeps_d():
    # Base rule, d = [2, -1, 0.5, -0.5]: step 3 is a turning point (c_2 < 0 < c_3) but R_2 = R_sde, so
    # r_agg_3 = 0 and it keeps d_3; step 1 (r_agg = +1) is kept.
    R = T([[0.0, 2.0, 1.0, 1.5, 1.0]])
    assert detect_turning_points(R, "base").tolist() == [[True, False, True, False]]
    rewards, mask, _ = step_rewards(R, 1, rule="base")
    assert aggregated_rewards(R)[0, 2] == 0
    assert mask.tolist() == [[True, False, False, False]]
    close(rewards, [[1.0, -1.0, 0.5, -0.5]])


# ------------------------------------------------------------------------------------- dtypes, errors


def test_dtypes():
    for dtype, out in ((torch.float32, torch.float32), (torch.float64, torch.float64), (torch.bfloat16, torch.float32)):
        rewards, mask, _ = step_rewards(T(EX3, dtype=dtype), 3)
        assert rewards.dtype == out and mask.dtype == torch.bool
    r64, _, _ = step_rewards(T(EX3, dtype=torch.float64), 3)
    assert r64[1, 0].item() == 0.9 - 0.5  # float64 is not rounded through float32


@pytest.mark.parametrize("call,match", [
    (lambda: step_rewards(T(EX3), 3, algo="ppo"), "algo='ppo'.*'tp-grpo', 'incremental'"),
    (lambda: step_rewards(T(EX3), 3, rule="loose"), "rule='loose'.*'strict', 'base'"),
    (lambda: detect_turning_points(T(EX3), rule="Strict"), "rule='Strict'"),
    (lambda: step_rewards(T(EX3), 2), "G = 2 must be a positive integer dividing the 3 rows"),
    (lambda: step_rewards(T(EX3), 3.0), "positive integer"),
    (lambda: step_rewards(T([1, 2, 3]), 1), r"\(N, W\+1\)"),
    (lambda: step_rewards(T([[1, 2, 3]]), 1), "float"),
    (lambda: step_rewards(T([[1.0, float("nan")]]), 1), "NaN"),
])
def test_bad_input_raises_one_line_error(call, match):
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_balance_rejects_a_float_mask():
    with pytest.raises(ValueError, match="bool"):
        balance_turning_points(torch.ones(3, 4), torch.ones(3, 4), 3)


# ------------------------------------------------------------------------------------------- rendering


def test_render_group_marks_kept_and_dropped_turning_points():
    R = T(EX3)
    rewards, mask, _ = step_rewards(R, 3)
    text = render_group(R, rewards, mask, detected=detect_turning_points(R))
    lines = text.splitlines()
    assert len(lines) == 1 + 3 * 3 + 1
    assert lines[0].split() == ["step", "0", "1", "2", "3", "4"]
    r_lines = [line.split() for line in lines if line.split()[0] == "r"]
    assert r_lines == [["r", "-0.10", "+0.05o", "+0.15", "+0.10"], ["r", "+0.40*", "+0.05", "+0.05", "+0.20"],
                       ["r", "+0.10", "-0.30*", "-0.10", "-0.15"]]
    assert lines[1].split() == ["T0", "R", "+0.50", "+0.40", "+0.45", "+0.60", "+0.70", "Delta", "+0.20"]
    assert lines[2].split() == ["d", "-0.10", "+0.05", "+0.15", "+0.10"]
    # Columns line up: each step's reward sits under its step number.
    assert lines[0].index("1") + 1 == lines[6].index("+0.40*") + len("+0.40")
    assert "o" not in "".join(render_group(R, rewards, mask).splitlines()[1:-1])


def test_balancing_keeps_what_its_worked_example_says():
    # balance_turning_points' comment: candidates (row, step) (0,1) +0.3, (0,3) -0.2, (1,2) +0.5, (2,1) -0.6,
    # (2,4) -0.1 in one group; m = min(2, 3) = 2, so (2,4), the smallest negative, is the one dropped
    r_agg, cand = torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.bool)
    for row, step, value in [(0, 1, 0.3), (0, 3, -0.2), (1, 2, 0.5), (2, 1, -0.6), (2, 4, -0.1)]:
        r_agg[row, step - 1], cand[row, step - 1] = value, True
    kept = balance_turning_points(cand, r_agg, 3)
    assert kept.tolist() == [[True, False, True, False], [False, True, False, False], [True, False, False, False]]


def test_the_demo_codes_split_by_the_sign_of_delta_differs_under_the_base_rule_only():
    # docs/deviations.md, 'Balancing per prompt group, split and ranked by r_agg': the demo code splits turning points
    # into positive and negative by sign(Delta) and ranks them by |Delta|; we use the r_agg each one is given. One
    # group, base rule: example 2 (steps 1 and 3: r_agg +0.1 and -1.4, both with Delta = +0.1) and example 3's T2
    # (step 2: r_agg -0.3, Delta -0.2).
    R = T([EX2, EX3[2]])
    detected = detect_turning_points(R, "base")
    assert detected.tolist() == [[True, False, True, False], [False, True, False, False]]
    # ours: one positive (+0.1), two negative (-1.4, -0.3): m = 1 keeps +0.1 and -1.4, T2's -0.3 falls back to d
    ours = balance_turning_points(detected, aggregated_rewards(R), 2)
    assert ours.tolist() == [[True, False, True, False], [False, False, False, False]]
    # the demo's: by Delta, example 2's two are positive (|Delta| 0.1 each) and T2's negative (|Delta| 0.2): m = 1
    # keeps one of example 2's and T2's, which ours drops
    by_delta = balance_turning_points(detected, global_trend(R)[:, None].expand(-1, 4).contiguous(), 2)
    assert by_delta[1, 1] and by_delta[0].sum() == 1 and not torch.equal(by_delta, ours)
    # under the strict rule every turning point has sign(r_agg) = sign(Delta): the two splits are the same split
    for seed in range(4):
        R, _ = random_groups(seed, quantized=True)
        strict = detect_turning_points(R, "strict")
        signs = torch.sign(aggregated_rewards(R)), torch.sign(global_trend(R))[:, None].expand(-1, R.shape[1] - 1)
        assert strict.any() and torch.equal(signs[0][strict], signs[1][strict])
