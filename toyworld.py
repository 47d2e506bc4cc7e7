"""The toy world: compositional prompts, a GenEval-like programmatic reward and a tiny pretrained pixel-space SD3.

Why it exists: nobody can check on a CPU that RL fine-tuning of a text-to-image model LEARNS. Random-weight models
draw noise and SD3.5-M needs a GPU. This file keeps the paper's story at 32x32 pixels: prompts such as
"three blue circles" (the GenEval "counting" and "colors" tasks, paper Sec. 5.1), a programmatic reward with
graded partial credit, and a pretrained flow model that often draws the wrong colour, so that GRPO
(`train.py --task tiny`) has something to improve in a few CPU minutes. It is the real SD3 code path: a diffusers
StableDiffusion3Pipeline (SD3Transformer2DModel + two CLIP + T5 text encoders + FlowMatchEulerDiscreteScheduler
with shift 3), only tiny, and in pixel space (vae=None: the transformer denoises RGB pixels in [-1, 1]).

  1. the world: caption grammar, seeded renderer, train / held-out split of generation seeds,
  2. the reward: colour quantization by hue + connected components (OpenCV), batched, with its components,
  3. the tiny pipeline (~0.6M-parameter transformer, random frozen text encoders) and its held-out evaluation,
  4. rectified-flow pretraining (x_sigma = (1 - sigma) x0 + sigma x1, v = x1 - x0) and the checkpoint's recipe.

Run:
  python toyworld.py pretrain --out toy_model      # the shipped checkpoint from scratch, bit for bit (~35 min)
  python toyworld.py evaluate --model toy_model    # held-out score +- SE on 1024 images, strict, colour, count
  python toyworld.py evaluate --model toy_model --grid samples.png     # also save a picture of the samples
  python -m pytest tests/test_toyworld.py

The reward (documented again at `toy_components`): per image, with the prompt's count k and colour c, n_c the
objects of colour c found, and ink = the pixels with colour (not white, grey or a faint fringe),
  colour = (ink pixels whose hue is nearest to c's) / (ink pixels)   (0 without ink),
  count  = max(0, 1 - |n_c - k| / k),
  score  = (colour + count) / 2       the training reward and the held-out score, continuous in [0, 1],
  strict = [n_c = k and no object of another colour]   evaluation accuracy: every requirement exactly met.
Both terms are graded, as real reward models are: a drawing that is half the right colour, or one object short,
earns part of the credit, so the members of a group are ranked and the completions' rewards R_k move by small
steps (the turning points of the paper need d_k of both signs, not a reward stuck at a few levels).
Shape is not rewarded: the tiny model does not draw recognisable shapes (shape words still condition it).

Shape legend: N images, b a pretraining batch, H/W image height/width in pixels, K palette colours. The tiny model
works in pixel space, so its latents are images (3, H, W) too; no window length W appears in this file.

The shipped toy_model/ (`python toyworld.py pretrain`, `make_toy_model`: 1200 clean steps of batch 64, then 200
steps at lr 3e-4 with half the captions naming a wrong colour; seed 0, 1 thread; EMA weights, 2.9 MB): held-out
score 0.382 +- 0.013 (1024 images, T = 6, no CFG), strict 0.145, colour 0.449, count 0.315. It draws the asked
colour for about half the images and often a mix: the room GRPO fills first (the clean checkpoint of phase 1
scores colour 0.97, and counting alone improved too slowly to be seen in minutes).

IMPORTANT for callers: the checkpoint was trained with T5 prompts padded to MAX_SEQUENCE_LENGTH = 16 tokens. SD3
passes no attention mask, so the padding length changes the conditioning: always call
`sampler.encode_prompts(pipe, prompts, w, max_sequence_length=MAX_SEQUENCE_LENGTH)` with this model (16 instead of
sampler's default 128 also makes every transformer call ~2x cheaper: 77 + 16 text tokens instead of 77 + 128).

Shape legend: N images (b in a pretraining batch), H/W pixels (32), K colours (4), L text tokens (77 CLIP + 16 T5),
D text width (64).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import cv2
import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from PIL import Image, ImageDraw

import evaluate as evaluation
import sampler

# ----------------------------------------------------------------------------------------------------------------
# 1. The world: captions, metadata, the renderer, the train / held-out split
# ----------------------------------------------------------------------------------------------------------------

RESOLUTION = 32
COUNTS = ("one", "two", "three", "four")  # count word k-1 -> k objects
COLORS = {"red": (230, 25, 25), "green": (25, 178, 38), "blue": (38, 64, 230), "yellow": (242, 204, 13)}  # RGB
SHAPES = ("circle", "square", "triangle")
# Whole-word tokens for the tiny tokenizers (plural forms included: "two circles" must not be spelled out).
WORDS = list(COUNTS) + list(COLORS) + [w for s in SHAPES for w in (s, s + "s")]
MAX_SEQUENCE_LENGTH = 16  # T5 tokens: 3 words + </s> fit easily; see the module docstring
SIZE_RANGE = (8, 11)  # object bounding-box side in pixels (inclusive)
GAP = 3  # minimum empty pixels between two bounding boxes: anti-aliased edges of neighbours never touch
MARGIN = 1  # pixels kept free at the image border
SUPERSAMPLE = 4  # draw at 4x and box-filter down: realistic anti-aliased edges for the reward to cope with
HELDOUT_SIZE = 1024  # held-out examples train.py evaluates on (train.py "toy:heldout")
STEPS = 6  # T of `train.py --task tiny`, in training and evaluation (the paper's FLUX.1-dev schedule)


def caption(meta: dict) -> str:
    """{"count": 3, "color": "blue", "shape": "square"} -> "three blue squares" (plural for k > 1)."""
    k = meta["count"]
    return f"{COUNTS[k - 1]} {meta['color']} {meta['shape']}{'s' if k > 1 else ''}"


def parse_caption(prompt: str) -> dict:
    """The inverse of `caption`; a prompt outside the grammar raises a one-line ValueError."""
    words = prompt.strip().lower().split()
    if len(words) == 3 and words[0] in COUNTS and words[1] in COLORS:
        k = COUNTS.index(words[0]) + 1
        shape = words[2][:-1] if k > 1 and words[2].endswith("s") else words[2]
        meta = {"count": k, "color": words[1], "shape": shape}
        if shape in SHAPES and caption(meta) == " ".join(words):
            return meta
    raise ValueError(f"prompt '{prompt}' is not a toy-world caption; expected '<count> <colour> <shape>[s]' "
                     f"like 'three blue squares' (counts {COUNTS}, colours {tuple(COLORS)}, shapes {SHAPES})")


def all_metadata() -> list[dict]:
    """The 48 (count, colour, shape) combinations, in a fixed order."""
    return [{"count": k, "color": c, "shape": s} for k in range(1, len(COUNTS) + 1) for c in COLORS for s in SHAPES]


def generation_seed(split: str, index: int) -> int:
    """Example `index` of a split is generated from seed 2*index (train) or 2*index + 1 (held-out): the two splits
    never share a seed, so no held-out layout is ever a training image."""
    if split not in ("train", "heldout"):
        raise ValueError(f"unknown split '{split}'; use 'train' or 'heldout'")
    return 2 * index + (split == "heldout")


def dataset(split: str, start: int, n: int) -> tuple[list[str], list[dict], list[int]]:
    """Examples start .. start+n-1 of a split: (prompts, metadata, generation seeds). Count, colour and shape are
    uniform and independent; the same seed also fixes the layout when the example is rendered."""
    seeds = [generation_seed(split, i) for i in range(start, start + n)]
    metas = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        metas.append({"count": int(rng.integers(1, len(COUNTS) + 1)), "color": list(COLORS)[rng.integers(len(COLORS))],
                      "shape": SHAPES[rng.integers(len(SHAPES))]})
    return [caption(m) for m in metas], metas, seeds


def _apart(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    """Are two boxes (x, y, side) at least GAP pixels apart along x or along y?"""
    (xa, ya, sa), (xb, yb, sb) = a, b
    return xa + sa + GAP <= xb or xb + sb + GAP <= xa or ya + sa + GAP <= yb or yb + sb + GAP <= ya


def layout(count: int, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """`count` non-touching boxes (x, y, side) by rejection sampling. If they do not fit, the largest allowed side
    shrinks; a fixed 2x2 grid is the last resort (never needed in practice, but it makes the guarantee total)."""
    for largest in range(SIZE_RANGE[1], SIZE_RANGE[0] - 1, -1):
        boxes = []
        for _ in range(200):
            side = int(rng.integers(SIZE_RANGE[0], largest + 1))
            x, y = (int(v) for v in rng.integers(MARGIN, RESOLUTION - MARGIN - side + 1, size=2))
            if all(_apart((x, y, side), b) for b in boxes):
                boxes.append((x, y, side))
                if len(boxes) == count:
                    return boxes
    return [(2 + 16 * (i % 2), 2 + 16 * (i // 2), 10) for i in range(count)]


def render_one(meta: dict, seed: int) -> np.ndarray:
    """One image (H, W, 3) uint8: meta["count"] objects of one colour and shape on white, layout from `seed`."""
    if not 1 <= meta["count"] <= len(COUNTS) or meta["color"] not in COLORS or meta["shape"] not in SHAPES:
        raise ValueError(f"bad metadata {meta}; count 1..{len(COUNTS)}, colour in {tuple(COLORS)}, shape in {SHAPES}")
    rng = np.random.default_rng([seed, 1])  # the layout stream, independent of dataset()'s metadata draws
    big = Image.new("RGB", (RESOLUTION * SUPERSAMPLE,) * 2, (255, 255, 255))
    draw = ImageDraw.Draw(big)
    for x, y, side in layout(meta["count"], rng):
        x0, y0 = x * SUPERSAMPLE, y * SUPERSAMPLE
        x1, y1 = (x + side) * SUPERSAMPLE - 1, (y + side) * SUPERSAMPLE - 1
        if meta["shape"] == "circle":
            draw.ellipse([x0, y0, x1, y1], fill=COLORS[meta["color"]])
        elif meta["shape"] == "square":
            inset = side * SUPERSAMPLE // 10  # ~ the circle's area, so object size does not give the shape away
            draw.rectangle([x0 + inset, y0 + inset, x1 - inset, y1 - inset], fill=COLORS[meta["color"]])
        else:
            draw.polygon([(x0, y1), (x1, y1), ((x0 + x1) / 2, y0)], fill=COLORS[meta["color"]])
    return np.asarray(big.resize((RESOLUTION, RESOLUTION), Image.BOX))  # (H, W, 3) anti-aliased


def render(metas: list[dict], seeds: list[int]) -> torch.Tensor:
    """Ground-truth images (N, 3, H, W) float32 in [0, 1]."""
    images = np.stack([render_one(m, s) for m, s in zip(metas, seeds, strict=True)])  # (N, H, W, 3) uint8
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255  # (N, 3, H, W)


# ----------------------------------------------------------------------------------------------------------------
# 2. The reward: what a GenEval detector would see, done with colour quantization and connected components
# ----------------------------------------------------------------------------------------------------------------

CHROMA_MIN = 0.25  # "ink" = max(rgb) - min(rgb) above this; white, greys and faint fringes/noise are background
MIN_AREA = 8  # components smaller than this (pixels at 32x32, scaled with image area) are stray pixels, not objects


def hue_degrees(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hue in degrees and chroma of RGB values in [0, 1], (..., 3) -> (...), (...). Hue is what survives blending
    with the white background: a half-covered red edge pixel (1, .55, .55) has the hue of red, only less chroma."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    hi, lo = rgb.max(-1), rgb.min(-1)
    chroma = hi - lo  # (...)
    safe = np.where(chroma > 0, chroma, 1.0)
    # The standard hexagonal hue: which channel is largest picks the sector, the other two the position in it.
    hue = np.select([hi == r, hi == g], [((g - b) / safe) % 6, (b - r) / safe + 2], (r - g) / safe + 4) * 60
    return hue, chroma


PALETTE_HUES = hue_degrees(np.array(list(COLORS.values())) / 255)[0]  # (K,) red ~0, yellow ~50, green ~125, blue ~230


def ink_labels(images: torch.Tensor) -> np.ndarray:
    """The palette colour every pixel shows: (N, 3, H, W) in [0, 1] -> (N, H, W) int, colour index in COLORS order,
    -1 for background. A pixel is ink when its chroma reaches CHROMA_MIN; it takes the palette colour of nearest hue
    (a hue band of the circle around each palette hue), so anti-aliased edges keep their object's colour."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (N, 3, H, W) RGB in [0, 1], got shape {tuple(images.shape)}")
    rgb = images.detach().float().clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()  # (N, H, W, 3)
    hue, chroma = hue_degrees(rgb)  # (N, H, W) each
    circular = np.abs((hue[..., None] - PALETTE_HUES + 180) % 360 - 180)  # (N, H, W, K) hue distance
    return np.where(chroma >= CHROMA_MIN, circular.argmin(-1), -1)  # (N, H, W)


