"""Tests for grpo.py: per-timestep advantages against a plain-Python oracle (statistics.pstdev), the
clipped surrogate against hand computations, and the KL against torch.distributions."""

import math
import statistics

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from grpo import flow_grpo_advantages, grpo_loss, per_timestep_advantages, zero_std_fraction
from turning_points import step_rewards

T = torch.tensor


G = 8


def random_batch(seed, n_groups=16, W=5, levels=None, dtype=torch.float32):
    """Rows of n_groups groups of G consecutive rows (train.py's layout) and their group ids; levels: quantize to
    that many values."""
    gen = torch.Generator().manual_seed(seed)
    R = torch.rand(n_groups * G, W + 1, generator=gen, dtype=dtype)  # (N, W+1)
    if levels:
        R = (R * levels).floor() / levels
    return R, torch.arange(n_groups * G) // G


def oracle_advantages(x, G, clip=5.0):
    """Plain Python: each (group, column) normalized with statistics' population std; rows i*G .. i*G+G-1 form
    group i."""
    x = x.tolist()
    out = [[0.0] * len(x[0]) for _ in x]
    for start in range(0, len(x), G):
        rows = range(start, start + G)
        for k in range(len(x[0])):
            col = [x[i][k] for i in rows]
            mu, sd = statistics.fmean(col), statistics.pstdev(col)
            for i in rows:
                a = 0.0 if len(set(col)) == 1 else (x[i][k] - mu) / (sd + 1e-4)
                out[i][k] = max(-clip, min(clip, a))
    return torch.tensor(out, dtype=torch.float64)


# ------------------------------------------------------------------------------------------ advantages


@pytest.mark.parametrize("seed,levels", [(s, lv) for s in range(4) for lv in (None, 3)])
def test_per_timestep_advantages_match_oracle(seed, levels):
    R, group = random_batch(seed, levels=levels)
    for rewards in (step_rewards(R, G, algo="tp-grpo")[0], step_rewards(R, G, algo="incremental")[0],
                    R[:, -1:].expand(-1, R.shape[1] - 1)):  # the last: Flow-GRPO's outcome reward on every step
        adv = per_timestep_advantages(rewards, G)
        assert adv.dtype == torch.float32 and adv.shape == rewards.shape
        torch.testing.assert_close(adv.double(), oracle_advantages(rewards, G), atol=2e-5, rtol=1e-5)


def test_group_mean_zero_and_unit_std_at_each_step():
    R, group = random_batch(11, dtype=torch.float64)
    rewards, _, _ = step_rewards(R, G)
    adv = per_timestep_advantages(rewards, G)
    assert adv.dtype == torch.float64  # float64 in, float64 out
    for g in group.unique():
        a, r = adv[group == g], rewards[group == g]
        torch.testing.assert_close(a.mean(0), torch.zeros_like(a[0]), atol=1e-12, rtol=0)
        std = r.std(0, unbiased=False)
        torch.testing.assert_close(a.std(0, unbiased=False), std / (std + 1e-4), atol=1e-12, rtol=0)


def test_constant_group_gets_exactly_zero():
    # Group 3: all members equal at every step (in float32, (0.9 + 0.9 + 0.9) / 3 != 0.9, so the naive
    # formula would give ~6e-4 instead of 0); group 8: equal at step 1 only.
    rewards = T([[0.9, 0.9], [0.9, 0.9], [0.9, 0.9], [0.3, 0.7], [0.3, 0.2], [0.3, 0.9]])
    adv = per_timestep_advantages(rewards, 3)
    assert torch.isfinite(adv).all()
    assert (adv[:3] == 0).all() and (adv[3:, 0] == 0).all()
    assert (adv[3:, 1] != 0).all()
    assert zero_std_fraction(rewards, 3).item() == 0.75  # 3 of the 4 (group, step) cells are constant
    assert zero_std_fraction(rewards[:, 1], 3).item() == 0.5
    # The paper's group size: 24 equal rewards of 0.1 (float32 sum / 24 misses 0.1 by an ulp).
    assert (per_timestep_advantages(torch.full((24, 9), 0.1), 24) == 0).all()


