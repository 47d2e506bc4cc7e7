"""The toy world's model: a tiny pretrained pixel-space SD3, its held-out evaluation and its pretraining recipe.

A diffusers StableDiffusion3Pipeline (SD3Transformer2DModel + two CLIP + T5 text encoders +
FlowMatchEulerDiscreteScheduler with shift 3), only tiny and in pixel space (vae=None: the transformer denoises RGB
pixels in [-1, 1]), trained with rectified flow (paper Sec. 3's convention) on the renders of toyworld.py. It is
the real SD3 code path of sampler.py and train.py at a size two CPU cores train in minutes.

  1. the tiny pipeline (~0.6M-parameter transformer, random frozen text encoders) and its held-out evaluation,
  2. rectified-flow pretraining (x_sigma = (1 - sigma) x0 + sigma x1, v = x1 - x0) and the checkpoint's recipe.

Run:
  python -m lab.toymodel pretrain --out toy_model  # the shipped checkpoint from scratch, bit for bit (~35 min)
  python -m lab.toymodel evaluate --model toy_model   # held-out score +- SE on 1024 images, strict, colour, count
  python -m lab.toymodel evaluate --model toy_model --grid samples.png     # also save a picture of the samples
  python -m lab.toymodel evaluate --model toy_model --split validation --write   # (re)write the shipped validation values
  python -m pytest tests/test_toyworld.py

The shipped toy_model/ (`python -m lab.toymodel pretrain`, `make_toy_model`: 1200 clean steps of batch 64, then 200
steps at lr 3e-4 with half the captions naming a wrong colour; seed 0, 1 thread; EMA weights, 2.9 MB): held-out
score 0.382 +- 0.013 (1024 images, T = 6, no CFG), strict 0.145, colour 0.449, count 0.315. It draws the asked
colour for about half the images and often a mix: the room GRPO fills first (the clean checkpoint of phase 1
scores colour 0.97, and counting alone improved too slowly to be seen in minutes).

IMPORTANT for callers: the checkpoint was trained with T5 prompts padded to toyworld.MAX_SEQUENCE_LENGTH = 16
tokens. SD3 passes no attention mask, so the padding length changes the conditioning: always call
`models.encode_prompts(pipe, prompts, w, max_sequence_length=16)` with this model (16 instead of sampler's default
128 also makes every transformer call ~2x cheaper: 77 + 16 text tokens instead of 77 + 128).

Shape legend: N images (b in a pretraining batch), H/W pixels (32), L text tokens (77 CLIP + 16 T5), D text width
(64). The model works in pixel space, so its latents are images (3, H, W) too; no window length W appears here.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

import evaluate as evaluation
import models
import policy
from toyworld import (COLORS, COUNTS, HELDOUT_SIZE, MAX_SEQUENCE_LENGTH, RESOLUTION, SHIPPED_EVALS, STEPS, WORDS,
                      all_metadata, caption, dataset, render, toy_components)

# ----------------------------------------------------------------------------------------------------------------
# 1. The tiny pixel-space SD3 pipeline
# ----------------------------------------------------------------------------------------------------------------

WIDTH = 64  # SD3 wants T5 d_model = joint_attention_dim = pooled_projection_dim (2 x CLIP projection) = width


def build_pipeline(seed: int = 0) -> StableDiffusion3Pipeline:
    """A fresh (untrained) pixel-space SD3 pipeline: 4 joint-attention blocks of width 64 over 16x16 patches of 2x2
    RGB pixels (~0.59M parameters), random frozen text encoders with the world's words as whole T5 tokens (the
    in-memory CLIP tokenizers have no BPE merges, so CLIP reads the same words letter by letter)."""
    text = models.tiny_text_stack(seed, words=WORDS, width=WIDTH)
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=RESOLUTION, patch_size=2, in_channels=3, out_channels=3, num_layers=4, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=WIDTH, caption_projection_dim=WIDTH, pooled_projection_dim=WIDTH,
        pos_embed_max_size=RESOLUTION // 2)  # 16x16 patch grid (the default 96 would add 0.6M useless parameters)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)  # SD3.5-M's static shift
    return StableDiffusion3Pipeline(transformer=transformer, scheduler=scheduler, vae=None, **text)


def evaluate(pipe, samples: int = HELDOUT_SIZE, steps: int = STEPS, guidance_scale: float = 1.0,
             split: str = "heldout") -> dict:
    """Held-out (or validation) evaluation as `train.py --task tiny` runs it (evaluate.sample_and_score: the first
    `samples` prompts of the split, its fixed noise, the T-step Euler ODE). Returns the components' means, the
    score's standard error, the count credit per asked count k, images/s, and the images with their prompts."""
    if samples < 2:
        raise ValueError(f"evaluation needs at least 2 samples for a standard error, got {samples}")
    prompts, metas, _ = dataset(split, 0, samples)

    def reward_fn(images, prm, meta):
        parts = toy_components(images, prm, meta)
        return parts["score"], parts

    start = time.perf_counter()
    out = evaluation.sample_and_score(pipe, prompts, metas, reward_fn, samples=samples, steps=steps,
                                      guidance=guidance_scale, resolution=RESOLUTION,
                                      max_sequence_length=MAX_SEQUENCE_LENGTH, batch=64,
                                      seed=SHIPPED_EVALS[split][1]["eval_seed"])
    seconds = time.perf_counter() - start
    values, wanted = out["values"], torch.tensor([m["count"] for m in metas])  # {name: (N,)}, (N,)
    result = {name: values[name].mean().item() for name in ("score", "strict", "colour", "count")}
    result["score_se"] = out["summary"]["score_se"]
    result["count_by_k"] = {k: values["count"][wanted == k].mean().item() for k in range(1, len(COUNTS) + 1)}
    result["images_per_s"] = samples / seconds
    return result | {"images": out["images"], "prompts": prompts, "values": values}


