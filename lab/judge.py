"""Judges of intermediate states, on the shipped toy checkpoint (toyworld.py, toymodel.py). TP-GRPO scores a window
state s_k by the reward of its ODE completion, R_k = R(ODE-complete(s_k)) (paper Sec. 4.1). The paper's premise is
that this predicts the average outcome of the stochastic sampler from s_k, and that turning points (Sec. 4.2) catch
what it misses: how a state interacts with the noise of the later steps. This file measures that premise and
draws what the judge sees.

  python -m lab.judge measure    # ODE judge vs the mean of M SDE continuations, per window step and noise level a:
                                 # lab/results/judge/ode_vs_sde.json, lab/reports/{judge.md, judge.png}
  python -m lab.judge measure --rewards toyscore:1 --noise 0.7   # the same under the learned ToyScore
                                 # (lab/toyscore.py): ode_vs_sde_toyscore.json, judge_toyscore.{md,png}
  python -m lab.judge truth --members 4 --seed 1 2 3   # every judge (ode, ode:K, x0, mc:M) against the same
                                 # SDE truth at a = 0.7, one judges_vs_sde_4x_seed<S>.json per seed in
                                 # lab/results/judge, lab/reports/judges_truth.md (differences between judges too)
  python -m lab.judge fidelity   # the cheaper judges (--completion ode:K, x0) against the full ODE judge:
                                 # lab/results/judge/fidelity.json, lab/reports/fidelity.md (--report: only that)
  python -m lab.judge figures    # docs/turning_points.png and docs/filmstrip.png (the README's pictures)

Shape legend: n trajectories, G group members, M continuations per state, W window steps, R (n, W+1) a judge's
rewards of the window states s_0..s_W, C/h/w the toy model's latent channels/height/width, which are its pixels
(it works in pixel space): images (., 3, h, w).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch
from matplotlib.figure import Figure

import config
import grpo
import models
import rewards
import sampler as S
import toyworld
import turning_points as tp


LAB = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(LAB)


def toy_setup(reward: str = "toy:1"):
    """The tiny preset's config, the shipped checkpoint, a reward ('name:w,...', the preset's by default) and grid."""
    cfg = config.Config(**dict(config.PRESETS["tiny"], task="tiny"))
    pipe = models.load_pipeline(cfg.model)
    return cfg, pipe, rewards.load_rewards(config.parse_weights(reward)), models.sigma_grid(pipe.scheduler, cfg.steps)


def measure_name(reward: str) -> str:
    """Files of a measurement under a reward: 'judge' (the programmatic toy:1), else 'judge_<its rewards>'."""
    trained = [k for k, w in config.parse_weights(reward).items() if w]
    return "judge" if reward == "toy:1" else "judge_" + "_".join(trained)


def reward_of(pipe, reward_fn, latents, prompts, metas) -> torch.Tensor:
    """Decode and score latents (m, C, h, w) in batches of 256: (m,)."""
    out = []
    for a in range(0, latents.shape[0], 256):
        images = models.decode(pipe, latents[a:a + 256])  # (b, 3, h, w)
        out.append(reward_fn(images, prompts[a:a + 256], metas[a:a + 256])[0])
    return torch.cat(out)


@torch.no_grad()
def sde_continuations(pipe, ro, cond, cfg, noise_level, M, seed, reward):
    """The truth the ODE judge stands in for: from each window state s_k (k < W), M continuations of the sampler
    itself (the rest of the window stochastic with fresh noise, then the ODE), scored. Returns the mean and the
    standard deviation over the M outcomes, (n, W+1) each; column W is the trajectory's own final reward (s_W has
    no stochastic step left: every continuation is the same)."""
    n, W = ro.states.shape[0], ro.window
    # the mc:M judge's plain loop (sampler.continue_naive), with the laboratory's own seeds: (seed, k, trajectory, m)
    generators = lambda k: S.make_generators([S.member_seed(seed, k, j, m) for m in range(M) for j in range(n)])  # noqa
    finals = S.continue_naive(pipe.transformer, ro.states, cond, generators, w0=ro.w0, sigmas=ro.sigmas,
                              timesteps=ro.timesteps, guidance_scale=cfg.guidance, noise_level=noise_level,
                              kind=cfg.sampler, continuations=M)  # (n, W*M, C, h, w)
    r = torch.stack([reward(finals[:, k * M:(k + 1) * M].transpose(0, 1).flatten(0, 1)).reshape(M, n).T
                     for k in range(W)], 1)  # (n, W, M)
    mean = torch.cat([r.mean(2), reward(ro.final)[:, None]], 1)  # (n, W+1)
    sd = torch.cat([r.std(2), torch.zeros(n, 1)], 1)  # (n, W+1)
    return mean, sd


def agreement(R: torch.Tensor, truth: torch.Tensor) -> dict:
    """How a judge's R (n, W+1) agrees with the truth's (n, W+1): per window state the bias (mean R - truth), the
    RMSE and the correlation over trajectories; per window step the share of d_k = R_k - R_{k-1} whose sign is
    the truth's, and, over all steps, the same share among the steps where the judge's d_k is not 0 (the toy
    reward is coarse: many completions score the same, d_k = 0, where a mean of continuations never is 0); and
    the strict turning points the judge finds against those the truth finds (precision, recall)."""
    W = R.shape[1] - 1
    d, d_true = tp.incremental_rewards(R), tp.incremental_rewards(truth)  # (n, W) each
    moved = d != 0  # (n, W)
    same = torch.sign(d) == torch.sign(d_true)  # (n, W)
    found, real = tp.detect_turning_points(R, "strict"), tp.detect_turning_points(truth, "strict")  # (n, W)
    return {"bias": (R - truth).mean(0).tolist(), "rmse": (R - truth).square().mean(0).sqrt().tolist(),
            "corr": [torch.corrcoef(torch.stack([R[:, k], truth[:, k]]))[0, 1].item() for k in range(W + 1)],
            "d_sign_agree": same.float().mean(0).tolist(), "d_zero": 1 - moved.float().mean().item(),
            "d_sign_agree_moved": (same & moved).sum().item() / max(moved.sum().item(), 1),
            "tp_precision": ((found & real).sum() / found.sum().clamp(min=1)).item(),
            "tp_recall": ((found & real).sum() / real.sum().clamp(min=1)).item(),
            "tp_rate": found.float().mean().item(), "tp_rate_truth": real.float().mean().item()}


def bootstrap_agreement(R: torch.Tensor, truth: torch.Tensor, group: torch.Tensor, draws: torch.Tensor):
    """The bias and the correlation of `agreement` recomputed on resampled captions: `draws` (B, c) picks c
    captions with replacement per sample (the unit is the caption, since its trajectories share a prompt), so a
    trajectory counts as often as its caption was drawn. Returns bias and correlation, (B, W+1) each; their
    standard deviation over B is the bootstrap standard error."""
    w = (draws[:, :, None] == group[None, None, :]).sum(1).float()  # (B, n): times each trajectory is drawn
    mean = lambda x: (w @ x) / w.sum(1, keepdim=True)  # noqa: E731  (n, W+1) -> (B, W+1) weighted means
    dR, dt = R[None] - mean(R)[:, None], truth[None] - mean(truth)[:, None]  # (B, n, W+1) each
    cov = lambda a, b: (w[:, :, None] * a * b).sum(1)  # noqa: E731  (B, n, W+1) x2 -> (B, W+1)
    # corr = cov(R, truth) / sqrt(var R * var truth), each weighted by the draws
    return mean(R - truth), cov(dR, dt) / (cov(dR, dR) * cov(dt, dt)).sqrt()


def toy_trajectories(pipe, cfg, reward_fn, members: int, noise_level: float, seed: int, captions: int = 48):
    """`members` trajectories of each of the first `captions` of the 48 training captions (the tiny preset's T and
    window) with the ODE judge of every window state: (rollout, conditioning, R_ode (n, W+1), reward: latents
    (m, ...) -> (m,), with m a multiple of n in trajectory order), and the group id of every trajectory (n,)."""
    metas = [m for m in toyworld.all_metadata()[:captions] for _ in range(members)]
    prompts = [toyworld.caption(m) for m in metas]  # (n,)
    cond = models.encode_prompts(pipe, prompts, cfg.guidance, cfg.max_sequence_length)
    gens = S.make_generators([S.member_seed(seed, 0, j // members, j % members) for j in range(len(prompts))])
    x_T = S.draw_noise(gens, models.latent_shape(pipe, cfg.resolution), "cpu")  # (n, C, h, w)
    sigmas, timesteps = models.sigma_grid(pipe.scheduler, cfg.steps)
    ro = S.wavefront_rollout(pipe.transformer, cond, x_T, gens, sigmas=sigmas, timesteps=timesteps, w0=0,
                             window=cfg.window, noise_level=noise_level, kind=cfg.sampler, guidance_scale=cfg.guidance)
    n = len(prompts)

    def reward(latents):  # latents in blocks of n, trajectory order inside each block
        reps = latents.shape[0] // n
        return reward_of(pipe, reward_fn, latents, prompts * reps, metas * reps)

    R_ode = reward(ro.completions.transpose(0, 1).flatten(0, 1)).reshape(cfg.window + 1, n).T  # (n, W+1)
    return ro, cond, R_ode, reward, torch.arange(n) // members


def measure(args) -> dict:
    """For each noise level a: `members` trajectories of each training caption, the ODE judge R_k of every window
    state, and the mean of M SDE continuations from it; their agreement (`agreement`) and the Monte-Carlo error of
    the truth itself (mean sd / sqrt(M))."""
    try:
        name = measure_name(args.rewards)
        path = os.path.join(args.results, "judge", "ode_vs_sde" + name.removeprefix("judge") + ".json")
        if args.report:
            return report_measure(json.load(open(path)), args.reports, name)
        cfg, pipe, reward_fn, _ = toy_setup(args.rewards)
    except (ValueError, OSError, rewards.RewardLoadError) as e:
        sys.exit(f"error: --rewards {args.rewards}: {e}")
    out = {"settings": {"prompts": 48, "members": args.members, "continuations": args.continuations,
                        "steps": cfg.steps, "window": cfg.window, "sampler": cfg.sampler, "seed": args.seed,
                        "rewards": args.rewards}, "levels": {}}
    M = args.continuations
    for a in args.noise:
        ro, cond, R_ode, reward, _ = toy_trajectories(pipe, cfg, reward_fn, args.members, a, args.seed)
        truth, sd = sde_continuations(pipe, ro, cond, cfg, a, M, args.seed + 1, reward)  # (n, W+1) each
        row = {**agreement(R_ode, truth), "mc_se": (sd / M**0.5).mean(0).tolist(), "R_ode": R_ode.tolist(),
               "R_sde_mean": truth.tolist()}
        out["levels"][f"{a:g}"] = row
        log_row(f"a={a:g}", row)
    write_json(out, path)
    report_measure(out, args.reports, name)
    return out


def judge_rewards(pipe, ro, cond, cfg, reward, spec: str, *, seed: int = 0, members: int = 1,
                  counter=None) -> torch.Tensor:
    """A judge's R (n, W+1) of the rollout's window states (--completion `spec`: ode, ode:K, x0, mc:M), each state
    finished one at a time (`sampler.complete_naive`, or for mc:M `sampler.continue_naive` with the training run's
    continuation seeds, trajectory j being member j % members of prompt j // members) and scored."""
    judge, n = S.parse_completion(spec), ro.states.shape[0]
    if judge.continuations:
        generators = S.continuation_generators(seed, 0, [(j // members, j % members) for j in range(n)],
                                               judge.continuations)
        done = S.continue_naive(pipe.transformer, ro.states, cond, generators, w0=ro.w0, sigmas=ro.sigmas,
                                timesteps=ro.timesteps, guidance_scale=cfg.guidance, noise_level=cfg.noise_level,
                                kind=cfg.sampler, continuations=judge.continuations, counter=counter)
        completions = torch.cat([done, ro.final[:, None]], 1)  # (n, W*M+1, C, h, w)
    else:
        completions = S.complete_naive(pipe.transformer, ro, cond, cfg.guidance, counter=counter,
                                       completion_steps=judge.steps)  # (n, W+1, C, h, w)
    scores = reward(completions.transpose(0, 1).flatten(0, 1)).reshape(completions.shape[1], n).T  # (n, W*M+1)
    return S.judge_rewards(scores, max(judge.continuations, 1))  # (n, W+1)


def truth(args) -> list[dict]:
    """Every judge's R_k (`judge_rewards`) against the stochastic truth (`measure`'s continuations) at one noise
    level, and its `agreement`: a result file per seed (judges_vs_sde_<members>x_seed<seed>.json), one report."""
    paths = [os.path.join(args.results, "judge", f"judges_vs_sde_{args.members}x_seed{seed}.json")
             for seed in args.seed]
    if args.report:
        return report_truth([json.load(open(p)) for p in paths], args.reports)
    cfg, pipe, reward_fn, _ = toy_setup()
    cfg = dataclasses.replace(cfg, noise_level=args.noise)  # the mc:M judges continue with the trajectories' a
    outs = []
    for seed, path in zip(args.seed, paths):
        ro, cond, _, reward, _ = toy_trajectories(pipe, cfg, reward_fn, args.members, args.noise, seed)
        mean, sd = sde_continuations(pipe, ro, cond, cfg, args.noise, args.continuations, seed + 1,
                                     reward)  # (n, W+1) each
        out = {"settings": {"prompts": 48, "members": args.members, "continuations": args.continuations,
                            "steps": cfg.steps, "window": cfg.window, "sampler": cfg.sampler,
                            "noise_level": args.noise, "seed": seed}, "R_sde_mean": mean.tolist(),
               "mc_se": (sd / args.continuations ** 0.5).mean(0).tolist(), "judges": {}}
        for spec in args.judges:
            R = judge_rewards(pipe, ro, cond, cfg, reward, spec, seed=seed, members=args.members)  # (n, W+1)
            out["judges"][spec] = {"R": R.tolist(), **agreement(R, mean)}
            log_row(spec, out["judges"][spec])
        write_json(out, path)
        outs.append(out)
    report_truth(outs, args.reports)
    return outs


def centred(R: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """R (n, W+1) less each caption's mean over its trajectories: what GRPO's advantages compare."""
    means = torch.zeros(int(group.max()) + 1, R.shape[1], dtype=R.dtype).index_add_(0, group, R)  # (c, W+1)
    return R - (means / torch.bincount(group)[:, None])[group]


def truth_table(out: dict, draws: torch.Tensor) -> list[str]:
    """One seed's table: each judge's agreement with the truth, correlations +- SE by resampling the captions."""
    st, W = out["settings"], out["settings"]["window"]
    truth_R, group = torch.tensor(out["R_sde_mean"]), torch.arange(st["prompts"] * st["members"]) // st["members"]
    lines = [f"Seed {st['seed']}: each judge's R_k against the mean reward of {st['continuations']} SDE continuations "
             f"from the same window state s_k ({st['prompts']} captions x {st['members']} trajectories, T = "
             f"{st['steps']}, W = {W}, a = {st['noise_level']}, sampler {st['sampler']}); +- SE by resampling the "
             f"captions ({len(draws)} times). Monte-Carlo SE of the truth at s_0: {out['mc_se'][0]:.3f}.", "",
             "| judge | correlation with the truth, " + " / ".join(f"s_{k}" for k in range(W)) + " | bias at s_0 | "
             "RMSE at s_0 | d_k = 0 (ties) | d_k sign agreement, all steps / where the judge's d_k != 0 | strict "
             "turning points: judge / truth, precision / recall |", "|---|---|---|---|---|---|---|"]
    for spec, row in out["judges"].items():
        bias, corr = bootstrap_agreement(torch.tensor(row["R"]), truth_R, group, draws)  # (B, W+1) each
        # a draw whose captions all score one state alike has no correlation there (NaN): left out of its SE
        corr_se = torch.stack([c[c.isfinite()].std() for c in corr.T])  # (W+1,)
        agree = sum(row["d_sign_agree"]) / W
        lines.append(f"| {spec} | " + " / ".join(f"{row['corr'][k]:.2f} +- {corr_se[k]:.2f}" for k in range(W))
                     + f" | {row['bias'][0]:+.3f} +- {bias.std(0)[0]:.3f} | {row['rmse'][0]:.3f} | "
                     f"{100 * row['d_zero']:.0f}% | {agree:.2f} / {row['d_sign_agree_moved']:.2f} | "
                     f"{100 * row['tp_rate']:.1f}% / {100 * row['tp_rate_truth']:.1f}%, {row['tp_precision']:.2f} / "
                     f"{row['tp_recall']:.2f} |")
    return lines


def judge_differences(out: dict, draws: torch.Tensor, base: str = "ode") -> dict:
    """{(judge, "pooled" / "within"): (diff (W,), se (W,))}: each judge's correlation with the truth at s_0 ..
    s_{W-1} minus `base`'s, over all trajectories (pooled) and within caption (`centred`: GRPO's comparison), the SE
    from the same draws of captions for both judges (paired)."""
    st = out["settings"]
    group = torch.arange(st["prompts"] * st["members"]) // st["members"]
    truth_R, W = torch.tensor(out["R_sde_mean"]), st["window"]
    diffs = {}
    for kind, f in (("pooled", lambda R: R), ("within", lambda R: centred(R, group))):
        corr = {spec: (agreement(f(torch.tensor(row["R"])), f(truth_R))["corr"][:W],
                       bootstrap_agreement(f(torch.tensor(row["R"])), f(truth_R), group, draws)[1][:, :W])
                for spec, row in out["judges"].items()}  # {spec: (point (W,), draws (B, W))}
        for spec in out["judges"]:
            if spec != base:
                d = corr[spec][1] - corr[base][1]  # (B, W) paired: the same captions in both
                se = torch.stack([c[c.isfinite()].std() for c in d.T])  # (W,)
                diffs[spec, kind] = (torch.tensor(corr[spec][0]) - torch.tensor(corr[base][0]), se)
    return diffs


def report_truth(outs: list[dict], reports: str) -> None:
    """`reports`/judges_truth.md: per seed, each judge's agreement with the stochastic truth (`truth_table`) and its
    correlation's paired difference from the ODE judge's (`judge_differences`); then what holds at every seed: a
    difference whose interval (+- 2 SE) excludes 0 on the same side at each of them."""
    W = outs[0]["settings"]["window"]
    draws = torch.randint(outs[0]["settings"]["prompts"], (1000, outs[0]["settings"]["prompts"]),
                          generator=torch.Generator().manual_seed(0))
    lines, diffs = [], []
    for out in outs:
        lines += truth_table(out, draws) + [""]
        diffs.append(judge_differences(out, draws) if "ode" in out["judges"] else {})
        lines += [f"Seed {out['settings']['seed']}: each judge's correlation with the truth minus the ODE judge's, "
                  "+- SE (the same captions drawn for both), over all trajectories / within caption:", "",
                  "| judge - ode | " + " | ".join(f"s_{k}" for k in range(W)) + " |", "|---|" + "---|" * W]
        for spec in [s for s in out["judges"] if (s, "pooled") in diffs[-1]]:
            (p, sp), (w, sw) = diffs[-1][spec, "pooled"], diffs[-1][spec, "within"]
            lines.append(f"| {spec} | " + " | ".join(f"{p[k]:+.2f} +- {sp[k]:.2f} / {w[k]:+.2f} +- {sw[k]:.2f}"
                                                      for k in range(W)) + " |")
        lines.append("")
    held = [f"{spec} {kind} at s_{k}: {'+' if diffs[0][spec, kind][0][k] > 0 else '-'}"
            for spec, kind in diffs[0] for k in range(W)
            if all((spec, kind) in d for d in diffs)
            and len({bool(d[spec, kind][0][k] > 0) for d in diffs}) == 1
            and all(d[spec, kind][0][k].abs() > 2 * d[spec, kind][1][k] for d in diffs)]
    lines.append(f"Differences from the ODE judge beyond 2 SE, on the same side, at every one of the {len(outs)} "
                 f"seed(s): " + ("; ".join(held) if held else "none") + ".")
    _write_table(reports, "judges_truth.md", lines)


def fidelity(args) -> dict:
    """The cheaper judges against the full ODE judge on the same window states (docs/method.md, 'Cheaper judges'):
    `agreement` with R_ode as the truth, plus the correlation of TP-GRPO's per-timestep advantages (strict rule,
    groups of `members` trajectories of one caption) and the evaluations each judge costs per trajectory."""
    path = os.path.join(args.results, "judge", "fidelity.json")
    if args.report:
        return report_fidelity(json.load(open(path)), args.reports)
    cfg, pipe, reward_fn, _ = toy_setup()
    ro, cond, R_ode, reward, _ = toy_trajectories(pipe, cfg, reward_fn, args.members, cfg.noise_level, args.seed)
    adv = lambda R: grpo.per_timestep_advantages(tp.step_rewards(R, args.members)[0], args.members)  # noqa: E731
    out = {"settings": {"prompts": 48, "members": args.members, "steps": cfg.steps, "window": cfg.window,
                        "noise_level": cfg.noise_level, "seed": args.seed}, "judges": {}}
    for spec in args.judges:
        count = models.EvalCounter()
        R = judge_rewards(pipe, ro, cond, cfg, reward, spec, count)  # (n, W+1)
        # the wavefront's cost: the rollout's T, plus every completion step but each branch's first
        per_trajectory = cfg.steps + count.nfe / R.shape[0] - cfg.window
        row = {**agreement(R, R_ode), "adv_corr": torch.corrcoef(torch.stack([adv(R).flatten(),
                                                                                adv(R_ode).flatten()]))[0, 1].item(),
               "evals_per_trajectory": per_trajectory}
        out["judges"][spec] = row
        log_row(spec, row)
    write_json(out, path)
    report_fidelity(out, args.reports)
    return out


def report_fidelity(out: dict, reports: str) -> None:
    """`reports`/fidelity.md: each judge's agreement with the full ODE judge, per window state and step."""
    st, W = out["settings"], out["settings"]["window"]
    lines = [f"Cheaper judges against the full ODE judge on the same window states ({st['prompts']} captions x "
             f"{st['members']} trajectories, T = {st['steps']}, W = {W}, a = {st['noise_level']}); R_k error at "
             f"k = 0..W-1, d_k sign agreement at steps 1..W.", "",
             "| judge | evaluations per trajectory | RMSE of R_k | d_k sign agreement | ... where the judge's d_k != 0 "
             "| strict turning points: precision / recall | advantage correlation |", "|---|---|---|---|---|---|---|"]
    for spec, row in out["judges"].items():
        lines.append(f"| {spec} | {row['evals_per_trajectory']:.0f} | {' '.join(f'{v:.3f}' for v in row['rmse'][:W])} "
                     f"| {' '.join(f'{v:.2f}' for v in row['d_sign_agree'])} | {row['d_sign_agree_moved']:.2f} | "
                     f"{row['tp_precision']:.2f} / {row['tp_recall']:.2f} | {row['adv_corr']:.3f} |")
    _write_table(reports, "fidelity.md", lines)


def _write_table(reports: str, name: str, lines: list[str]) -> None:
    """A report's markdown lines to reports/<name>, and printed."""
    os.makedirs(reports, exist_ok=True)
    with open(os.path.join(reports, name), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_json(out: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f)


def log_row(name: str, row: dict) -> None:
    """One judge's agreement (`agreement`), a line, while a measurement runs."""
    fmt = lambda values: " ".join(f"{v:+.3f}" for v in values)  # noqa: E731
    print(f"{name}: RMSE {fmt(row['rmse'])} | corr {fmt(row['corr'])} | d-sign agreement {fmt(row['d_sign_agree'])}"
          f" | strict TPs precision {row['tp_precision']:.2f} recall {row['tp_recall']:.2f}"
          + (f" | advantage corr {row['adv_corr']:.3f}" if "adv_corr" in row else ""), flush=True)


def report_measure(out: dict, reports: str, stem: str = "judge") -> None:
    """`reports`/<stem>.md: the agreement table per noise level and window state; `reports`/<stem>.png: the ODE
    judge against the SDE mean, one panel per noise level, coloured by window state."""
    st = out["settings"]
    lines = [f"ODE judge R_k = R(ODE-complete(s_k)) against the mean reward of {st['continuations']} SDE "
             f"continuations from s_k ({st['prompts']} captions x {st['members']} trajectories, T = {st['steps']}, "
             f"W = {st['window']}, sampler {st['sampler']}, reward {st.get('rewards', 'toy:1')} in its training "
             f"units); columns k = 0..W-1 (at k = W both are the final "
             f"reward). Standard errors resample the {st['prompts']} captions with replacement (1000 times).", "",
             "| a | what | " + " | ".join(f"k={k}" for k in range(st["window"])) + " | strict turning points: "
             "precision / recall (rate: judge / truth); ties |", "|---|---|" + "---|" * (st["window"] + 1)]
    n = st["prompts"] * st["members"]
    draws = torch.randint(st["prompts"], (1000, st["prompts"]), generator=torch.Generator().manual_seed(0))
    for a, row in out["levels"].items():
        R, truth = torch.tensor(row["R_ode"]), torch.tensor(row["R_sde_mean"])  # (n, W+1) each
        bias, corr = bootstrap_agreement(R, truth, torch.arange(n) // st["members"], draws)  # (1000, W+1) each
        row = {**row, **agreement(R, truth), "bias_se": bias.std(0).tolist(), "corr_se": corr.std(0).tolist()}
        tps = (f"{row['tp_precision']:.2f} / {row['tp_recall']:.2f} ({100 * row['tp_rate']:.1f}% / "
               f"{100 * row['tp_rate_truth']:.1f}%); d_k = 0 in {100 * row['d_zero']:.0f}% of steps, sign agreement "
               f"where the judge's d_k != 0: {row['d_sign_agree_moved']:.2f}")
        for i, (key, name) in enumerate([("bias", "bias R_ode - R_sde"), ("bias_se", "its SE (captions resampled)"),
                                         ("corr", "correlation"), ("corr_se", "its SE (captions resampled)"),
                                         ("rmse", "RMSE"), ("mc_se", "Monte-Carlo SE of the truth"),
                                         ("d_sign_agree", "d_k sign agreement (step k+1)")]):
            cells = " | ".join(f"{v:+.3f}" if key == "bias" else f"{v:.3f}" for v in row[key][:st["window"]])
            lines.append(f"| {a if i == 0 else ''} | {name} | {cells} | {tps if i == 0 else ''} |")
    _write_table(reports, f"{stem}.md", lines)
    levels = list(out["levels"].items())
    fig = Figure(figsize=(4 * len(levels), 3.8), dpi=110)
    axes = fig.subplots(1, len(levels), sharey=True, squeeze=False)[0]
    for ax, (a, row) in zip(axes, levels):
        R, truth = torch.tensor(row["R_ode"]), torch.tensor(row["R_sde_mean"])  # (n, W+1)
        for k in range(st["window"]):
            ax.scatter(truth[:, k], R[:, k], s=6, alpha=0.6, label=f"s_{k}")
        lo, hi = min(R.min().item(), truth.min().item(), 0.0), max(R.max().item(), truth.max().item(), 1.0)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)  # the diagonal: a judge equal to the truth
        ax.set_title(f"a = {a}", fontsize=9)
        ax.set_xlabel(f"mean reward of {st['continuations']} SDE continuations")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("ODE judge R_k")
    axes[0].legend(fontsize=7, markerscale=2)
    fig.tight_layout()
    fig.savefig(os.path.join(reports, f"{stem}.png"))


def figures(args) -> None:
    """One prompt group of the shipped toy model: R_k along each trajectory with the kept turning points and their
    r_agg, and the filmstrip of one trajectory's ODE completions with their rewards."""
    cfg, pipe, reward_fn, (sigmas, timesteps) = toy_setup()
    prompt, G, W = args.prompt, args.group, cfg.window
    meta = toyworld.parse_caption(prompt)
    cond = models.encode_prompts(pipe, [prompt], cfg.guidance, cfg.max_sequence_length).repeat(G)
    gens = S.make_generators([S.member_seed(args.seed, 0, 0, m) for m in range(G)])
    x_T = S.draw_noise(gens, models.latent_shape(pipe, cfg.resolution), "cpu")  # (G, C, h, w)
    ro = S.wavefront_rollout(pipe.transformer, cond, x_T, gens, sigmas=sigmas, timesteps=timesteps, w0=0, window=W,
                             noise_level=cfg.noise_level, kind=cfg.sampler, guidance_scale=cfg.guidance)
    images = models.decode(pipe, ro.completions.flatten(0, 1))  # (G*(W+1), 3, h, w)
    R = reward_fn(images, [prompt] * len(images), [meta] * len(images))[0].reshape(G, W + 1)  # (G, W+1)
    step_r, kept, detected = tp.step_rewards(R, G, "tp-grpo", args.rule)  # (G, W) x 3: one group
    r_agg = tp.aggregated_rewards(R)  # (G, W)
    print(tp.render_group(R, step_r, kept, detected))

    os.makedirs(args.docs, exist_ok=True)
    fig = Figure(figsize=(6.5, 3.6), dpi=120)
    ax = fig.subplots()
    for g in range(G):
        y = R[g]  # (W+1,)
        ax.plot(range(W + 1), y, "-", color="tab:gray", alpha=0.6, lw=1)
        for k in kept[g].nonzero().flatten().tolist():  # step k+1 takes s_k to s_{k+1}
            ax.plot([k, k + 1], [y[k], y[k + 1]], "-", color="tab:red", lw=2.5)
            # labels staggered by trajectory: several can end at the same point
            ax.annotate(f"r_agg={r_agg[g, k]:+.2f}", (k + 1, float(y[k + 1])), fontsize=7, color="tab:red",
                        xytext=(3, 4 - 9 * (g % 3)), textcoords="offset points")
    ax.set_xlabel("window state k  (R_0 = pure-ODE image of x_T, R_W = R_sde)")
    ax.set_ylabel("R_k = reward(ODE-complete(s_k))")
    ax.set_title(f'"{prompt}": {G} trajectories, kept turning points ({args.rule} rule) in red', fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.docs, "turning_points.png"))

    with_tp = kept.any(1).nonzero().flatten().tolist()
    g = with_tp[0] if with_tp else 0
    fig = Figure(figsize=(1.1 * (W + 1), 1.6), dpi=120)
    axes = fig.subplots(1, W + 1)
    strip = images.reshape(G, W + 1, *images.shape[1:])[g]  # (W+1, 3, h, w)
    for k, ax in enumerate(axes):
        ax.imshow(strip[k].permute(1, 2, 0).numpy(), interpolation="nearest")
        mark = " *" if k > 0 and kept[g, k - 1] else ""
        ax.set_title(f"R_{k}={R[g, k]:.2f}{mark}", fontsize=7, color="tab:red" if mark else "black")
        ax.axis("off")
    fig.suptitle(f'trajectory {g}: ODE completion of every window state ("{prompt}"; * = turning point)',
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.docs, "filmstrip.png"))
    print(f"wrote {args.docs}/turning_points.png and {args.docs}/filmstrip.png")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    fg = sub.add_parser("figures", help="turning-point pictures of one prompt group")
    fg.add_argument("--prompt", default="four blue squares")
    fg.add_argument("--group", type=int, default=8)
    fg.add_argument("--seed", type=int, default=1)
    fg.add_argument("--rule", default="strict", choices=["strict", "base"], help="turning-point rule")
    fg.add_argument("--docs", default=os.path.join(ROOT, "docs"), help="where the PNGs go")
    ms = sub.add_parser("measure", help="the ODE judge against the mean of SDE continuations")
    ms.add_argument("--noise", type=float, nargs="+", default=[0.4, 0.7, 1.0], help="noise levels a")
    ms.add_argument("--members", type=int, default=2, help="trajectories per training caption (48 captions)")
    ms.add_argument("--continuations", type=int, default=16, help="M, SDE continuations per window state")
    ms.add_argument("--seed", type=int, default=0)
    ms.add_argument("--rewards", default="toy:1", help="the reward judged, 'name:w,...' (toyscore:1: the learned "
                    "ToyScore, lab/toyscore.py); results and reports named after it")
    ms.add_argument("--results", default=os.path.join(LAB, "results"))
    ms.add_argument("--reports", default=os.path.join(LAB, "reports"))
    ms.add_argument("--report", action="store_true",
                    help="only rewrite the report (judge.md and judge.png, or judge_<reward>.*) in --reports "
                    "from the results")
    tr = sub.add_parser("truth", help="every judge (--completion) against the mean of SDE continuations")
    tr.add_argument("--judges", nargs="+", default=["ode", "ode:3", "ode:2", "x0", "mc:1", "mc:4"])
    tr.add_argument("--noise", type=float, default=0.7, help="the noise level a")
    tr.add_argument("--members", type=int, default=2, help="trajectories per training caption (48 captions)")
    tr.add_argument("--continuations", type=int, default=16, help="M, SDE continuations per window state")
    tr.add_argument("--seed", type=int, nargs="+", default=[0], help="the seeds of the trajectories and the "
                    "continuations (seed 0 with --members 2: measure's), each its own result file")
    tr.add_argument("--results", default=os.path.join(LAB, "results"))
    tr.add_argument("--reports", default=os.path.join(LAB, "reports"))
    tr.add_argument("--report", action="store_true", help="only rewrite judges_truth.md from the results of "
                    "--members and --seed")
    fi = sub.add_parser("fidelity", help="cheaper judges (--completion) against the full ODE judge")
    fi.add_argument("--judges", nargs="+", default=["ode", "ode:3", "ode:2", "x0"])
    fi.add_argument("--members", type=int, default=8, help="trajectories per training caption: a GRPO group")
    fi.add_argument("--seed", type=int, default=0)
    fi.add_argument("--results", default=os.path.join(LAB, "results"))
    fi.add_argument("--reports", default=os.path.join(LAB, "reports"))
    fi.add_argument("--report", action="store_true", help="only rewrite fidelity.md from the results")
    args = p.parse_args()
    {"figures": figures, "measure": measure, "truth": truth, "fidelity": fidelity}[args.command](args)


if __name__ == "__main__":
    main()
