"""GRPO for flow models: per-timestep group-normalized advantages and the clipped surrogate loss with KL.

Paper (arXiv 2602.06422): Sec. 4.3, per-timestep advantages from step-wise rewards; Flow-GRPO (arXiv 2505.05470):
the group-normalized outcome advantage and the PPO-style clipped objective with a KL penalty to the reference
policy. The formulas, in our words: docs/method.md, 'The KL to the reference policy', 'Per-timestep advantages' and
'The clipped loss'.

Shape legend: B prompts, G group size, N = B*G trajectories (all processes gathered), W window steps,
n samples of one micro-batch, C/h/w latent channels/height/width (docs/method.md, 'Notation').
  rewards, advantages (N, W) in B groups of G consecutive rows (train.assign_credit: trajectory j is member
  j % G of group j // G; turning_points.py takes its groups the same way), viewed as (B, G, W)
  grpo_loss: log_weight, log_weight_old, advantages, std_kl (n,) for one window step; mean, ref_mean (n, C, h, w)

Run: pure tensor functions (any device; float32 or float64 kept as given); tested by
`python -m pytest tests/test_grpo.py`. train.py calls `per_timestep_advantages` (TP-GRPO and the incremental
ablation) or `flow_grpo_advantages` (baseline), then `grpo_loss` once per window step and micro-batch. The checks
of the arguments sit at the end of the file.
"""

import torch

EPS_STD = 1e-4  # Sec. 4.3 (docs/method.md, 'Per-timestep advantages'): A = (r - mean) / (std + 1e-4)


def group_stats(x, G):
    """x (N, W) in groups of G consecutive rows -> per group and column: mean, population std and "all members
    equal", each (B, 1, W), ready to broadcast against x.view(B, G, W)."""
    members = x.view(-1, G, x.shape[1])  # (B, G, W)
    # mean_g = (1/G) sum of the G members, added member after member: one summation order, the same whatever the
    # batch's layout in memory (torch's .sum(1) may pair the terms differently for other shapes, and move the last bit)
    mean = sum(members.unbind(1))[:, None] / G  # (B, 1, W)
    # population std (ddof = 0: divide by G, not G - 1), in two passes (centred first) for accuracy
    std = (sum((members - mean).square().unbind(1))[:, None] / G).sqrt()  # (B, 1, W)
    constant = members.amin(1, keepdim=True) == members.amax(1, keepdim=True)  # (B, 1, W)
    return mean, std, constant


def per_timestep_advantages(rewards, G, clip=5.0):
    """A (N, W): each window step normalized separately within each prompt group of G consecutive rows, then
    clipped to +-clip. rewards (N, W), or (N,) for one step."""
    rewards = _check_values(rewards, "rewards")
    _check_clip(clip)
    _check_group_size(G, rewards.shape[0])
    x = rewards if rewards.dim() == 2 else rewards[:, None]  # (N, W)
    mean, std, constant = group_stats(x, G)  # (B, 1, W) each
    members = x.view(-1, G, x.shape[1])  # (B, G, W)
    # Sec. 4.3: A_{i,k} = (r_{i,k} - mean_g r_{.,k}) / (std_g r_{.,k} + 1e-4), population std over the group
    adv = (members - mean) / (std + EPS_STD)  # (B, G, W)
    # A group whose members all got the same reward carries no signal: exactly 0 (the float mean of equal
    # values can miss them by an ulp, e.g. three float32 0.9s, which would leave an advantage of ~6e-4).
    adv = torch.where(constant, torch.zeros_like(adv), adv).clamp(-clip, clip).view_as(x)  # (N, W)
    return adv if rewards.dim() == 2 else adv[:, 0]


def flow_grpo_advantages(r_sde, G, num_steps, clip=5.0):
    """Flow-GRPO baseline, (N, num_steps): one group normalization of R_sde (N,), copied to every window step."""
    _check_outcome(r_sde, num_steps)
    # A_{i,k} = (R_sde_i - mean_g R_sde) / (std_g R_sde + 1e-4) at every window step k
    adv = per_timestep_advantages(r_sde, G, clip)  # (N,)
    return adv[:, None].expand(-1, num_steps).clone()  # (N, W)