def count_objects(images: torch.Tensor, labels: np.ndarray | None = None) -> torch.Tensor:
    """Objects of each colour per image: (N, 3, H, W) in [0, 1] -> (N, K) int64, K = colours in COLORS order.

    Each colour's mask (`ink_labels`) is split into 8-connected components (cv2.connectedComponentsWithStats) and
    the components of at least MIN_AREA pixels are objects. Consequence, by design: two same-coloured objects
    that touch (even at a corner) are ONE object, as a detector would see one blob; the renderer keeps GAP >= 3
    empty pixels between objects, so ground truth never touches. `labels`: `ink_labels(images)` if already known.
    """
    label = ink_labels(images) if labels is None else labels  # (N, H, W)
    min_area = MIN_AREA * images.shape[2] * images.shape[3] / RESOLUTION**2
    counts = np.zeros((images.shape[0], len(COLORS)), dtype=np.int64)  # (N, K)
    for i in range(images.shape[0]):
        for c in range(len(COLORS)):
            mask = (label[i] == c).astype(np.uint8)  # (H, W)
            _, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)  # stats (1 + components, 5)
            counts[i, c] = int((stats[1:, cv2.CC_STAT_AREA] >= min_area).sum())  # row 0 is the background
    return torch.from_numpy(counts)


