"""lab/judge.py: the agreement statistics against hand computation, and the SDE-continuation truth against the ODE judge
where they must coincide (noise level a = 0: every continuation is the ODE itself), on the shipped toy model."""

import torch

import models
import turning_points as tp
from lab import judge


def test_agreement_against_hand_computation():
    truth = torch.tensor([[0.0, 0.5, 0.4, 1.0], [0.2, 0.1, 0.3, 0.3]])  # (n=2, W+1=4)
    R = torch.tensor([[0.2, 0.4, 0.6, 1.0], [0.2, 0.3, 0.1, 0.3]])
    out = judge.agreement(R, truth)
    torch.testing.assert_close(torch.tensor(out["bias"]), torch.tensor([0.1, 0.05, 0.0, 0.0]))
    torch.testing.assert_close(torch.tensor(out["rmse"]), torch.tensor([0.02, 0.025, 0.04, 0.0]).sqrt())
    # d: truth [+.5, -.1, +.6], [-.1, +.2, 0]; R [+.2, +.2, +.4], [+.1, -.2, +.2]: signs agree 1/2, 0/2, 1/2
    torch.testing.assert_close(torch.tensor(out["d_sign_agree"]), torch.tensor([0.5, 0.0, 0.5]))
    assert out["d_zero"] == 0 and out["d_sign_agree_moved"] == 2 / 6
    # a tie (the judge's d_1 = 0 in the first row) disagrees in sign with any moving truth, and is set apart
    tied = judge.agreement(torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 1.0]]),
                           torch.tensor([[0.0, 0.3, 1.0], [0.0, 0.4, 1.0]]))
    assert tied["d_zero"] == 0.25 and tied["d_sign_agree"] == [0.5, 1.0] and tied["d_sign_agree_moved"] == 1.0
    found, real = tp.detect_turning_points(R, "strict"), tp.detect_turning_points(truth, "strict")
    hits = (found & real).sum().item()
    assert out["tp_precision"] == hits / max(found.sum().item(), 1)
    assert out["tp_recall"] == hits / max(real.sum().item(), 1)