def zero_std_fraction(values, G):
    """Fraction of (group, column) cells whose members all have the same value; values (N,) or (N, W) in groups of
    G consecutive rows. A logged diagnostic (docs/method.md, 'The clipped loss')."""
    values = _check_values(values, "values")
    _check_group_size(G, values.shape[0])
    x = values if values.dim() == 2 else values[:, None]  # (N, W)
    return group_stats(x, G)[2].float().mean()


def grpo_loss(log_weight, log_weight_old, advantages, *, mean, ref_mean, std_kl, clip_range, beta, mask=None):
    """Flow-GRPO's clipped surrogate plus KL for one window step of a micro-batch (docs/method.md, 'The clipped
    loss'). Returns (loss, stats).

    log_weight: the step's log-weight (sampler.StepOut: log p(x' | x) for "sde", the demo code's stand-in for "cps")
    of the stored x' under the current policy (n,), with grad; log_weight_old: the same at sampling time (n,);
    advantages (n,); mean: the policy's step mean (n, C, h, w), with grad; ref_mean: the reference policy's mean
    (n, C, h, w), or None when beta = 0; std_kl (n,): the std the KL divides by (`kl_to_reference`). clip_range: the
    ratio clip eps; beta: the KL weight (docs/method.md, 'SD3.5-Medium hyperparameters'). mask (n,) bool, or None for
    all rows: the rows that count (Flow-GRPO's zero-advantage filter, which train.py applies as a mask instead of
    re-batching; docs/deviations.md, 'Zero-advantage samples'). The loss and every statistic are means over them
    alone; a micro-batch with no such row gives loss 0, still connected to the graph so that its backward pass runs.
    stats: `loss_stats`.
    """
    _check_loss_inputs(log_weight, log_weight_old, advantages, mean=mean, ref_mean=ref_mean, std_kl=std_kl,
                       clip_range=clip_range, beta=beta, mask=mask)
    # rho = exp(log w_theta(x' | x) - log w_old(x' | x)), log w = log pi for "sde"
    ratio = torch.exp(log_weight - log_weight_old)  # (n,)
    # L = max(-A rho, -A clip(rho, 1 - eps, 1 + eps)): the pessimistic branch, so once the ratio has left the trust
    # region in the direction the advantage pushes, the gradient is 0
    unclipped = -advantages * ratio  # (n,)
    clipped = -advantages * ratio.clamp(1 - clip_range, 1 + clip_range)  # (n,)
    policy_loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    kl = torch.zeros_like(std_kl) if ref_mean is None else kl_to_reference(mean, ref_mean, std_kl)  # (n,)
    # total = mean(L) + beta * mean(KL)
    loss = policy_loss + beta * masked_mean(kl, mask) if beta != 0 else policy_loss
    return loss, loss_stats(ratio, log_weight, log_weight_old, kl, policy_loss, clip_range=clip_range, mask=mask)


def kl_to_reference(mean, ref_mean, std_kl):
    """KL (n,) between the policy's step and the reference policy's (docs/method.md, 'The KL to the reference
    policy': how this relates to the exact Gaussian KL for each sampler). A step with std_kl = 0 (deterministic,
    e.g. sigma' = 0) has no KL: 0, with no NaN in value or gradient."""
    # KL = mean over non-batch dims of (mean_theta - mean_ref)^2 / (2 std_kl^2)
    sq = (mean - ref_mean.detach()).square().flatten(1).mean(1)  # (n,)
    denom = 2 * std_kl.square()  # (n,)
    # a safe denominator keeps 0/0 and its gradient out of the graph: where() back-propagates into both branches
    valid = denom > 0  # (n,)
    return torch.where(valid, sq / torch.where(valid, denom, torch.ones_like(denom)), torch.zeros_like(sq))  # (n,)


def masked_mean(x, mask):
    """The mean of x (n,) over the rows where mask (n,) bool is True (all rows when mask is None): the
    zero-advantage rows left out as if they were not in the micro-batch. All-True gives exactly x.mean(); no True
    row gives 0."""
    if mask is None:
        return x.mean()
    weight = mask.to(x.dtype)  # (n,) 1 for a counted row
    # sum(x m) / max(sum(m), 1)
    return (x * weight).sum() / weight.sum().clamp_min(1)