def toy_components(images: torch.Tensor, prompts: list[str], metadata: list[dict] | None = None) -> dict:
    """The reward's parts per image, each (N,) float32 on the CPU: "colour", "count", "score", "strict".

    metadata (one {"count", "color", "shape"} dict per image) is what the prompts ask for; without it the prompts
    are parsed. With k = the prompt's count, c its colour, n_x the objects found of colour x (`count_objects`)
    and ink pixels labelled by `ink_labels`:
      colour = (ink pixels of colour c) / (all ink pixels), 0 without ink   (graded: a half-red, half-blue drawing
                                                                             earns half; painting every colour
                                                                             at once does not pay)
      count  = max(0, 1 - |n_c - k| / k)                                     (graded: one object too many or too
                                                                             few for "four" still earns 3/4)
      score  = (colour + count) / 2     the training reward and the held-out score: GenEval-style partial credit
                                        whose terms are themselves graded, as real reward models are continuous
      strict = [n_c = k and n_x = 0 for every x != c]   evaluation accuracy: every requirement exactly met
    """
    metas = metadata if metadata is not None else [parse_caption(p) for p in prompts]
    if len(prompts) != images.shape[0] or len(metas) != images.shape[0]:
        raise ValueError(f"got {images.shape[0]} images, {len(prompts)} prompts and {len(metas)} metadata entries; "
                         f"pass one prompt (and one metadata dict) per image")
    labels = ink_labels(images)  # (N, H, W)
    label = torch.from_numpy(labels)  # (N, H, W)
    counts = count_objects(images, labels)  # (N, K)
    target = torch.tensor([list(COLORS).index(m["color"]) for m in metas])  # (N,) colour index c
    wanted = torch.tensor([m["count"] for m in metas])  # (N,) k
    ink = (label >= 0).flatten(1).sum(1)  # (N,) ink pixels
    right = (label == target[:, None, None]).flatten(1).sum(1)  # (N,) ink pixels of colour c
    colour = right / ink.clamp(min=1)  # (N,) 0 when there is no ink at all
    own = counts.gather(1, target[:, None])[:, 0]  # (N,) n_c
    others = counts.sum(1) - own  # (N,) objects of any other colour
    count = (1 - (own - wanted).abs() / wanted).clamp(min=0)  # (N,) 1 at n_c = k, 0 from |n_c - k| >= k
    strict = ((own == wanted) & (others == 0)).float()  # (N,)
    return {"colour": colour.float(), "count": count.float(), "score": ((colour + count) / 2).float(),
            "strict": strict}


