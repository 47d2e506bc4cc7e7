"""The toy world: compositional prompts, a seeded renderer and a GenEval-like programmatic reward.

Why it exists: nobody can check on a CPU that RL fine-tuning of a text-to-image model LEARNS. Random-weight models
draw noise and SD3.5-M needs a GPU. This file keeps the paper's story at 32x32 pixels: prompts such as
"three blue circles" (the GenEval "counting" and "colors" tasks, paper Sec. 5.1) and a programmatic reward with
graded partial credit; lab/toymodel.py pretrains a tiny flow model in this world that often draws the wrong colour,
so that GRPO (`train.py --task tiny`) has something to improve in a few CPU minutes.

  1. the world: caption grammar, seeded renderer, train / held-out / validation splits of generation seeds,
  2. the reward: colour quantization by hue + connected components (OpenCV), batched, with its components,
  3. the held-out evaluation `train.py --task tiny` runs (HELDOUT_SETTINGS) and the validation one that lab/compare.py
     chooses hyperparameters on (VALIDATION_SETTINGS).

Run: `python -m pytest tests/test_toyworld.py`; the world is used by config.py (the "toy:train" / "toy:heldout"
/ "toy:validation" prompt sets), rewards.py (the "toy" reward) and lab/toymodel.py (pretraining data).

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

Shape legend: N images, H/W image height/width in pixels (32), K palette colours (4). No window length W appears
in this file.
"""

from __future__ import annotations

import json
import os

import cv2
import numpy as np
import torch
from PIL import Image, ImageDraw

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
HELDOUT_SIZE = 1024  # held-out examples train.py evaluates on (train.py "toy:heldout"); validation has as many
# Validation example i has generation seed VALIDATION_OFFSET + 2i + 1: odd like the held-out seeds (so never a
# training layout) and far beyond any held-out set (which would need 2**39 examples to reach it)
VALIDATION_OFFSET = 2**40
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


SPLITS = ("train", "heldout", "validation")


def generation_seed(split: str, index: int) -> int:
    """Example `index` of a split is generated from seed 2*index (train), 2*index + 1 (held-out) or
    VALIDATION_OFFSET + 2*index + 1 (validation): no two splits share a seed, so no held-out or validation layout
    is ever a training image, and choosing hyperparameters on validation never looks at a held-out example."""
    if split not in SPLITS:
        raise ValueError(f"unknown split '{split}'; use one of {', '.join(SPLITS)}")
    return 2 * index + (split != "train") + (VALIDATION_OFFSET if split == "validation" else 0)


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
# 3. The held-out evaluation
# ----------------------------------------------------------------------------------------------------------------

# The held-out evaluation `train.py --task tiny` runs before training, as its Config fields; the checkpoint ships
# its values (HELDOUT_EVAL) so that a run spends its minutes on training and evaluates only once, after it.
# eval_seed 2_000_003 is config.EVAL_SEED, every task's evaluation noise (image i: noise seed (eval_seed, i)).
HELDOUT_EVAL = "heldout_eval.json"
HELDOUT_SETTINGS = {"eval_prompts": "toy:heldout", "eval_samples": HELDOUT_SIZE, "eval_steps": STEPS,
                    "eval_guidance": 1.0, "rewards": "toy:1", "resolution": RESOLUTION,
                    "max_sequence_length": MAX_SEQUENCE_LENGTH, "eval_seed": 2_000_003}
# The validation evaluation (lab/compare.py chooses hyperparameters on it; the held-out split is only reported): its
# own captions (the validation split's generation seeds) and its own noise, shipped too (VALIDATION_EVAL)
VALIDATION_EVAL = "validation_eval.json"
VALIDATION_SETTINGS = dict(HELDOUT_SETTINGS, eval_prompts="toy:validation", eval_seed=3_000_017)
SHIPPED_EVALS = {"heldout": (HELDOUT_EVAL, HELDOUT_SETTINGS), "validation": (VALIDATION_EVAL, VALIDATION_SETTINGS)}


def shipped_heldout_values(cfg) -> dict[str, torch.Tensor] | None:
    """The base model's evaluation values shipped beside it (cfg.model/HELDOUT_EVAL or VALIDATION_EVAL, written by
    `python -m lab.toymodel pretrain`), when the run's evaluation settings (a config.Config) are exactly the ones they
    were computed with; else None. A run from iteration 0 starts from the base model (LoRA's B = 0), so its
    "before" evaluation IS these values, and train.py recomputes only the first images to check them."""
    for filename, _ in SHIPPED_EVALS.values():
        path = os.path.join(cfg.model, filename)
        if not os.path.isfile(path):
            continue
        saved = json.load(open(path))
        if all(getattr(cfg, k) == v for k, v in saved["settings"].items()):
            return {k: torch.tensor(v) for k, v in saved["per_image"].items()}  # {metric: (M,)}
    return None