@torch.no_grad()
def loss_stats(ratio, log_weight, log_weight_old, kl, policy_loss, *, clip_range, mask):
    """The logged statistics of one step's loss (docs/metrics.md), means over the counted rows: clip_frac,
    approx_kl, kl, policy_loss, ratio_mean, ratio_min, ratio_max (detached float32 scalars)."""
    counted = torch.ones_like(ratio, dtype=torch.bool) if mask is None else mask  # (n,)
    any_row = counted.any()
    stats = {
        "clip_frac": masked_mean(((ratio - 1).abs() > clip_range).to(ratio.dtype), mask),
        # approx KL(old || new) to second order: 0.5 E[(log w - log w_old)^2]
        "approx_kl": 0.5 * masked_mean((log_weight - log_weight_old).square(), mask),
        "kl": masked_mean(kl, mask),
        "policy_loss": policy_loss,
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_min": torch.where(any_row, torch.where(counted, ratio, torch.inf).min(), 0.0),
        "ratio_max": torch.where(any_row, torch.where(counted, ratio, -torch.inf).max(), 0.0),
    }
    return {name: v.detach().float() for name, v in stats.items()}


# ----------------------------------------------------------------------------------------------------------------
# Checks of the arguments: one line naming what does not fit
# ----------------------------------------------------------------------------------------------------------------


def _check_values(x, name):
    """Validate a (N,) or (N, W) float tensor; float16/bfloat16 are upcast to float32."""
    if not isinstance(x, torch.Tensor) or x.dim() not in (1, 2) or x.shape[0] == 0:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a non-empty (N,) or (N, W) tensor, got {shape}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a float tensor, got {x.dtype}; convert it with .float()")
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()  # half precision rounds small reward differences away
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf; check the rewards")
    return x


def _check_group_size(G, n):
    if not isinstance(G, int) or G < 1 or n % G:
        raise ValueError(f"the group size G = {G!r} must be a positive integer dividing the {n} rows (groups of G "
                         f"consecutive rows)")


def _check_clip(clip):
    if not clip > 0:
        raise ValueError(f"clip must be > 0 (advantages are clipped to [-clip, clip]), got {clip}")


def _check_outcome(r_sde, num_steps):
    if not isinstance(r_sde, torch.Tensor) or r_sde.dim() != 1 or num_steps < 1:
        shape = tuple(r_sde.shape) if isinstance(r_sde, torch.Tensor) else type(r_sde).__name__
        raise ValueError(f"r_sde must be (N,) and num_steps >= 1, got {shape} and {num_steps}")


def _check_loss_inputs(log_weight, log_weight_old, advantages, *, mean, ref_mean, std_kl, clip_range, beta, mask):
    """One line naming the first argument of grpo_loss that does not fit (shapes, the KL's reference, the clip)."""
    n = log_weight.shape[0] if isinstance(log_weight, torch.Tensor) and log_weight.dim() == 1 else None
    for name, x in (("log_weight", log_weight), ("log_weight_old", log_weight_old), ("advantages", advantages),
                    ("std_kl", std_kl)):
        if n is None or not isinstance(x, torch.Tensor) or tuple(x.shape) != (n,):
            raise ValueError(f"{name} must be a (n,) tensor like log_weight, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if mean.dim() < 2 or mean.shape[0] != n:
        raise ValueError(f"mean must be (n, C, H, W) with n = {n}, got {tuple(mean.shape)}")
    if ref_mean is not None and ref_mean.shape != mean.shape:
        raise ValueError(f"ref_mean must have the shape of mean {tuple(mean.shape)}, got {tuple(ref_mean.shape)}")
    if beta != 0 and ref_mean is None:
        raise ValueError(f"beta = {beta} needs ref_mean (the reference policy's step mean); pass it or set beta = 0")
    if not clip_range > 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != (n,)):
        raise ValueError(f"mask must be a (n,) bool tensor with n = {n} (True: the row counts), or None")