def write_shipped_eval(folder: str, pipe, split: str = "heldout") -> dict:
    """Evaluate `pipe` (the checkpoint saved in `folder`) under the split's settings (toyworld.SHIPPED_EVALS:
    held-out or validation) and write every image's values to folder/<its file>, named as train.py's evaluation
    names them (rewards.py "toy": the total "reward", the reward "toy" itself and its parts "toy_<name>").
    train.py reads them as its "before" evaluation when its settings are these, after checking them against a
    fresh evaluation of the first images. Returns the result."""
    filename, settings = SHIPPED_EVALS[split]
    result = evaluate(pipe, settings["eval_samples"], settings["eval_steps"], settings["eval_guidance"], split)
    v = result["values"]
    per_image = {"reward": v["score"], "toy": v["score"], **{f"toy_{k}": v[k] for k in ("colour", "count", "strict")}}
    with open(os.path.join(folder, filename), "w") as f:
        json.dump({"settings": settings, "per_image": {k: x.tolist() for k, x in per_image.items()}}, f)
    return result


def format_result(r: dict, steps: int) -> str:
    by_k = " ".join(f"k={k}:{v:.2f}" for k, v in r["count_by_k"].items())
    return (f"held-out score {r['score']:.3f} +- {r['score_se']:.3f} (SE, n={len(r['prompts'])}) | strict "
            f"{r['strict']:.3f} | colour {r['colour']:.3f} | count {r['count']:.3f} ({by_k}) | "
            f"{r['images_per_s']:.1f} images/s at T={steps}")


# ----------------------------------------------------------------------------------------------------------------
# 2. Pretraining: rectified flow on rendered images (Sec. 3's convention), EMA weights shipped
# ----------------------------------------------------------------------------------------------------------------

EMPTY_CAPTION_RATE = 0.1  # captions dropped to "" so that the unconditional velocity (CFG) stays meaningful
# The shipped checkpoint's recipe (make_toy_model): clean steps, then noisy-caption steps
CLEAN_STEPS, NOISY_STEPS, NOISY_LR, COLOUR_NOISE = 1200, 200, 3e-4, 0.5
EMA_DECAY = 0.995
WARMUP_STEPS = 50


def misname_colours(metas: list[dict], rate: float, gen: torch.Generator) -> list[str]:
    """Captions of `metas`, each naming a wrong colour with probability `rate` (the wrong colour uniform over the
    other K-1); count and shape words stay true. Draws nothing from `gen` at rate 0, so clean pretraining keeps
    the random stream that made the shipped checkpoint."""
    if rate == 0:
        return [caption(m) for m in metas]
    n = len(metas)
    wrong = torch.rand(n, generator=gen) < rate  # (n,)
    shift = torch.randint(1, len(COLORS), (n,), generator=gen)  # (n,) palette steps 1..K-1: never the true colour
    names = list(COLORS)
    return [caption(m | {"color": names[(names.index(m["color"]) + int(k)) % len(names)]}) if w else caption(m)
            for m, w, k in zip(metas, wrong.tolist(), shift.tolist())]


