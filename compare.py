"""Experiments in the toy world (toyworld.py): Flow-GRPO vs TP-GRPO vs the incremental-only ablation over seeds,
and the pictures of turning points the README shows next to the method.

  python compare.py run --seeds 0 1 2          # 3 algorithms x 3 seeds of `train.py --task tiny` (same budget each)
  python compare.py report                     # docs/compare_*.png and the markdown table (also printed)
  python compare.py figures                    # docs/turning_points.png and docs/filmstrip.png

`run` trains each (algorithm, seed) with the tiny preset's defaults, changing nothing but --algo and --seed, so no
method gets settings of its own. `report` reads every run's metrics.jsonl: the training reward (mean R_sde of the
iteration's trajectories) against iterations and against transformer evaluations (mean +- std over seeds), and
a table with the final held-out score and strict accuracy (standard errors over seeds), the change's paired
standard error over the evaluation images, the change in units of the larger of the two SEs, and the iterations
and evaluations each method needs to reach Flow-GRPO's final training reward.

Shape legend (figures): G group members, W window steps, R (G, W+1) completion rewards, C/H/W pixels.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch

ALGOS = ("flow-grpo", "tp-grpo", "incremental")
COLORS = {"flow-grpo": "tab:gray", "tp-grpo": "tab:red", "incremental": "tab:blue"}


def run(args) -> None:
    import train
    for algo in args.algos:
        for seed in args.seeds:
            out = os.path.join(args.out, f"{algo}-seed{seed}")
            if os.path.exists(os.path.join(out, "process_checksums.json")) and not args.force:
                print(f"skip {out} (done; --force reruns)")
                continue
            argv = ["--task", "tiny", "--algo", algo, "--seed", str(seed), "--output-dir", out, "--report-to",
                    "none", *args.train_args]
            print("python train.py " + " ".join(argv))
            train.main(train.parse_config(argv))


def _finished(out: str, algo: str) -> list[str]:
    """The run folders of `algo` that completed (their final evaluation is written)."""
    return [os.path.join(out, n) for n in sorted(os.listdir(out))
            if n.rsplit("-seed", 1)[0] == algo and os.path.exists(os.path.join(out, n, "eval_after.json"))]


def _load(out: str) -> dict[str, list[list[dict]]]:
    """{algo: [rows of metrics.jsonl for each finished seed]}."""
    runs = {}
    for algo in ALGOS:
        for folder in _finished(out, algo):
            runs.setdefault(algo, []).append([json.loads(line) for line in open(os.path.join(folder, "metrics.jsonl"))])
    return runs


def _curve(rows_per_seed: list[list[dict]], key: str) -> torch.Tensor:
    n = min(len(r) for r in rows_per_seed)
    return torch.tensor([[row[key] for row in rows[:n]] for rows in rows_per_seed])  # (seeds, iterations)


def _smooth(x: torch.Tensor, k: int = 5) -> torch.Tensor:
    """Trailing moving average over iterations (the training reward is noisy): (seeds, iterations)."""
    c = torch.cumsum(torch.nn.functional.pad(x, (1, 0)), 1)  # (seeds, iterations+1)
    idx = torch.arange(1, x.shape[1] + 1)
    lo = (idx - k).clamp(min=0)
    return (c[:, idx] - c[:, lo]) / (idx - lo)


def report(args) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = _load(args.out)
    if "flow-grpo" not in runs:
        raise SystemExit(f"error: no flow-grpo runs under {args.out}; run `python compare.py run` first")
    os.makedirs(args.docs, exist_ok=True)
    for xkey, fname, xlabel in [("iteration", "compare_iterations.png", "iteration"),
                                ("cost/transformer_evals", "compare_evals.png", "transformer evaluations")]:
        fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=120)
        for algo in ALGOS:
            if algo not in runs:
                continue
            y = _smooth(_curve(runs[algo], "reward/mean"))  # (seeds, iterations)
            x = _curve(runs[algo], xkey)[0]
            if xkey != "iteration":
                x = torch.cumsum(x, 0)
            m, s = y.mean(0), y.std(0) if y.shape[0] > 1 else torch.zeros_like(y[0])
            ax.plot(x, m, color=COLORS[algo], label=f"{algo} ({y.shape[0]} seeds)")
            ax.fill_between(x, m - s, m + s, color=COLORS[algo], alpha=0.2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training reward (5-iteration mean)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.docs, fname))
        plt.close(fig)

    target = _smooth(_curve(runs["flow-grpo"], "reward/mean"))[:, -1].mean().item()
    lines = [f"| method | seeds | held-out before | held-out after | change (SE over seeds) | SE over images | "
             f"change / SE | strict accuracy after | "
             f"iterations to {target:.3f} | evaluations to {target:.3f} |", "|---|---|---|---|---|---|---|---|---|---|"]
    for algo in ALGOS:
        if algo not in runs:
            continue
        evals = [[json.load(open(os.path.join(folder, f"eval_{tag}.json"))) for folder in _finished(args.out, algo)]
                 for tag in ("before", "after")]

        def stat(rows, key):
            """mean over seeds +- its standard error over seeds (one seed: the evaluation's own SE)."""
            v = torch.tensor([r[key] for r in rows])
            se = v.std() / math.sqrt(len(v)) if len(v) > 1 else torch.tensor(rows[0][key + "_se"])
            return v.mean().item(), se.item()

        # the held-out score is the exact-count partial credit, also when training on the graded toy reward
        key = "eval/toy_partial" if "eval/toy_partial" in evals[0][0] else "eval/reward"
        # every seed starts from the same checkpoint and evaluation noise: "before" is one evaluation
        b, b_se = evals[0][0][key], evals[0][0][key + "_se"]
        a, a_se = stat(evals[1], key)
        change = torch.tensor([y[key] - x[key] for x, y in zip(*evals)])  # (seeds,)
        c_se = (change.std() / math.sqrt(len(change))).item() if len(change) > 1 else 0.0
        # Paired over images: all runs score the same images, so the seed-averaged change is also known image by
        # image; its SE over the M images says how far another draw of evaluation images could move it (the SE
        # over seeds only sees training randomness). "-" for runs written before per-image values were saved.
        name = key.removeprefix("eval/")
        if all("per_image" in e for e in evals[0] + evals[1]):
            after = torch.tensor([e["per_image"][name] for e in evals[1]])  # (seeds, M)
            d = (after - torch.tensor(evals[0][0]["per_image"][name])).mean(0)  # (M,)
            i_se = (d.std() / math.sqrt(d.numel())).item()
            paired = f"{i_se:.3f} | {change.mean().item() / max(i_se, c_se, 1e-12):+.1f}"
        else:
            paired = "- | -"
        s_mean, s_se = stat(evals[1], "eval/toy_strict")
        y = _smooth(_curve(runs[algo], "reward/mean")).mean(0)  # (iterations,)
        spent = torch.cumsum(_curve(runs[algo], "cost/transformer_evals")[0], 0)  # (iterations,)
        reached = (y >= target).nonzero()
        hit_it = f"{int(reached[0]) + 1}" if len(reached) else "not reached"
        hit_ev = f"{int(spent[reached[0]]):,}" if len(reached) else "-"
        lines.append(f"| {algo} | {len(change)} | {b:.3f} +- {b_se:.3f} | "
                     f"{a:.3f} +- {a_se:.3f} | {change.mean():+.3f} +- {c_se:.3f} | {paired} | {s_mean:.3f} +- {s_se:.3f} | "
                     f"{hit_it} | {hit_ev} |")
    table = "\n".join(lines)
    with open(os.path.join(args.docs, "compare_table.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return table


def figures(args) -> None:
    """One prompt group of the shipped toy model: R_k along each trajectory with the kept turning points and their
    r_agg, and the filmstrip of one trajectory's ODE completions with their rewards."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import rewards
    import sampler as S
    import toyworld
    import train
    import turning_points as tp

    cfg = train.Config(**dict(train.PRESETS["tiny"], task="tiny"))
    pipe = S.load_pipeline(cfg.model)
    reward_fn = rewards.load_rewards({"toy": 1.0})
    prompt, G, W = args.prompt, args.group, cfg.window
    meta = toyworld.parse_caption(prompt)
    cond = S.encode_prompts(pipe, [prompt], cfg.guidance, cfg.max_sequence_length).repeat(G)
    gens = S.make_generators([S.member_seed(args.seed, 0, 0, m) for m in range(G)])
    x_T = S.draw_noise(gens, S.latent_shape(pipe, cfg.resolution), "cpu")  # (G, C, H, W)
    sigmas, timesteps = S.sigma_grid(pipe.scheduler, cfg.steps)
    ro = S.rollout(pipe.transformer, cond, x_T, gens, sigmas, timesteps, 0, W, cfg.noise_level, cfg.sampler,
                   cfg.guidance, complete=True)
    images = S.decode(pipe, ro.completions.flatten(0, 1))  # (G*(W+1), 3, H, W)
    R = reward_fn(images, [prompt] * len(images), [meta] * len(images))[0].reshape(G, W + 1)  # (G, W+1)
    group = torch.zeros(G, dtype=torch.long)
    step_r, kept = tp.step_rewards(R, group, "tp-grpo", args.rule)  # (G, W), (G, W)
    r_agg = tp.aggregated_rewards(R)  # (G, W)
    print(tp.render_group(R, step_r, kept, tp.detect_turning_points(R, args.rule)))

    os.makedirs(args.docs, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 3.6), dpi=120)
    jitter = torch.linspace(-0.015, 0.015, G)  # (G,) separates overlapping lines of a discrete reward
    for g in range(G):
        y = R[g] + jitter[g]  # (W+1,)
        ax.plot(range(W + 1), y, "-", color="tab:gray", alpha=0.6, lw=1)
        for k in kept[g].nonzero().flatten().tolist():  # step k+1 takes s_k to s_{k+1}
            ax.plot([k, k + 1], [y[k], y[k + 1]], "-", color="tab:red", lw=2.5)
            ax.annotate(f"r_agg={r_agg[g, k]:+.1f}", (k + 1, float(y[k + 1])), fontsize=7, color="tab:red",
                        xytext=(3, 4), textcoords="offset points")
    ax.set_xlabel("window state k  (R_0 = pure-ODE image of x_T, R_W = R_sde)")
    ax.set_ylabel("R_k = reward(ODE-complete(s_k))")
    ax.set_title(f'"{prompt}": {G} trajectories, kept turning points ({args.rule} rule) in red', fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.docs, "turning_points.png"))
    plt.close(fig)

    with_tp = kept.any(1).nonzero().flatten().tolist()
    g = with_tp[0] if with_tp else 0
    fig, axes = plt.subplots(1, W + 1, figsize=(1.1 * (W + 1), 1.6), dpi=120)
    strip = images.reshape(G, W + 1, *images.shape[1:])[g]  # (W+1, 3, H, W)
    for k, ax in enumerate(axes):
        ax.imshow(strip[k].permute(1, 2, 0).numpy(), interpolation="nearest")
        mark = " *" if k > 0 and kept[g, k - 1] else ""
        ax.set_title(f"R_{k}={R[g, k]:.1f}{mark}", fontsize=7, color="tab:red" if mark else "black")
        ax.axis("off")
    fig.suptitle(f'trajectory {g}: ODE completion of every window state ("{prompt}"; * = turning point)',
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.docs, "filmstrip.png"))
    plt.close(fig)
    print(f"wrote {args.docs}/turning_points.png and {args.docs}/filmstrip.png")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train every (algorithm, seed) of the tiny task")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--algos", nargs="+", default=list(ALGOS), choices=ALGOS)
    r.add_argument("--force", action="store_true", help="rerun finished runs")
    r.add_argument("train_args", nargs="*", help="extra train.py flags for EVERY run (after --)")
    for s in sub.choices.values():
        s.add_argument("--out", default="runs/compare", help="folder of the runs")
    rep = sub.add_parser("report", help="curves and table from the runs")
    rep.add_argument("--out", default="runs/compare")
    fg = sub.add_parser("figures", help="turning-point pictures of one prompt group")
    fg.add_argument("--prompt", default="three red squares")
    fg.add_argument("--group", type=int, default=8)
    fg.add_argument("--seed", type=int, default=0)
    fg.add_argument("--rule", default="strict", choices=["strict", "base"], help="turning-point rule")
    for s in (rep, fg):
        s.add_argument("--docs", default="docs", help="where the PNGs and the table go")
    args = p.parse_args()
    {"run": run, "report": report, "figures": figures}[args.command](args)


if __name__ == "__main__":
    main()
