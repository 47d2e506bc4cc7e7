"""Experiments in the toy world (toyworld.py): Flow-GRPO vs TP-GRPO (strict and base rule) vs the incremental-only
ablation over seeds, and the pictures of turning points the README shows next to the method.

  python compare.py run --seeds 0 1 2          # 4 methods x 3 seeds of `train.py --task tiny` (same budget each)
  python compare.py report                     # docs/compare_curves.png and the markdown table (also printed)
  python compare.py figures                    # docs/turning_points.png and docs/filmstrip.png

`run` trains each (method, seed) with the tiny preset's defaults, changing nothing but --algo / --tp-rule and
--seed, so no method gets settings of its own (extra flags after `--` go to every run alike). `report` reads
every finished run: the training reward (5-iteration mean of R_sde) and the held-out score before and after,
against iterations, transformer evaluations and wall seconds (mean +- SE over seeds), and a table with the
held-out change (SE over seeds and paired SE over the evaluation images), strict accuracy, turning-point rates,
and the iterations, evaluations and seconds each method needs to reach Flow-GRPO's final training reward.

Shape legend (figures): G group members, W window steps, R (G, W+1) completion rewards, C/h/w the toy
model's latent channels/height/width, which are its pixels (it works in pixel space): images (., 3, h, w).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

import torch
from matplotlib.figure import Figure

import config
import models
import rewards
import sampler as S
import toyworld
import turning_points as tp

ROOT = os.path.dirname(os.path.abspath(__file__))

# every method is `train.py --task tiny` plus these flags and nothing else
METHODS = {"flow-grpo": ["--algo", "flow-grpo"], "tp-grpo": ["--algo", "tp-grpo", "--tp-rule", "strict"],
           "tp-grpo-base": ["--algo", "tp-grpo", "--tp-rule", "base"], "incremental": ["--algo", "incremental"]}
COLORS = {"flow-grpo": "tab:gray", "tp-grpo": "tab:red", "tp-grpo-base": "tab:orange", "incremental": "tab:blue"}
SCORE = "eval/reward"  # the held-out score: the preset's reward on the held-out images


def run(args) -> None:
    for method in args.methods:
        for seed in args.seeds:
            out = os.path.join(args.out, f"{method}-seed{seed}")
            if os.path.exists(os.path.join(out, "process_checksums.json")) and not args.force:
                print(f"skip {out} (done; --force reruns)")
                continue
            argv = ["--task", "tiny", *METHODS[method], "--seed", str(seed), "--output-dir", out, "--report-to",
                    "none", *args.train_args]
            print("python train.py " + " ".join(argv))
            # a process per run: every run starts from the same fresh state, as when launched by hand
            subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *argv], check=True)


def _finished(out: str, method: str) -> list[str]:
    """The run folders of `method` that completed (their final evaluation is written)."""
    return [os.path.join(out, n) for n in sorted(os.listdir(out))
            if n.rsplit("-seed", 1)[0] == method and os.path.exists(os.path.join(out, n, "eval_after.json"))]


def _load(out: str) -> dict[str, list[dict]]:
    """{method: [{"rows": metrics.jsonl rows, "before": eval_before.json, "after": eval_after.json} per seed]}."""
    runs = {}
    for method in METHODS:
        for folder in _finished(out, method):
            runs.setdefault(method, []).append(
                {"rows": [json.loads(line) for line in open(os.path.join(folder, "metrics.jsonl"))],
                 **{tag: json.load(open(os.path.join(folder, f"eval_{tag}.json"))) for tag in ("before", "after")}})
    return runs


def _curve(seeds: list[dict], key: str) -> torch.Tensor:
    n = min(len(r["rows"]) for r in seeds)
    return torch.tensor([[row.get(key, float("nan")) for row in r["rows"][:n]] for r in seeds])  # (seeds, its)


def _smooth(x: torch.Tensor, k: int = 5) -> torch.Tensor:
    """Trailing moving average over iterations (the training reward is noisy): (seeds, iterations)."""
    c = torch.cumsum(torch.nn.functional.pad(x, (1, 0)), 1)  # (seeds, iterations+1)
    idx = torch.arange(1, x.shape[1] + 1)
    lo = (idx - k).clamp(min=0)
    return (c[:, idx] - c[:, lo]) / (idx - lo)


def _se(x: torch.Tensor) -> torch.Tensor:
    """Standard error over seeds (dim 0); 0 for a single seed."""
    return x.std(0) / math.sqrt(x.shape[0]) if x.shape[0] > 1 else torch.zeros_like(x[0])


def _costs(seeds: list[dict]) -> dict[str, torch.Tensor]:
    """Cumulative cost after each iteration, mean over seeds: {"iteration", "evaluations", "seconds"} (its,)."""
    seconds = sum(_curve(seeds, f"time/{k}_s") for k in ("sample", "reward", "train"))  # (seeds, its)
    its = _curve(seeds, "iteration")[0]
    return {"iteration": its, "evaluations": torch.cumsum(_curve(seeds, "cost/transformer_evals")[0], 0),
            "seconds": torch.cumsum(seconds, 1).mean(0)}


def report(args) -> str:
    runs = _load(args.out)
    if "flow-grpo" not in runs:
        raise SystemExit(f"error: no finished flow-grpo runs under {args.out}; run `python compare.py run` first")
    os.makedirs(args.docs, exist_ok=True)
    fig = Figure(figsize=(14, 3.8), dpi=110)
    axes = fig.subplots(1, 3, sharey=True)
    for ax, (xkey, xlabel) in zip(axes, [("iteration", "iteration"), ("evaluations", "transformer evaluations"),
                                         ("seconds", "wall seconds (sampling + rewards + training)")]):
        for method, seeds in runs.items():
            y = _smooth(_curve(seeds, "reward/mean"))  # (seeds, its)
            x = _costs(seeds)[xkey]  # (its,)
            m, se = y.mean(0), _se(y)
            ax.plot(x, m, color=COLORS[method], label=f"{method} training reward ({y.shape[0]} seeds)")
            ax.fill_between(x, m - se, m + se, color=COLORS[method], alpha=0.2)
            # held-out score before (cost 0) and after (the whole run's cost), +- SE over seeds
            held = torch.tensor([[r["before"][SCORE], r["after"][SCORE]] for r in seeds])  # (seeds, 2)
            ax.errorbar([0, x[-1]], held.mean(0), yerr=_se(held), fmt="o--", color=COLORS[method], capsize=3,
                        ms=5, lw=1)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("toy score")
    fig.suptitle("lines: training reward (5-iteration mean, +- SE over seeds); dots: held-out score before and after "
                 "(+- SE over seeds)", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.docs, "compare_curves.png"))

    target = _smooth(_curve(runs["flow-grpo"], "reward/mean"))[:, -1].mean().item()
    lines = [f"| method | seeds | held-out before | held-out after | change +- SE over seeds | paired SE over images "
             f"| change / SE | strict accuracy after | turning points (strict / base / kept) | to reach {target:.3f}: "
             f"iterations / evaluations / seconds | seconds per run | training reward, first -> last 5 iterations |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for method, seeds in runs.items():
        before = seeds[0]["before"]  # every seed starts from the same checkpoint and evaluation noise
        after = torch.tensor([r["after"][SCORE] for r in seeds])  # (seeds,)
        change = after - torch.tensor([r["before"][SCORE] for r in seeds])  # (seeds,)
        c_se = _se(change[:, None])[0].item()
        # Paired over images: all runs score the same images, so the seed-averaged change is also known image by
        # image; its SE over the M images says how far another draw of evaluation images could move it (the SE
        # over seeds only sees training randomness).
        name = SCORE.removeprefix("eval/")
        per_image = torch.tensor([r["after"]["per_image"][name] for r in seeds]) - \
            torch.tensor(before["per_image"][name])  # (seeds, M)
        d = per_image.mean(0)  # (M,)
        i_se = (d.std() / math.sqrt(d.numel())).item()
        strict = torch.tensor([r["after"]["eval/toy_strict"] for r in seeds])  # (seeds,)
        rates = [_curve(seeds, f"steps/{k}").nanmean().item() for k in ("tp_rate_strict", "tp_rate_base", "tp_kept")]
        tps = "-" if method == "flow-grpo" else " / ".join(f"{100 * r:.1f}%" for r in rates)
        y = _smooth(_curve(seeds, "reward/mean")).mean(0)  # (its,)
        cost = _costs(seeds)
        reached = (y >= target).nonzero()
        hit = "not reached" if not len(reached) else " / ".join(
            [f"{int(cost['iteration'][reached[0]])}", f"{int(cost['evaluations'][reached[0]]):,}",
             f"{float(cost['seconds'][reached[0]]):.0f}"])
        # the whole run's wall time, evaluations included (train.py's time/elapsed_s at its last iteration)
        run_s = torch.tensor([r["rows"][-1].get("time/elapsed_s", float("nan")) for r in seeds])  # (seeds,)
        lines.append(f"| {method} | {len(seeds)} | {before[SCORE]:.3f} +- {before[SCORE + '_se']:.3f} | "
                     f"{after.mean():.3f} +- {_se(after[:, None])[0]:.3f} | {change.mean():+.3f} +- {c_se:.3f} | "
                     f"{i_se:.3f} | {change.mean().item() / max(i_se, c_se, 1e-12):+.1f} | "
                     f"{strict.mean():.3f} +- {_se(strict[:, None])[0]:.3f} | {tps} | {hit} | {run_s.mean():.0f} | "
                     f"{y[min(4, len(y) - 1)]:.3f} -> {y[-1]:.3f} |")
    table = "\n".join(lines)
    with open(os.path.join(args.docs, "compare_table.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return table


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
    r = sub.add_parser("run", help="train every (method, seed) of the tiny task")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    r.add_argument("--force", action="store_true", help="rerun finished runs")
    r.add_argument("train_args", nargs="*", help="extra train.py flags for EVERY run (after --)")
    for s in sub.choices.values():
        s.add_argument("--out", default="runs/compare", help="folder of the runs")
    rep = sub.add_parser("report", help="curves and table from the runs")
    rep.add_argument("--out", default="runs/compare")
    fg = sub.add_parser("figures", help="turning-point pictures of one prompt group")
    fg.add_argument("--prompt", default="four blue squares")
    fg.add_argument("--group", type=int, default=8)
    fg.add_argument("--seed", type=int, default=1)
    fg.add_argument("--rule", default="strict", choices=["strict", "base"], help="turning-point rule")
    for s in (rep, fg):
        s.add_argument("--docs", default="docs", help="where the PNGs and the table go")
    args = p.parse_args()
    {"run": run, "report": report, "figures": figures}[args.command](args)


if __name__ == "__main__":
    main()