def pretrain(out: str | None, steps: int, seed: int = 0, batch: int = 64, lr: float = 1e-3,
             eval_every: int = 100, eval_samples: int = 48,
             colour_noise: float = 0.0, init: str | StableDiffusion3Pipeline | None = None, log=print) -> dict:
    """Train the tiny pipeline's transformer from scratch (or from `init`, a saved pipeline's folder or a
    pipeline); save the EMA pipeline to `out` (None: do not save).

    Seeded and step-counted, so a command regenerates the same checkpoint (same torch build and thread count).
    Returns {"losses", "steps", "seconds", "pipe" (the EMA pipeline)}.

    Noisy captions: a fraction `colour_noise` of the training captions name a wrong colour (the image is rendered
    from the true metadata), as web alt-text misnames attributes. The model then draws the wrong colour, or a
    mix, for part of the samples: a weakness that a group of samples of one prompt can rank (`make_toy_model`).
    """
    if steps < 1 or batch < 1:
        raise ValueError(f"pretraining needs steps >= 1 and batch >= 1, got steps={steps}, batch={batch}")
    if not 0 <= colour_noise <= 1:
        raise ValueError(f"colour_noise is a fraction of captions, in [0, 1]; got {colour_noise}")
    if init is None:
        pipe = build_pipeline(seed)
    else:
        pipe = models.load_pipeline(init) if isinstance(init, str) else init
        pipe = StableDiffusion3Pipeline(**{**pipe.components, "transformer": copy.deepcopy(pipe.transformer)})
    # Every caption the world can say, plus "": encode once (frozen encoders), then index rows per batch.
    vocab = [caption(m) for m in all_metadata()] + [""]
    row_of = {p: i for i, p in enumerate(vocab)}
    cond = models.encode_prompts(pipe, vocab, 1.0, MAX_SEQUENCE_LENGTH)  # embeds (49, L, D), pooled (49, P)
    model = pipe.transformer.train().requires_grad_(True)
    # EMA of every weight, updated after every step with a warm-up (decay min(EMA_DECAY, (1 + s) / (10 + s))) so
    # that the early average is not dominated by the random init; swapped in to evaluate and to save
    ema = policy.EMA(list(model.parameters()), EMA_DECAY, every=1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP_STEPS))
    gen = torch.Generator().manual_seed(seed)
    losses, start = [], time.perf_counter()
    for step in range(steps):
        _, metas, gen_seeds = dataset("train", step * batch, batch)
        x0 = render(metas, gen_seeds) * 2 - 1  # (b, 3, H, W) data in [-1, 1]
        prompts = misname_colours(metas, colour_noise, gen)  # noisy captions, see the docstring
        rows = torch.tensor([row_of[p] for p in prompts])  # (b,)
        rows[torch.rand(batch, generator=gen) < EMPTY_CAPTION_RATE] = row_of[""]
        x1 = torch.randn(x0.shape, generator=gen)  # (b, 3, H, W) noise
        # Logit-normal sigma (SD3: sigmoid of N(0, 1)): most samples at mid noise, where the velocity is hardest.
        sigma = torch.sigmoid(torch.randn(batch, generator=gen))  # (b,)
        s = sigma[:, None, None, None]  # (b, 1, 1, 1)
        # Sec. 3 (docs/method.md, 'Flow matching and the Euler ODE step'): x_sigma = (1 - sigma) x0 + sigma x1;
        # the model predicts v = x1 - x0 at timestep sigma * 1000
        x_sigma = (1 - s) * x0 + s * x1  # (b, 3, H, W)
        v = model(hidden_states=x_sigma, timestep=sigma * 1000, encoder_hidden_states=cond.embeds[rows],
                  pooled_projections=cond.pooled[rows], return_dict=False)[0]  # (b, 3, H, W)
        loss = torch.nn.functional.mse_loss(v, x1 - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        warmup.step()
        ema.step()
        losses.append(loss.item())
        last = step + 1 == steps
        if (step + 1) % 25 == 0 or last:
            log(f"step {step + 1:5d} | loss {np.mean(losses[-25:]):.4f} | {time.perf_counter() - start:6.0f} s")
        if eval_every and ((step + 1) % eval_every == 0 or last):
            ema.swap()
            model.eval()
            with torch.no_grad():
                log("  EMA " + format_result(evaluate(pipe, eval_samples), STEPS))
            ema.swap()
            model.train()
    ema.swap()  # from here on the pipeline holds the EMA weights
    model.eval().requires_grad_(False)
    if out is not None:
        pipe.save_pretrained(out, safe_serialization=True)
    return {"losses": losses, "steps": len(losses), "seconds": time.perf_counter() - start, "pipe": pipe}


def make_toy_model(out: str | None, seed: int = 0, steps: int = CLEAN_STEPS, noisy_steps: int = NOISY_STEPS,
                   noisy_lr: float = NOISY_LR, colour_noise: float = COLOUR_NOISE, init: str | None = None,
                   eval_every: int = 100, log=print) -> dict:
    """The shipped checkpoint in two phases, one command (`python -m lab.toymodel pretrain`):

      1. `steps` clean steps (lr 1e-3, true captions): colours right, counts partly right;
      2. `noisy_steps` more steps from phase 1's EMA weights at `noisy_lr` with a fraction `colour_noise` of the
         captions naming a wrong colour: the model unlearns part of its colour knowledge, so that for a given
         prompt some samples take the right colour and some a wrong one or a mix. That is room GRPO can fill in
         minutes: a group of one prompt's samples differs exactly there, so the advantages point at it.

    steps = 0 skips phase 1 and starts phase 2 from `init`. Returns phase 2's result (pretrain's dict)."""
    if steps:
        log(f"phase 1: {steps} steps on true captions")
        init = pretrain(None, steps, seed, init=init, eval_every=eval_every, log=log)["pipe"]
    elif init is None:
        raise ValueError("steps=0 skips the clean phase and needs init (a pipeline to continue from)")
    log(f"phase 2: {noisy_steps} steps at lr {noisy_lr} with colour_noise {colour_noise}")
    result = pretrain(out, noisy_steps, seed, lr=noisy_lr, colour_noise=colour_noise, init=init,
                      eval_every=eval_every, log=log)
    if out is not None:
        for split in SHIPPED_EVALS:
            log(f"{split} evaluation for train.py: " + format_result(write_shipped_eval(out, result["pipe"], split),
                                                                     STEPS))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("pretrain", help="make the toy checkpoint from scratch: clean, then noisy-caption steps")
    pre.add_argument("--out", default="toy_model")
    pre.add_argument("--steps", type=int, default=CLEAN_STEPS, help="phase 1: clean optimizer steps (0: skip, "
                     "continue from --init)")
    pre.add_argument("--noisy-steps", type=int, default=NOISY_STEPS, help="phase 2: noisy-caption steps")
    pre.add_argument("--noisy-lr", type=float, default=NOISY_LR, help="phase 2's learning rate")
    pre.add_argument("--colour-noise", type=float, default=COLOUR_NOISE,
                     help="phase 2: fraction of training captions that name a wrong colour")
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--eval-every", type=int, default=100, help="steps between held-out checks (0: none)")
    pre.add_argument("--init", default=None, help="start from this saved pipeline instead of random weights")
    ev = sub.add_parser("evaluate", help="held-out score of a saved pipeline (T-step Euler ODE, no CFG)")
    ev.add_argument("--model", default="toy_model")
    ev.add_argument("--samples", type=int, default=HELDOUT_SIZE)
    ev.add_argument("--steps", type=int, default=STEPS)
    ev.add_argument("--guidance", type=float, default=1.0)
    ev.add_argument("--grid", default=None, help="also save the samples as a PNG here")
    ev.add_argument("--split", default="heldout", choices=list(SHIPPED_EVALS), help="held-out or validation prompts "
                    "and noise")
    ev.add_argument("--write", action="store_true", help="write the split's values of every image beside the model "
                    "(what pretrain does at its end; --samples etc. are then the split's settings)")
    for p in (pre, ev):
        # One thread: on 2 shared cores a second thread waits on the neighbours' jobs (measured 2-7 s/step with 2
        # threads vs a steady 1.1 s/step with 1); results may differ in the last bits between thread counts.
        p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.command == "pretrain":
        make_toy_model(args.out, args.seed, args.steps, args.noisy_steps, args.noisy_lr, args.colour_noise, args.init,
                       args.eval_every)
        print(f"saved to {args.out}")
    else:
        pipe = models.load_pipeline(args.model)
        result = (write_shipped_eval(args.model, pipe, args.split) if args.write
                  else evaluate(pipe, args.samples, args.steps, args.guidance, args.split))
        print(format_result(result, args.steps))
        if args.grid:
            evaluation.save_grid(result["images"][:64], args.grid, columns=16)
            print(f"the first 64 samples saved to {args.grid} (held-out examples 0..63, row-major)")


if __name__ == "__main__":
    main()