def test_single_member_group_gets_zero():
    rewards = T([[1.0, 2.0], [0.0, 5.0], [3.0, 3.0], [1.0, 3.0]])
    assert (per_timestep_advantages(rewards, 1) == 0).all()
    adv = per_timestep_advantages(rewards, 2)  # two members: +-1 (up to the 1e-4), or 0 where they are equal
    assert (adv[:2].abs() > 0.99).all() and (adv[2:, 1] == 0).all() and (adv[2:, 0].abs() > 0.99).all()


def test_groups_are_consecutive_rows():
    """Group i is rows i*G .. i*G+G-1: the same rewards in another group layout give other advantages, and each
    group's advantages are those of its rows alone."""
    R, _ = random_batch(3)
    adv = per_timestep_advantages(R, G)
    for i in range(0, R.shape[0], G):
        assert torch.equal(adv[i:i + G], per_timestep_advantages(R[i:i + G], G))
    assert not torch.equal(per_timestep_advantages(R, G // 2)[:G], adv[:G])


def test_clipping_at_5():
    # One success among 50: z = (1 - 0.02) / sqrt(0.02 * 0.98) = 7.0 -> clipped to 5; the others are -0.143.
    rewards = torch.zeros(50, 2)
    rewards[0] = 1.0
    adv = per_timestep_advantages(rewards, 50)
    assert (adv[0] == 5.0).all()
    torch.testing.assert_close(adv[1:], torch.full((49, 2), -0.02 / (0.14 + 1e-4)), atol=1e-5, rtol=0)
    assert (per_timestep_advantages(-rewards, 50)[0] == -5.0).all()
    assert per_timestep_advantages(rewards, 50, clip=10.0)[0, 0] > 6.9


def test_flow_grpo_advantages_are_the_group_normalized_outcome_on_every_step():
    R, _ = random_batch(5, levels=4)
    W = R.shape[1] - 1
    adv = flow_grpo_advantages(R[:, -1], G, W)
    assert adv.shape == (R.shape[0], W)
    expected = oracle_advantages(R[:, -1:], G).expand(-1, W)
    torch.testing.assert_close(adv.double(), expected, atol=2e-5, rtol=1e-5)
    # ... which is what per-timestep normalization of the outcome reward copied to every step gives
    assert torch.equal(per_timestep_advantages(R[:, -1:].expand(-1, W), G), adv)


def test_advantage_errors():
    with pytest.raises(ValueError, match="G = 2 must be a positive integer dividing the 3 rows"):
        per_timestep_advantages(torch.zeros(3, 2), 2)
    with pytest.raises(ValueError, match="G = 0"):
        zero_std_fraction(torch.zeros(3, 2), 0)
    with pytest.raises(ValueError, match="clip must be > 0"):
        per_timestep_advantages(torch.zeros(3, 2), 3, clip=0)
    with pytest.raises(ValueError, match="float"):
        per_timestep_advantages(torch.zeros(3, 2, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="NaN"):
        per_timestep_advantages(T([[float("nan")]]), 1)


# ------------------------------------------------------------------------------------------------ loss


def loss_inputs(n=4, shape=(2, 3, 3), seed=0):
    gen = torch.Generator().manual_seed(seed)
    mean = torch.randn(n, *shape, generator=gen)  # (n, C, h, w)
    ref = mean + 0.1 * torch.randn(n, *shape, generator=gen)  # (n, C, h, w)
    return mean, ref


def test_loss_matches_hand_computation():
    # clip eps = 0.2; ratios e^0.1 (inside), e^-0.3 (below), 1, e^0.4 (above, both advantage signs).
    dlogp = [0.1, -0.3, 0.0, 0.4, 0.4]
    adv = [1.0, 1.0, -2.0, 1.0, -1.0]
    logp_old = T([-1.0, -2.0, 0.5, 0.0, 3.0])
    logp = logp_old + T(dlogp)
    n = len(dlogp)
    mean = torch.zeros(n, 1, 1, 2)
    mean[:, 0, 0, 0] = T([0.1, 0.2, 0.0, -0.3, 0.5])
    ref = torch.zeros(n, 1, 1, 2)
    std_kl = T([0.5, 1.0, 2.0, 0.25, 0.0])
    loss, stats = grpo_loss(logp, logp_old, T(adv), mean=mean, ref_mean=ref, std_kl=std_kl, clip_range=0.2, beta=0.1)

    rho = [math.exp(x) for x in dlogp]
    per = [max(-a * r, -a * min(max(r, 0.8), 1.2)) for a, r in zip(adv, rho)]
    # = [-e^0.1, -e^-0.3, 2, -1.2, e^0.4]
    assert per[1] == -math.exp(-0.3) and per[3] == -1.2 and per[4] == math.exp(0.4)
    policy = sum(per) / n
    # KL: mean over the 2 latent entries of diff^2, over 2 std^2; std 0 -> no KL.
    kls = [0.1**2 / 2 / (2 * 0.25), 0.2**2 / 2 / 2, 0.0, 0.3**2 / 2 / (2 * 0.0625), 0.0]
    kl = sum(kls) / n
    assert loss.item() == pytest.approx(policy + 0.1 * kl, rel=1e-6)
    assert stats["policy_loss"].item() == pytest.approx(policy, rel=1e-6)
    assert stats["kl"].item() == pytest.approx(kl, rel=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(3 / 5)  # e^-0.3 and e^0.4 twice leave [0.8, 1.2]
    assert stats["approx_kl"].item() == pytest.approx(0.5 * sum(x * x for x in dlogp) / n, rel=1e-6)
    assert stats["ratio_mean"].item() == pytest.approx(sum(rho) / n, rel=1e-6)
    assert stats["ratio_min"].item() == pytest.approx(math.exp(-0.3), rel=1e-6)
    assert stats["ratio_max"].item() == pytest.approx(math.exp(0.4), rel=1e-6)
    assert all(v.dim() == 0 and not v.requires_grad and v.dtype == torch.float32 for v in stats.values())


def test_mask_equals_a_naive_loss_over_the_kept_rows_only():
    n, eps, beta = 7, 0.2, 0.3
    gen = torch.Generator().manual_seed(5)
    logp_old = torch.randn(n, generator=gen)
    logp = (logp_old + 0.3 * torch.randn(n, generator=gen)).requires_grad_(True)
    adv = torch.randn(n, generator=gen)
    std_kl = torch.rand(n, generator=gen) + 0.5
    mean, ref = loss_inputs(n)
    mean.requires_grad_(True)
    keep = T([True, False, True, True, False, False, True])
    loss, stats = grpo_loss(logp, logp_old, adv, mean=mean, ref_mean=ref, std_kl=std_kl, clip_range=eps, beta=beta,
                            mask=keep)
    loss.backward()
    # the oracle: drop the rows, then the plain formulas on the 4 that are left (as Flow-GRPO's filter does)
    k = keep.nonzero().flatten().tolist()
    rho = [math.exp(logp[i].item() - logp_old[i].item()) for i in k]
    per = [max(-adv[i].item() * r, -adv[i].item() * min(max(r, 1 - eps), 1 + eps)) for i, r in zip(k, rho)]
    kls = [(mean[i] - ref[i]).square().mean().item() / (2 * std_kl[i].item() ** 2) for i in k]
    assert loss.item() == pytest.approx(sum(per) / 4 + beta * sum(kls) / 4, rel=1e-5)
    assert stats["policy_loss"].item() == pytest.approx(sum(per) / 4, rel=1e-5)
    assert stats["kl"].item() == pytest.approx(sum(kls) / 4, rel=1e-5)
    assert stats["ratio_mean"].item() == pytest.approx(sum(rho) / 4, rel=1e-5)
    assert stats["ratio_min"].item() == pytest.approx(min(rho), rel=1e-6)
    assert stats["ratio_max"].item() == pytest.approx(max(rho), rel=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(sum(abs(r - 1) > eps for r in rho) / 4)
    # gradients: the dropped rows get none, the kept ones what the 4-row batch alone gives them
    sub_logp, sub_mean = logp.detach()[k].requires_grad_(True), mean.detach()[k].requires_grad_(True)
    sub, _ = grpo_loss(sub_logp, logp_old[k], adv[k], mean=sub_mean, ref_mean=ref[k], std_kl=std_kl[k], clip_range=eps,
                       beta=beta)
    sub.backward()
    assert (logp.grad[~keep] == 0).all() and (mean.grad[~keep] == 0).all()
    torch.testing.assert_close(logp.grad[k], sub_logp.grad, rtol=1e-6, atol=0)
    torch.testing.assert_close(mean.grad[k], sub_mean.grad, rtol=1e-6, atol=0)


def test_all_true_mask_is_no_mask_and_an_empty_mask_still_back_propagates():
    n = 5
    gen = torch.Generator().manual_seed(1)
    logp_old, adv = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    mean, ref = loss_inputs(n)
    args = dict(mean=mean, ref_mean=ref, std_kl=torch.ones(n), clip_range=1e-5, beta=1e-4)
    plain, plain_stats = grpo_loss(logp_old + 1e-6, logp_old, adv, **args)
    masked, masked_stats = grpo_loss(logp_old + 1e-6, logp_old, adv, **args, mask=torch.ones(n, dtype=torch.bool))
    assert torch.equal(plain, masked) and all(torch.equal(plain_stats[k], masked_stats[k]) for k in plain_stats)
    logp = logp_old.clone().requires_grad_(True)
    loss, stats = grpo_loss(logp, logp_old, adv, **args, mask=torch.zeros(n, dtype=torch.bool))
    loss.backward()  # a process whose micro-batch was all dropped still runs its backward pass (DDP)
    assert loss.item() == 0.0 and logp.grad is not None and (logp.grad == 0).all()
    assert all(v.item() == 0.0 for v in stats.values())
    with pytest.raises(ValueError, match="mask must be"):
        grpo_loss(logp_old, logp_old, adv, **args, mask=torch.ones(n))


def test_gradient_is_zero_where_clipped_on_the_side_of_the_advantage():
    eps = 1e-5  # the SD3.5-M ratio clip (docs/method.md, 'SD3.5-Medium hyperparameters')
    # rows: A > 0 above 1+eps (clipped), A < 0 below 1-eps (clipped), A > 0 below (free), A < 0 above (free)
    adv = T([1.0, -1.0, 2.0, -3.0])
    logp_old = torch.zeros(4)
    logp = T([0.01, -0.01, -0.01, 0.01], requires_grad=True)
    mean, _ = loss_inputs()
    loss, stats = grpo_loss(logp, logp_old, adv, mean=mean, ref_mean=None, std_kl=torch.ones(4), clip_range=eps,
                            beta=0.0)
    loss.backward()
    assert logp.grad[:2].tolist() == [0.0, 0.0]
    rho = torch.exp(logp.detach())
    torch.testing.assert_close(logp.grad[2:], (-adv * rho / 4)[2:])  # d(-A rho)/dlogp = -A rho, mean over 4
    assert stats["clip_frac"].item() == 1.0


def test_ratio_one_and_zero_advantage_give_zero_policy_loss():
    logp = torch.randn(6, generator=torch.Generator().manual_seed(2))
    mean, ref = loss_inputs(6)
    loss, stats = grpo_loss(logp, logp.clone(), torch.zeros(6), mean=mean, ref_mean=ref, std_kl=torch.ones(6),
                            clip_range=1e-5, beta=0.0)
    assert loss.item() == 0.0 and stats["policy_loss"].item() == 0.0
    assert stats["ratio_min"].item() == stats["ratio_max"].item() == 1.0 and stats["clip_frac"].item() == 0.0
    assert stats["kl"].item() > 0  # KL is still reported with beta = 0 when ref_mean is given


def test_kl_zero_when_policy_equals_reference():
    mean, _ = loss_inputs()
    loss, stats = grpo_loss(torch.zeros(4), torch.zeros(4), torch.ones(4), mean=mean, ref_mean=mean.clone(),
                            std_kl=torch.ones(4), clip_range=1e-5, beta=1.0)
    assert stats["kl"].item() == 0.0 and loss.item() == pytest.approx(-1.0)


def test_kl_relation_to_the_exact_gaussian_kl():
    mean, ref = loss_inputs(n=3)
    D = mean[0].numel()
    zeros = torch.zeros(3)
    # "cps": std_kl = s, the exact step std -> our KL = exact KL / D
    s = T([0.3, 0.7, 1.1])
    _, stats = grpo_loss(zeros, zeros, zeros, mean=mean, ref_mean=ref, std_kl=s, clip_range=1e-5, beta=1.0)
    exact = kl_divergence(Normal(mean, s.view(3, 1, 1, 1)), Normal(ref, s.view(3, 1, 1, 1))).flatten(1).sum(1)
    assert stats["kl"].item() == pytest.approx((exact / D).mean().item(), rel=1e-5)
    # "sde": step std = std * sqrt(-dt), std_kl = std -> our KL = exact KL * |dt| / D
    dt = T([-0.1, -0.05, -0.2])
    step_std = (s * (-dt).sqrt()).view(3, 1, 1, 1)
    exact = kl_divergence(Normal(mean, step_std), Normal(ref, step_std)).flatten(1).sum(1)
    assert stats["kl"].item() == pytest.approx((exact * -dt / D).mean().item(), rel=1e-5)


def test_zero_kl_std_gives_no_nan_in_value_or_gradient():
    mean, ref = loss_inputs()
    mean.requires_grad_(True)
    logp = torch.zeros(4, requires_grad=True)
    std_kl = T([0.5, 0.0, 1.0, 0.0])
    loss, stats = grpo_loss(logp, torch.zeros(4), T([1.0, -1.0, 0.5, 2.0]), mean=mean, ref_mean=ref, std_kl=std_kl,
                            clip_range=1e-5, beta=1.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(mean.grad).all() and torch.isfinite(logp.grad).all()
    assert (mean.grad[[1, 3]] == 0).all() and (mean.grad[[0, 2]] != 0).all()
    # The std-0 samples add nothing: KL equals that of the other two, averaged over all four.
    sq = (mean.detach() - ref).square().flatten(1).mean(1)
    expected = (sq[0] / (2 * 0.25) + sq[2] / 2) / 4
    assert stats["kl"].item() == pytest.approx(expected.item(), rel=1e-6)
    # All steps deterministic: KL term is exactly 0, still no NaN.
    mean.grad = None
    loss, stats = grpo_loss(logp, torch.zeros(4), torch.zeros(4), mean=mean, ref_mean=ref, std_kl=torch.zeros(4),
                            clip_range=1e-5, beta=1.0)
    loss.backward()
    assert stats["kl"].item() == 0.0 and (mean.grad == 0).all()


def test_reference_is_a_constant():
    mean, ref = loss_inputs()
    ref.requires_grad_(True)
    loss, _ = grpo_loss(torch.zeros(4), torch.zeros(4), torch.zeros(4), mean=mean, ref_mean=ref, std_kl=torch.ones(4),
                        clip_range=1e-5, beta=1.0)
    assert not loss.requires_grad  # nothing flows into the reference policy


def test_loss_errors():
    mean, _ = loss_inputs()
    z = torch.zeros(4)
    with pytest.raises(ValueError, match="needs ref_mean"):
        grpo_loss(z, z, z, mean=mean, ref_mean=None, std_kl=z, clip_range=1e-5, beta=1e-4)
    with pytest.raises(ValueError, match="log_weight_old must be a"):
        grpo_loss(z, torch.zeros(3), z, mean=mean, ref_mean=None, std_kl=z, clip_range=1e-5, beta=0.0)
    with pytest.raises(ValueError, match="mean must be"):
        grpo_loss(z, z, z, mean=mean[:3], ref_mean=None, std_kl=z, clip_range=1e-5, beta=0.0)
    with pytest.raises(ValueError, match="ref_mean must have"):
        grpo_loss(z, z, z, mean=mean, ref_mean=mean[:, :1], std_kl=z, clip_range=1e-5, beta=0.0)
    with pytest.raises(ValueError, match="clip_range"):
        grpo_loss(z, z, z, mean=mean, ref_mean=None, std_kl=z, clip_range=0.0, beta=0.0)
