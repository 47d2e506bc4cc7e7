"""Evaluation: ODE sampling of a held-out prompt set and the paper's metrics (Sec. 5; docs/method.md, 'Rewards'),
for a base model plus a LoRA (or its EMA) written by train.py, and during training (`HeldOut`: train.py calls it
once per evaluation point and logs what it returns).

Sampling is the plain Euler ODE with the preset's evaluation steps and CFG (SD3.5-M: 40 steps, w = 4.5); every
image has a fixed seed (config.EVAL_SEED, image index), so two checkpoints are compared on the same noise. Metrics
are the reward models of the task in evaluation form: raw PickScore (the paper's ~24), OCR accuracy, GenEval's strict
correctness per tag and overall score, the toy world's graded score and strict accuracy, plus any extra reward given.
`--task drawbench` is the paper's general-quality table on DrawBench's prompts: PickScore, LAION aesthetic,
ImageReward and UnifiedReward (quality.py) of any checkpoint, whatever task it was trained on.

  python evaluate.py --task tiny --checkpoint runs/tiny/checkpoints/iter-000030
  accelerate launch evaluate.py --task geneval --checkpoint runs/geneval/checkpoints/iter-001000 --ema
  python evaluate.py --task pickscore --checkpoint none --eval-samples 2048    # the base model
  accelerate launch evaluate.py --task drawbench --checkpoint runs/pickscore/checkpoints/iter-001000 --ema \
      --model-paths aesthetic=sac+logos+ava1-l14-linearMSE.pth

Writes OUTPUT_DIR/eval.json (mean, std, standard error per metric, and every image's values) and OUTPUT_DIR/grid.png;
prints a table. During training the same evaluation writes eval_<tag>.json and samples_<tag>.png into the run's
output folder, with the paired change against the evaluation before training. A metric that gives no value for an image (NaN: UnifiedReward's answer without a score) is left out
of its mean and counted in <metric>_failed; eval.json writes it as null.

Shape legend: M evaluation images, C/h/w latent channels/height/width, H/W pixel height/width (no window length
appears in this file, so the pixels keep the capitals; sampler.py calls them H'/W').
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from accelerate import Accelerator
from matplotlib.figure import Figure
from PIL import Image, ImageDraw, ImageFont

import collectives
import config
import geneval
import models
import quality  # noqa: F401  (registers imagereward and unifiedreward in rewards.REWARD_LOADERS)
import rewards
import sampler as S
import toyworld
from checkpoint import MANIFEST, check_checkpoint

GRID_IMAGES = 32  # evaluation images shown in the grid picture (grid.png, train.py's samples_<tag>.png)


def sample_and_score(pipe, prompts: list[str], metadata: list[dict], reward_fn, *, samples: int, steps: int,
                     guidance: float, resolution: int, max_sequence_length: int, batch: int, accelerator=None,
                     transformer=None, seed: int = config.EVAL_SEED):
    """Generate `samples` images (prompt i mod len, noise seed (seed, i)) split over processes, score them
    (`transformer`: called instead of pipe.transformer, e.g. its compiled form).

    Returns {"summary": {metric: mean, metric_std, metric_se}, "values": {metric: (M,)}, "images": this
    process's images (m, 3, H, W), "index": their image indices (m,)} with identical summaries and values on
    every process.
    """
    P, rank = (accelerator.num_processes, accelerator.process_index) if accelerator else (1, 0)
    per_proc = math.ceil(samples / P)
    mine = [min(rank + P * q, samples - 1) for q in range(per_proc)]  # the last index pads uneven splits
    prm = [prompts[i % len(prompts)] for i in mine]
    meta = [metadata[i % len(prompts)] for i in mine]
    seeds = [S.member_seed(seed, 0, i, 0) for i in mine]
    images = S.generate(pipe, prm, seeds, steps=steps, guidance_scale=guidance, resolution=resolution,
                        max_sequence_length=max_sequence_length, batch_size=batch,
                        transformer=transformer)  # (m, 3, H, W)
    values = {}
    for start in range(0, len(mine), batch):
        sl = slice(start, start + batch)
        total, parts = reward_fn(images[sl], prm[sl], meta[sl])
        for k, v in {"reward": total, **parts}.items():
            values.setdefault(k, []).append(v.float().cpu())
    index = torch.tensor(mine)  # (m,)
    values = {k: torch.cat(v) for k, v in values.items()}  # {metric: (m,)}
    if accelerator is not None and P > 1:
        index = collectives.gather(accelerator, index).cpu()  # (P*m,)
        values = {k: collectives.gather(accelerator, v).cpu() for k, v in values.items()}
    keep = torch.zeros(samples, dtype=torch.long)
    keep[index] = torch.arange(index.numel())  # one row per image index: the padding duplicates drop out
    values = {k: v[keep] for k, v in values.items()}  # {metric: (M,)}
    summary = summarize(values)
    if "geneval_correct" in values:
        tags = [metadata[i % len(prompts)].get("tag", "") for i in range(samples)]
        summary.update(geneval.geneval_summary(values["geneval_correct"], tags))
    return {"summary": summary, "values": values, "images": images, "index": torch.tensor(mine)}


@dataclass
class HeldOut:
    """The held-out evaluation inside training: the (EMA) policy sampled with the plain ODE on the run's
    evaluation prompts and settings (`sample_and_score`), the same images at every evaluation point. Called as
    heldout(tag, iteration) by train.py before training and by alarms.Watch after it; writes eval_<tag>.json and samples_<tag>.png and returns
    {"eval/<metric>": value}, with the paired change against "before" (the same images) once that exists."""

    cfg: config.Config
    accelerator: Accelerator
    pipe: object  # pipe.transformer is the trained policy
    reward_fn: object  # rewards.load_rewards
    prompts: list[str]  # the evaluation prompts (cycled over cfg.eval_samples images)
    metadata: list[dict]
    transformer: object  # what sampling calls: the policy, or its compiled form (--compile)
    ema: object = None  # policy.EMA: its weights are the ones evaluated
    values: dict = field(default_factory=dict)  # per-image values {metric: (M,)} of each tag, for paired changes

    def __call__(self, tag: str, iteration: int) -> dict[str, float]:
        cfg = self.cfg
        self.pipe.transformer.eval()
        if self.ema is not None:
            self.ema.swap()  # the EMA weights are the ones evaluated (docs/method.md, 'SD3.5-Medium hyperparameters')
        # before training, the toy checkpoint's shipped values stand in when its first images agree; on the way, the
        # first --eval-subset images may stand for all
        on_the_way = tag not in ("before", "after") and 0 < cfg.eval_subset < cfg.eval_samples
        result = (self.shipped() if tag == "before" else None) or self.images(
            cfg.eval_subset if on_the_way else cfg.eval_samples)
        if self.ema is not None:
            self.ema.swap()
        self.values[tag] = result["values"]
        summary = {f"eval/{k}": v for k, v in result["summary"].items()} | self.changes(tag)
        if self.accelerator.is_main_process:
            self.write(tag, iteration, result, summary)
        return summary

    def images(self, samples: int) -> dict:
        """sample_and_score on the first `samples` held-out images, with the run's evaluation settings."""
        cfg = self.cfg
        with self.accelerator.autocast():
            return sample_and_score(self.pipe, self.prompts, self.metadata, self.reward_fn, samples=samples,
                                    steps=cfg.eval_steps, guidance=cfg.eval_guidance, resolution=cfg.resolution,
                                    max_sequence_length=cfg.max_sequence_length, batch=cfg.reward_batch,
                                    accelerator=self.accelerator, transformer=self.transformer, seed=cfg.eval_seed)

    def shipped(self) -> dict | None:
        """The toy world's shortcut for the evaluation before training: a run from iteration 0 evaluates the base
        model (LoRA's B = 0), whose values of every image the shipped checkpoint carries when the run's evaluation
        settings are the ones they were computed with (toyworld.shipped_heldout_values). Only the grid's first
        images are recomputed; if they agree, their images with the shipped values, else None (evaluate
        everything)."""
        shipped, print_ = toyworld.shipped_heldout_values(self.cfg), self.accelerator.print
        if shipped is None:
            return None
        result = self.images(GRID_IMAGES)
        if torch.allclose(result["values"]["reward"], shipped["reward"][:GRID_IMAGES], atol=1e-5):
            print_(f"eval before: the checkpoint's shipped values (its first {GRID_IMAGES} images recomputed and equal)")
            return result | {"values": shipped, "summary": summarize(shipped)}
        print_(f"eval before: the checkpoint's shipped values disagree with a fresh evaluation of its first "
               f"{GRID_IMAGES} images on this machine; evaluating all {self.cfg.eval_samples}")
        return None

    def changes(self, tag: str) -> dict[str, float]:
        """The paired change of the reward against "before" (the same images: its first ones, on the way with
        --eval-subset), and of every reward of weight 0 (reported, not trained on: the gold beside a learned proxy,
        `--rewards toyscore:1,toy:0`), eval/<name>_change; {} before training or at "before" itself."""
        if "before" not in self.values or tag == "before":
            return {}
        now = self.values[tag]
        before = {k: v[:len(now["reward"])] for k, v in self.values["before"].items()}
        out = dict(zip(("eval/change", "eval/change_se"), paired_change(before["reward"], now["reward"])))
        for name in [k for k, w in config.parse_weights(self.cfg.rewards).items() if w == 0]:
            out.update(zip((f"eval/{name}_change", f"eval/{name}_change_se"), paired_change(before[name], now[name])))
        return out

    def write(self, tag: str, iteration: int, result: dict, summary: dict) -> None:
        """samples_<tag>.png (also to the tracker) and eval_<tag>.json with every image's values."""
        first = slice(0, GRID_IMAGES)
        grid = save_grid(result["images"][first], os.path.join(self.cfg.output_dir, f"samples_{tag}.png"),
                         captions=captions(self.prompts, result["index"][first], result["values"]["reward"]))
        log_grid(self.accelerator, grid, iteration)
        with open(os.path.join(self.cfg.output_dir, f"eval_{tag}.json"), "w") as f:
            json.dump({"iteration": iteration, **summary, "per_image": per_image(result["values"])}, f, indent=1)


def log_grid(accelerator, grid, step: int):
    """The evaluation's image grid (H, W, 3) uint8 next to the curves, in whichever tracker is on."""
    for tracker in accelerator.trackers:
        if tracker.name == "tensorboard":
            tracker.log_images({"eval/samples": grid[None]}, step, dataformats="NHWC")
        elif tracker.name == "wandb":
            tracker.log_images({"eval/samples": [grid]}, step)


def decode_and_score(pipe, reward_fn, latents: torch.Tensor, prompts: list[str], metadata: list[dict], batch: int):
    """Decode and score latents (M, C, h, w) in chunks of `batch`: total (M,) and components {name: (M,)}, on the
    CPU in float32 (training's rewards of completions, the judge audit's continuations)."""
    totals, parts = [], {}
    for start in range(0, latents.shape[0], batch):
        sl = slice(start, start + batch)
        images = models.decode(pipe, latents[sl])  # (m, 3, H, W) in [0, 1]
        total, comps = reward_fn(images, prompts[sl], metadata[sl])
        totals.append(total.float().cpu())
        for name, v in comps.items():
            parts.setdefault(name, []).append(v.float().cpu())
    return torch.cat(totals), {name: torch.cat(v) for name, v in parts.items()}  # (M,), {name: (M,)}


def summarize(values: dict) -> dict:
    """{metric: (M,) per-image values} -> {metric: mean, metric_std: population std, metric_se: SE of the mean},
    over the images with a value: NaN marks none, and a metric with any gets metric_failed, their count."""
    summary = {}
    for k, v in values.items():
        ok = v[~v.isnan()]  # (M',) the images the metric could score
        summary[k] = ok.mean().item() if ok.numel() else math.nan
        summary[f"{k}_std"] = ok.std(unbiased=False).item() if ok.numel() else math.nan
        summary[f"{k}_se"] = (ok.std() / math.sqrt(ok.numel())).item() if ok.numel() > 1 else 0.0
        if ok.numel() < v.numel():
            summary[f"{k}_failed"] = v.numel() - ok.numel()
    return summary


def paired_change(before: torch.Tensor, after: torch.Tensor) -> tuple[float, float]:
    """Mean change of a per-image metric and its standard error from the paired differences (M,) -> (mean, SE).

    Before and after score the same images (same prompts, same noise), so the SE of the change is that of the
    per-image differences, std(after - before) / sqrt(M): what another draw of M evaluation images could move it.
    """
    d = after.double() - before.double()  # (M,)
    return d.mean().item(), (d.std() / math.sqrt(d.numel())).item()


def captions(prompts: list[str], index: torch.Tensor, values: torch.Tensor) -> list[str]:
    """'prompt\\nscore 0.75' for the images `index` (m,) of an evaluation whose per-image metric is `values` (M,)."""
    return [f"{prompts[i % len(prompts)]}\nscore {values[i]:.2f}" for i in index.tolist()]


def per_image(values: dict) -> dict:
    """{metric: (M,) tensor} -> {metric: [M floats]} for JSON: every run scores the same fixed-seed images, so
    two runs can be compared image by image (compare.py's paired standard error); NaN (no value) becomes null."""
    return {k: [None if math.isnan(x) else round(x, 6) for x in v.tolist()] for k, v in values.items()}


def format_summary(summary: dict) -> str:
    """'name mean +- se' for each metric (prefixes like 'eval/' kept)."""
    names = [k for k in summary if not k.endswith(("_std", "_se"))]
    return "  ".join(f"{k} {summary[k]:.4f}" + (f" +- {summary[k + '_se']:.4f}" if k + "_se" in summary else "")
                     for k in names)


GRID_CELL = 128  # pixels: small images are enlarged (nearest neighbour) to at least this side in grids


def save_grid(images: torch.Tensor, path: str, columns: int = 8, captions: list[str] | None = None):
    """Images (M, 3, H, W) in [0, 1] -> one PNG grid (no torchvision); returns the grid (rows, cols, 3) uint8.

    Images smaller than GRID_CELL are enlarged by an integer factor with nearest-neighbour sampling (32-pixel toy
    images stay crisp and legible); `captions` (one per image, lines split at newlines) are written under each.
    """
    M, _, H, W = images.shape
    scale = max(1, math.ceil(GRID_CELL / max(H, W)))
    h, w = H * scale, W * scale
    font = ImageFont.load_default(size=11)
    text_h = 0 if captions is None else 14 * max(len(c.split("\n")) for c in captions) + 4
    rows = math.ceil(M / columns)
    cell_h, cell_w = h + text_h + 6, w + 6  # 3-pixel white margins
    canvas = Image.new("RGB", (columns * cell_w, rows * cell_h), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    pixels = (images.float().cpu().clamp(0, 1).permute(0, 2, 3, 1) * 255).round().to(torch.uint8)  # (M, H, W, 3)
    pixels = pixels.numpy()
    for i in range(M):
        r, c = divmod(i, columns)
        x, y = c * cell_w + 3, r * cell_h + 3
        canvas.paste(Image.fromarray(pixels[i]).resize((w, h), Image.NEAREST), (x, y))
        if captions is not None:
            draw.multiline_text((x, y + h + 2), captions[i], fill=(0, 0, 0), font=font, spacing=2)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    canvas.save(path)
    return np.asarray(canvas)


def plot_history(history_path: str, png: str, summaries: dict | None = None) -> None:
    """The training reward (mean over the iteration's trajectories) against iterations, from metrics.jsonl, with
    the held-out score at every evaluation; `summaries` {"before": summary, "after": summary} adds the first and last
    held-out points with their standard errors as error bars."""
    if not os.path.exists(history_path):
        return
    rows = [json.loads(line) for line in open(history_path)]
    fig = Figure(figsize=(5.5, 3.4), dpi=120)
    ax = fig.subplots()
    its, reward = [r["iteration"] for r in rows], [r["reward/mean"] for r in rows]
    ax.plot(its, reward, color="tab:gray", alpha=0.5, lw=1, label="training reward (R_sde, each iteration)")
    trailing = [sum(reward[max(0, i - 4):i + 1]) / len(reward[max(0, i - 4):i + 1]) for i in range(len(reward))]
    ax.plot(its, trailing, color="black", lw=1.5, label="training reward, 5-iteration mean")
    points = [(r["iteration"], r["eval/reward"], r.get("eval/reward_se", 0.0)) for r in rows if "eval/reward" in r]
    if summaries and "before" in summaries:
        points.insert(0, (0, summaries["before"]["eval/reward"], summaries["before"]["eval/reward_se"]))
    if points:
        x, y, se = zip(*sorted(set(points)))
        ax.errorbar(x, y, yerr=se, fmt="o-", color="tab:red", capsize=3, label="held-out score (+- SE)")
        for xi, yi in ((x[0], y[0]), (x[-1], y[-1])):
            ax.annotate(f"{yi:.3f}", (xi, yi), textcoords="offset points", xytext=(4, 6), fontsize=8,
                        color="tab:red")
    after = (summaries or {}).get("after", {})
    if "eval/change" in after:  # the paired change, the number that says whether the held-out score moved
        ax.set_title(f"held-out change {after['eval/change']:+.3f} +- {after['eval/change_se']:.3f} (paired SE) = "
                     f"{after['eval/change'] / max(after['eval/change_se'], 1e-12):+.1f} SE", fontsize=9)
    ax.set_xlabel("iteration")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png)


def final_report(accelerator, summaries: dict, history_path: str, cfg) -> None:
    """The end of a training run (main process): its reward curve (reward_curve.png), every evaluation's summary line
    and the held-out change in paired standard errors."""
    plot_history(history_path, os.path.join(cfg.output_dir, "reward_curve.png"), summaries)
    for tag, summary in summaries.items():
        accelerator.print(f"eval {tag}: " + format_summary(summary))
    if "eval/change" in summaries.get("after", {}):
        change, se = summaries["after"]["eval/change"], summaries["after"]["eval/change_se"]
        accelerator.print(f"held-out change {change:+.4f} +- {se:.4f} (paired SE over {cfg.eval_samples} images) = "
                          f"{change / max(se, 1e-12):+.1f} SE")


def load_checkpoint_weights(pipe, checkpoint: str, ema: bool) -> str:
    """Put a train.py checkpoint's LoRA (or EMA LoRA, or full transformer) into the pipeline; returns the folder.

    `checkpoint` is a training checkpoint (iter-NNNNNN with lora/ and lora_ema/) or a folder holding
    pytorch_lora_weights.safetensors directly.
    """
    problem = check_checkpoint(checkpoint) if os.path.isfile(os.path.join(checkpoint, MANIFEST)) else ""
    if problem:  # a training checkpoint (iter-NNNNNN, best) is checked against its manifest, as --resume does
        raise ValueError(f"checkpoint {checkpoint} is damaged: {problem}; evaluate another checkpoint")
    folder = checkpoint
    sub = "lora_ema" if ema else "lora"
    if os.path.isdir(os.path.join(checkpoint, sub)):
        folder = os.path.join(checkpoint, sub)
    elif ema:
        raise ValueError(f"--ema: {checkpoint} has no lora_ema/ (was EMA off in training?); drop --ema")
    if os.path.isdir(os.path.join(folder, "transformer")):
        pipe.transformer = type(pipe.transformer).from_pretrained(os.path.join(folder, "transformer")).to(
            pipe.transformer.device, pipe.transformer.dtype).eval()
        return folder
    if not os.path.isfile(os.path.join(folder, "pytorch_lora_weights.safetensors")):
        raise ValueError(f"cannot read checkpoint '{checkpoint}': no lora/, lora_ema/, transformer/ or "
                         f"pytorch_lora_weights.safetensors there; pass a folder written by train.py")
    try:
        pipe.load_lora_weights(folder)
    except Exception as e:
        raise ValueError(f"cannot load the LoRA in '{folder}' into {type(pipe.transformer).__name__} "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); was it trained on this "
                         f"--model?") from e
    return folder


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="tiny", help=f"preset for model, prompts, steps, CFG, rewards: "
                   f"{', '.join(config.PRESETS)}")
    p.add_argument("--checkpoint", required=True, help="train.py checkpoint folder, a LoRA folder, or 'none'")
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights (lora_ema/)")
    p.add_argument("--model", help="override the preset's base model")
    # the flags train.py also has are named as there (config.py) and mean the same evaluation setting
    p.add_argument("--eval-prompts", help="override the preset's evaluation prompts (.txt or GenEval .jsonl)")
    p.add_argument("--rewards", help="override the metrics, 'name:w,...' (rewards.py)")
    p.add_argument("--eval-samples", type=int, help="number of images (prompts cycled)")
    p.add_argument("--eval-steps", type=int, help="ODE steps")
    p.add_argument("--eval-guidance", type=float, help="CFG scale")
    p.add_argument("--resolution", type=int, help="image side in pixels (the tiny test models need 32)")
    p.add_argument("--model-paths", default="", help="reward models' local files or folders, 'key=path,...' with "
                   "the keys of rewards.DEFAULT_MODELS (e.g. aesthetic=sac+logos+ava1-l14-linearMSE.pth, "
                   "imagereward=DIR, unifiedreward=DIR); others come from the hub")
    p.add_argument("--reward-batch", type=int, default=16, help="images per sampling/reward call")
    p.add_argument("--output-dir", help="folder for eval.json and grid.png (default: next to the checkpoint)")
    args = p.parse_args(argv)
    if args.task not in config.PRESETS:
        p.error(f"unknown task '{args.task}'; choose one of {', '.join(config.PRESETS)}")
    # the flags shared with train.py override the preset and are range-checked as there (config.RANGES)
    shared = {k: getattr(args, k) for k in ("eval_samples", "eval_steps", "eval_guidance", "resolution",
                                            "reward_batch") if getattr(args, k) is not None}
    cfg = config.Config(**dict(config.PRESETS[args.task], task=args.task, **shared))
    problem = config.check_ranges(cfg)
    if problem:
        p.error(problem)
    model = args.model or cfg.model
    steps, guidance, samples, resolution = cfg.eval_steps, cfg.eval_guidance, cfg.eval_samples, cfg.resolution
    try:
        model_paths = config.parse_model_paths(args.model_paths)
    except ValueError as e:
        p.error(str(e))
    unknown = sorted(set(model_paths) - set(rewards.DEFAULT_MODELS))
    if unknown:
        p.error(f"unknown --model-paths key(s) {unknown}; known: {', '.join(sorted(rewards.DEFAULT_MODELS))}")
    out = args.output_dir or (os.path.join(args.checkpoint, "eval") if args.checkpoint != "none"
                          else os.path.join(cfg.output_dir, "eval_base"))

    accelerator = Accelerator()
    try:
        prompts, metadata = config.load_prompt_set(args.eval_prompts or cfg.eval_prompts)
        if args.checkpoint != "none" and not os.path.isdir(args.checkpoint):
            raise ValueError(f"checkpoint '{args.checkpoint}' is not a folder; pass one written by train.py")
        dtype = torch.bfloat16 if accelerator.device.type == "cuda" else torch.float32
        pipe = models.load_pipeline(model, dtype, accelerator.device)
        if args.checkpoint != "none":
            load_checkpoint_weights(pipe, args.checkpoint, args.ema)
        reward_fn = rewards.load_rewards(config.parse_weights(args.rewards or cfg.rewards), accelerator.device,
                                         model_paths=model_paths, batch_size=cfg.reward_batch)
    except (models.ModelLoadError, rewards.RewardLoadError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    seed = config.eval_seed_for(args.eval_prompts or cfg.eval_prompts, cfg.eval_seed)  # toy:validation has its own
    result = sample_and_score(pipe, prompts, metadata, reward_fn, samples=samples, steps=steps, guidance=guidance,
                              resolution=resolution, max_sequence_length=cfg.max_sequence_length,
                              batch=cfg.reward_batch, accelerator=accelerator, seed=seed)
    summary = result["summary"]
    if accelerator.is_main_process:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "eval.json"), "w") as f:
            json.dump({"checkpoint": args.checkpoint, "ema": args.ema, "model": model, "samples": samples,
                       "steps": steps, "guidance": guidance, "resolution": resolution, "seed": seed, **summary,
                       "per_image": per_image(result["values"])},
                      f, indent=1)
        save_grid(result["images"][:GRID_IMAGES], os.path.join(out, "grid.png"),
                  captions=captions(prompts, result["index"][:GRID_IMAGES], result["values"]["reward"]))
        names = [k for k in summary if not k.endswith(("_std", "_se"))]
        print(f"{'metric':<28} {'mean':>10} {'std':>10} {'se':>10}   ({samples} images, {steps} steps, w={guidance})")
        for k in names:
            std, se = summary.get(k + "_std"), summary.get(k + "_se")
            print(f"{k:<28} {summary[k]:>10.4f} " + (f"{std:>10.4f} {se:>10.4f}" if std is not None else ""))
        print(f"wrote {os.path.join(out, 'eval.json')} and {os.path.join(out, 'grid.png')}")
    # as in train.py: all processes meet, then each destroys its process group (left to exit, gloo can abort)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary


if __name__ == "__main__":
    main()