def test_without_noise_the_sde_continuations_are_the_ode_judge():
    cfg, pipe, reward_fn, _ = judge.toy_setup()
    ro, cond, R_ode, reward, group = judge.toy_trajectories(pipe, cfg, reward_fn, 2, 0.0, seed=3, captions=6)
    mean, sd = judge.sde_continuations(pipe, ro, cond, cfg, 0.0, 2, 4, reward)  # (n, W+1) each
    assert mean.shape == R_ode.shape == (12, cfg.window + 1) and group.tolist() == [g // 2 for g in range(12)]
    torch.testing.assert_close(mean, R_ode, rtol=0, atol=1e-6)
    assert sd.abs().max() < 1e-6


def test_bootstrap_agreement_against_the_naive_loop():
    # three captions of two trajectories; each draw is recomputed by concatenating the drawn captions' rows
    g = torch.Generator().manual_seed(1)
    R, truth = torch.rand(6, 4, generator=g), torch.rand(6, 4, generator=g)  # (n=6, W+1=4)
    group = torch.arange(6) // 2
    draws = torch.tensor([[0, 1, 2], [2, 2, 0], [1, 1, 1], [0, 0, 2]])  # (B=4, c=3)
    bias, corr = judge.bootstrap_agreement(R, truth, group, draws)
    for b, picked in enumerate(draws):
        rows = torch.cat([torch.nonzero(group == c)[:, 0] for c in picked])
        naive = judge.agreement(R[rows], truth[rows])
        torch.testing.assert_close(bias[b], torch.tensor(naive["bias"]))
        torch.testing.assert_close(corr[b], torch.tensor(naive["corr"]))
    # the identity draw gives the full sample's numbers
    full = judge.agreement(R, truth)
    torch.testing.assert_close(corr[0], torch.tensor(full["corr"]))


def test_a_measurement_under_another_reward_is_filed_under_its_name():
    assert judge.measure_name("toy:1") == "judge"  # the programmatic reward's files keep their names
    assert judge.measure_name("toyscore:1") == judge.measure_name("toyscore:1,toy:0") == "judge_toyscore"


def test_the_x0_judge_is_the_models_own_clean_image_prediction(tmp_path):
    cfg, pipe, reward_fn, _ = judge.toy_setup()
    ro, cond, R_ode, reward, _ = judge.toy_trajectories(pipe, cfg, reward_fn, 2, 0.7, seed=3, captions=4)
    # by hand: x0_hat = s_k - sigma_k v(s_k), scored; the last state's judge is the trajectory's own final reward
    by_hand = []
    for k in range(cfg.window):
        i = ro.w0 + k
        v = models.velocity(pipe.transformer, ro.states[:, k], ro.timesteps[i].expand(8), cond, cfg.guidance)
        by_hand.append(reward(ro.states[:, k] - ro.sigmas[i] * v))  # (n,)
    by_hand = torch.stack(by_hand + [reward(ro.final)], 1)  # (n, W+1)
    torch.testing.assert_close(judge.judge_rewards(pipe, ro, cond, cfg, reward, "x0"), by_hand, rtol=0, atol=1e-6)
    # the full ODE judge, one state at a time, is the wavefront's (up to float rounding of the batched calls)
    torch.testing.assert_close(judge.judge_rewards(pipe, ro, cond, cfg, reward, "ode"), R_ode, rtol=0, atol=1e-4)
    # the report: one row per judge, each a correlation per window state with its resampled SE
    n, W = 8, cfg.window
    out = {"settings": {"prompts": 4, "members": 2, "continuations": 2, "steps": cfg.steps, "window": W,
                        "sampler": cfg.sampler, "noise_level": 0.7, "seed": 3},
           "R_sde_mean": R_ode.tolist(), "mc_se": [0.0] * (W + 1),
           "judges": {"ode": {"R": R_ode.tolist(), **judge.agreement(R_ode, R_ode)},
                      "x0": {"R": by_hand.tolist(), **judge.agreement(by_hand, R_ode)}}}
    judge.report_truth([out], str(tmp_path))
    text = (tmp_path / "judges_truth.md").read_text().splitlines()
    rows = text[4:6]
    assert [r.split(" | ")[0] for r in rows] == ["| ode", "| x0"] and rows[0].split(" | ")[1].startswith("1.00 +- 0.00")
    # x0 - ode, paired over the same draws of captions: the ODE judge is the truth here, so x0 trails it at s_0
    diff = [line for line in text if line.startswith("| x0 |")][-1].split(" | ")[1]  # the differences' row
    x0_corr = judge.agreement(by_hand, R_ode)["corr"][0]  # the ODE judge's own is 1
    assert diff.startswith(f"{x0_corr - 1:+.2f} +- ") and x0_corr < 1


def test_the_mc_judge_approaches_the_laboratorys_truth_as_its_continuations_grow():
    # the mc:M judge and the laboratory's truth are the same estimator (sampler.continue_naive) with other seeds: with
    # M = 16 each they agree on average within their Monte-Carlo error, and much closer than a single continuation
    cfg, pipe, reward_fn, _ = judge.toy_setup()
    ro, cond, _, reward, _ = judge.toy_trajectories(pipe, cfg, reward_fn, 2, 0.7, seed=5, captions=2)
    truth, sd = judge.sde_continuations(pipe, ro, cond, cfg, 0.7, 16, 6, reward)  # (n, W+1) each
    R, one = (judge.judge_rewards(pipe, ro, cond, cfg, reward, spec, seed=5, members=2) for spec in ("mc:16", "mc:1"))
    assert torch.equal(R[:, -1], truth[:, -1])  # s_W: the trajectory's own image in both
    d = (R - truth)[:, :-1]  # (n, W) the window states with continuations
    # the mean difference over the n x W states, against its SE: two independent means of 16 per state
    se = (2 * sd[:, :-1].square() / 16).mean().div(d.numel()).sqrt()
    assert d.mean().abs() <= 4 * se, (d.mean(), se)
    assert d.abs().mean() < 0.5 * (one - truth)[:, :-1].abs().mean()