# ----------------------------------------------------------------------------------------------------------------
# 3. The tiny pixel-space SD3 pipeline
# ----------------------------------------------------------------------------------------------------------------

WIDTH = 64  # SD3 wants T5 d_model = joint_attention_dim = pooled_projection_dim (2 x CLIP projection) = width


def build_pipeline(seed: int = 0) -> StableDiffusion3Pipeline:
    """A fresh (untrained) pixel-space SD3 pipeline: 4 joint-attention blocks of width 64 over 16x16 patches of 2x2
    RGB pixels (~0.59M parameters), random frozen text encoders with the world's words as whole T5 tokens (the
    in-memory CLIP tokenizers have no BPE merges, so CLIP reads the same words letter by letter)."""
    text = sampler.tiny_text_stack(seed, words=WORDS, width=WIDTH)
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=RESOLUTION, patch_size=2, in_channels=3, out_channels=3, num_layers=4, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=WIDTH, caption_projection_dim=WIDTH, pooled_projection_dim=WIDTH,
        pos_embed_max_size=RESOLUTION // 2)  # 16x16 patch grid (the default 96 would add 0.6M useless parameters)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)  # SD3.5-M's static shift
    return StableDiffusion3Pipeline(transformer=transformer, scheduler=scheduler, vae=None, **text)


