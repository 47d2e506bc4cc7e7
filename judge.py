"""What the judges of intermediate states see, on the shipped toy checkpoint (toyworld.py, toymodel.py): the ODE
completion R_k = R(ODE-complete(s_k)) of every window state (paper Sec. 4.1) along one prompt group's
trajectories, with the turning points it finds (Sec. 4.2, Def. 4.1 / 5.1) and their aggregated rewards r_agg.

  python judge.py figures        # docs/turning_points.png and docs/filmstrip.png (the README's pictures)

Shape legend: G group members, W window steps, R (G, W+1) completion rewards, C/h/w the toy model's latent
channels/height/width, which are its pixels (it works in pixel space): images (., 3, h, w).
"""

from __future__ import annotations

import argparse
import os

import torch
from matplotlib.figure import Figure

import config
import models
import rewards
import sampler as S
import toyworld
import turning_points as tp


def figures(args) -> None:
    """One prompt group of the shipped toy model: R_k along each trajectory with the kept turning points and their
    r_agg, and the filmstrip of one trajectory's ODE completions with their rewards."""
    cfg = config.Config(**dict(config.PRESETS["tiny"], task="tiny"))
    pipe = models.load_pipeline(cfg.model)
    reward_fn = rewards.load_rewards({"toy": 1.0})
    prompt, G, W = args.prompt, args.group, cfg.window
    meta = toyworld.parse_caption(prompt)
    cond = models.encode_prompts(pipe, [prompt], cfg.guidance, cfg.max_sequence_length).repeat(G)
    gens = S.make_generators([S.member_seed(args.seed, 0, 0, m) for m in range(G)])
    x_T = S.draw_noise(gens, models.latent_shape(pipe, cfg.resolution), "cpu")  # (G, C, h, w)
    sigmas, timesteps = models.sigma_grid(pipe.scheduler, cfg.steps)
    ro = S.rollout(pipe.transformer, cond, x_T, gens, sigmas, timesteps, 0, W, cfg.noise_level, cfg.sampler,
                   cfg.guidance, complete=True)
    images = models.decode(pipe, ro.completions.flatten(0, 1))  # (G*(W+1), 3, h, w)
    R = reward_fn(images, [prompt] * len(images), [meta] * len(images))[0].reshape(G, W + 1)  # (G, W+1)
    group = torch.zeros(G, dtype=torch.long)
    step_r, kept, detected = tp.step_rewards(R, group, "tp-grpo", args.rule)  # (G, W) x 3
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
    fg.add_argument("--docs", default="docs", help="where the PNGs go")
    args = p.parse_args()
    figures(args)


if __name__ == "__main__":
    main()