def evaluate(pipe, samples: int = HELDOUT_SIZE, steps: int = STEPS, guidance_scale: float = 1.0) -> dict:
    """Held-out evaluation as `train.py --task tiny` runs it (evaluate.sample_and_score: the first `samples`
    held-out prompts, the evaluation's fixed noise, the T-step Euler ODE). Returns the components' means, the
    score's standard error, the count credit per asked count k, images/s, and the images with their prompts."""
    if samples < 2:
        raise ValueError(f"evaluation needs at least 2 samples for a standard error, got {samples}")
    prompts, metas, _ = dataset("heldout", 0, samples)

    def reward_fn(images, prm, meta):
        parts = toy_components(images, prm, meta)
        return parts["score"], parts

    start = time.perf_counter()
    out = evaluation.sample_and_score(pipe, prompts, metas, reward_fn, samples, steps, guidance_scale, RESOLUTION,
                                      MAX_SEQUENCE_LENGTH, batch=64)
    seconds = time.perf_counter() - start
    values, wanted = out["values"], torch.tensor([m["count"] for m in metas])  # {name: (N,)}, (N,)
    result = {name: values[name].mean().item() for name in ("score", "strict", "colour", "count")}
    result["score_se"] = out["summary"]["score_se"]
    result["count_by_k"] = {k: values["count"][wanted == k].mean().item() for k in range(1, len(COUNTS) + 1)}
    result["images_per_s"] = samples / seconds
    return result | {"images": out["images"], "prompts": prompts, "values": values}


# The held-out evaluation `train.py --task tiny` runs before training, as its Config fields; the checkpoint ships
# its values (HELDOUT_EVAL) so that a run spends its minutes on training and evaluates only once, after it.
HELDOUT_EVAL = "heldout_eval.json"
HELDOUT_SETTINGS = {"eval_prompts": "toy:heldout", "eval_samples": HELDOUT_SIZE, "eval_steps": STEPS,
                    "eval_guidance": 1.0, "rewards": "toy:1", "resolution": RESOLUTION,
                    "max_sequence_length": MAX_SEQUENCE_LENGTH}


def write_heldout_eval(folder: str, pipe) -> dict:
    """Evaluate `pipe` (the checkpoint saved in `folder`) under HELDOUT_SETTINGS and write every image's values to
    folder/HELDOUT_EVAL, named as train.py's evaluation names them (rewards.py "toy": the total "reward", the
    reward "toy" itself and its parts "toy_<name>"). train.py reads them as its "before" evaluation when its
    settings are these, after checking them against a fresh evaluation of the first images. Returns the result."""
    result = evaluate(pipe, HELDOUT_SETTINGS["eval_samples"], HELDOUT_SETTINGS["eval_steps"],
                      HELDOUT_SETTINGS["eval_guidance"])
    v = result["values"]
    per_image = {"reward": v["score"], "toy": v["score"], **{f"toy_{k}": v[k] for k in ("colour", "count", "strict")}}
    with open(os.path.join(folder, HELDOUT_EVAL), "w") as f:
        json.dump({"settings": HELDOUT_SETTINGS, "per_image": {k: x.tolist() for k, x in per_image.items()}}, f)
    return result


def format_result(r: dict, steps: int) -> str:
    by_k = " ".join(f"k={k}:{v:.2f}" for k, v in r["count_by_k"].items())
    return (f"held-out score {r['score']:.3f} +- {r['score_se']:.3f} (SE, n={len(r['prompts'])}) | strict "
            f"{r['strict']:.3f} | colour {r['colour']:.3f} | count {r['count']:.3f} ({by_k}) | "
            f"{r['images_per_s']:.1f} images/s at T={steps}")


# ----------------------------------------------------------------------------------------------------------------
# 4. Pretraining: rectified flow on rendered images (Sec. 3's convention), EMA weights shipped
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
        pipe = sampler.load_pipeline(init) if isinstance(init, str) else init
        pipe = StableDiffusion3Pipeline(**{**pipe.components, "transformer": copy.deepcopy(pipe.transformer)})
    # Every caption the world can say, plus "": encode once (frozen encoders), then index rows per batch.
    vocab = [caption(m) for m in all_metadata()] + [""]
    row_of = {p: i for i, p in enumerate(vocab)}
    cond = sampler.encode_prompts(pipe, vocab, 1.0, MAX_SEQUENCE_LENGTH)  # embeds (49, L, D), pooled (49, P)
    model = pipe.transformer.train().requires_grad_(True)
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    ema_pipe = StableDiffusion3Pipeline(**{**pipe.components, "transformer": ema})
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
        # EMA with a warm-up ((1 + t) / (10 + t)) so that the early average is not dominated by the random init
        decay = min(EMA_DECAY, (1 + step) / (10 + step))
        with torch.no_grad():
            for p_ema, p in zip(ema.parameters(), model.parameters()):
                p_ema.lerp_(p, 1 - decay)
        losses.append(loss.item())
        last = step + 1 == steps
        if (step + 1) % 25 == 0 or last:
            log(f"step {step + 1:5d} | loss {np.mean(losses[-25:]):.4f} | {time.perf_counter() - start:6.0f} s")
        if eval_every and ((step + 1) % eval_every == 0 or last):
            log("  EMA " + format_result(evaluate(ema_pipe, eval_samples), STEPS))
    if out is not None:
        ema_pipe.save_pretrained(out, safe_serialization=True)
    return {"losses": losses, "steps": len(losses), "seconds": time.perf_counter() - start, "pipe": ema_pipe}


def make_toy_model(out: str | None, seed: int = 0, steps: int = CLEAN_STEPS, noisy_steps: int = NOISY_STEPS,
                   noisy_lr: float = NOISY_LR, colour_noise: float = COLOUR_NOISE, init: str | None = None,
                   eval_every: int = 100, log=print) -> dict:
    """The shipped checkpoint in two phases, one command (`python toyworld.py pretrain`):

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
        log("held-out evaluation for train.py: " + format_result(write_heldout_eval(out, result["pipe"]), STEPS))
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
        pipe = sampler.load_pipeline(args.model)
        result = evaluate(pipe, args.samples, args.steps, args.guidance)
        print(format_result(result, args.steps))
        if args.grid:
            evaluation.save_grid(result["images"][:64], args.grid, columns=16)
            print(f"the first 64 samples saved to {args.grid} (held-out examples 0..63, row-major)")


if __name__ == "__main__":
    main()
