"""ToyScore: the toy world's learned, PickScore-like reward. It stands in for the paper's headline reward (Sec. 5:
PickScore, a CLIP fine-tuned on human preference pairs; Kirstain et al. 2023, "Pick-a-Pic", Sec. 4 for the
objective), trained PickScore's way, shipped as toyscore/ and scored by rewards.py's own `pickscore` code (the
reward `toyscore`). The programmatic score `toy` (toyworld.py) plays the humans: it labels the preference pairs, and
it stays the gold metric, so the laboratory can see a method over-optimise the proxy (lab/README.md, 'ToyScore').

  1. the model: a tiny transformers CLIPModel, a ViT over 4x4-pixel patches of the 32 px image and a text tower
     over toy_model/'s tokenizer (the world's words, read letter by letter), and the folder rewards.py loads;
  2. phase 1, contrastive (CLIP): rendered scenes and their captions, symmetric InfoNCE, hard negatives;
  3. phase 2, preferences (PickScore): two of the toy checkpoint's own images of one training caption, the one
     with the higher programmatic score preferred, softmax over the pair's scaled similarities;
  4. the held-out agreement with the programmatic score, written to toyscore/recipe.json.

Run (one thread: the command then reproduces the weights bit for bit on the same machine and torch build):
  python -m lab.toyscore train --out toyscore       # the shipped toyscore/ from scratch (13 min, 1 shared core)
  python -m lab.toyscore evaluate --model toyscore  # its held-out agreement (what recipe.json holds)
  python -m pytest tests/test_toyscore.py

Shape legend: K the world's 48 captions, b scenes of a contrastive batch (b = K), P preference pairs, n images (or
trajectories), W window steps (a trajectory has W+1 completions), D the embedding width, H/W pixels (32).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, CLIPConfig, CLIPModel, CLIPTextConfig, CLIPVisionConfig

import config
import evaluate as evaluation
import models
import rewards
import sampler as S
import toyworld
from lab import judge
from lab.sweep import machine

# ----------------------------------------------------------------------------------------------------------------
# 1. The model and its folder
# ----------------------------------------------------------------------------------------------------------------

TOKENIZER = os.path.join(config.TOY_MODEL, "tokenizer")  # CLIPTokenizer over the world's words (lab/toymodel.py)
WIDTH, LAYERS, HEADS, PATCH, PROJECTION = 64, 3, 4, 4, 32  # both towers; 8x8 patches + CLS = 65 image tokens
# preprocessor_config.json: size and crop 32, so rewards.clip_preprocess keeps the 32 px image as it is; CLIP's
# normalisation (openai/clip-vit-large-patch14's constants)
PROCESSOR = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": toyworld.RESOLUTION},
             "crop_size": {"height": toyworld.RESOLUTION, "width": toyworld.RESOLUTION},
             "do_resize": True, "do_center_crop": True, "do_normalize": True, "resample": 3,
             "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
RECIPE = "recipe.json"


def build_model(seed: int) -> CLIPModel:
    """A fresh CLIPModel of the sizes above (~0.33M parameters), initialised from `seed`."""
    vocab = len(AutoTokenizer.from_pretrained(TOKENIZER))
    towers = dict(hidden_size=WIDTH, intermediate_size=4 * WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS)
    # the tokenizer's ids: <|startoftext|> 0, <|endoftext|> 1 (also the padding); the text tower pools at the first 1
    text = CLIPTextConfig(vocab_size=vocab, max_position_embeddings=77, bos_token_id=0, eos_token_id=1,
                          pad_token_id=1, **towers)
    vision = CLIPVisionConfig(image_size=toyworld.RESOLUTION, patch_size=PATCH, **towers)
    torch.manual_seed(seed)  # CLIPModel draws its initial weights from the global generator
    return CLIPModel(CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=PROJECTION))


def save(folder: str, model: CLIPModel, recipe: dict) -> None:
    """The folder rewards.load_pickscore reads: the model (safetensors), the tokenizer, the image config, the recipe."""
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(TOKENIZER).save_pretrained(folder)
    write_json(PROCESSOR, os.path.join(folder, "preprocessor_config.json"))
    write_json(recipe, os.path.join(folder, RECIPE))


def write_json(obj: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


class Towers:
    """The model with the tokenizer and image config it is scored with: embeddings through rewards.py's own
    clip_image_features / clip_text_features (the `pickscore` reward's preprocessing), with gradients."""

    def __init__(self, model: CLIPModel):
        self.model, self.tokenizer = model, AutoTokenizer.from_pretrained(TOKENIZER)
        self.image_cfg = rewards.clip_image_config(PROCESSOR, "cpu")
        self.captions = [toyworld.caption(m) for m in toyworld.all_metadata()]  # K, the world's every caption

    def images(self, images: torch.Tensor) -> torch.Tensor:
        return rewards.clip_image_features(self.model, self.image_cfg, images)  # (n, D)

    def texts(self) -> torch.Tensor:
        return rewards.clip_text_features(self.model, self.tokenizer, self.captions, "cpu")  # (K, D)

    def scale(self) -> torch.Tensor:
        return self.model.logit_scale.exp()  # CLIP's learned temperature, PickScore's score scale


def caption_index(metas: list[dict]) -> torch.Tensor:
    """The index of each metadata's caption among all_metadata()'s K: (n,)."""
    order = {toyworld.caption(m): i for i, m in enumerate(toyworld.all_metadata())}
    return torch.tensor([order[toyworld.caption(m)] for m in metas])  # (n,)


# ----------------------------------------------------------------------------------------------------------------
# 2. Phase 1: contrastive (CLIP) on rendered scenes, with hard negatives
# ----------------------------------------------------------------------------------------------------------------

def hard_negatives(metas: list[dict], gen: torch.Generator) -> tuple[list[dict], list[dict]]:
    """Each scene with another colour (uniform over the other K_c - 1) and with another count (the other 3)."""
    colours, n = list(toyworld.COLORS), len(metas)
    dc = torch.randint(1, len(colours), (n,), generator=gen)  # (n,) palette steps: never the true colour
    dk = torch.randint(1, len(toyworld.COUNTS), (n,), generator=gen)  # (n,) count steps: never the true count
    colour = [m | {"color": colours[(colours.index(m["color"]) + int(s)) % len(colours)]} for m, s in zip(metas, dc)]
    count = [m | {"count": (m["count"] - 1 + int(s)) % len(toyworld.COUNTS) + 1} for m, s in zip(metas, dk)]
    return colour, count


def contrastive_batch(step: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s batch: every caption once, each on a fresh training layout (generation seeds of training
    examples step*K .. step*K + K-1), then the same layouts under another colour and under another count.
    Returns images (3K, 3, H, W) and each image's caption index (3K,); rows 0..K-1 are the scenes, in caption order."""
    metas = toyworld.all_metadata()
    seeds = [toyworld.generation_seed("train", step * len(metas) + i) for i in range(len(metas))]
    colour, count = hard_negatives(metas, gen)
    every = metas + colour + count
    return toyworld.render(every, seeds * 3), caption_index(every)  # (3K, 3, H, W), (3K,)


def contrastive_loss(scale: torch.Tensor, img: torch.Tensor, txt: torch.Tensor, caption: torch.Tensor) -> torch.Tensor:
    """CLIP's symmetric InfoNCE (Radford et al. 2021) with hard negatives. img (3b, D): unit embeddings of b scenes
    (rows 0..b-1, scene i showing caption i) and their hard negatives; txt (K, D) of every caption; caption (3b,)
    each image's caption index.

    image -> text: every image against all K captions of the world (its colour- and count-swapped captions among
    them); text -> image: caption i of scene i against all 3b images, where the hard-negative images (the same
    layouts in another colour or count) compete; an image that shows caption i but is not scene i is masked out
    (a second positive is no negative)."""
    b = caption.shape[0] // 3
    logits = scale * img @ txt.T  # (3b, K) s * cos(image, text)
    # L = 1/2 [CE(image -> its caption) + CE(caption -> its scene)]
    image_to_text = F.cross_entropy(logits, caption)
    rows = torch.arange(b)
    text_to_image = logits[:, caption[:b]].T  # (b, 3b) caption of scene i against every image
    other_positive = caption[None, :] == caption[:b, None]  # (b, 3b)
    other_positive[rows, rows] = False
    text_to_image = text_to_image.masked_fill(other_positive, float("-inf"))  # (b, 3b)
    return (image_to_text + F.cross_entropy(text_to_image, rows)) / 2


# ----------------------------------------------------------------------------------------------------------------
# 3. Phase 2: preference pairs of the toy checkpoint's own samples (PickScore's objective)
# ----------------------------------------------------------------------------------------------------------------

def sample_pool(members: int, rounds: int, seed: int, captions: int = 48) -> dict:
    """The toy checkpoint's images as training sees them: `rounds` x `members` trajectories of each of the first
    `captions` training captions (judge.toy_trajectories: the tiny preset's T, window and noise level a), and all
    W+1 ODE completions of each (R_0 is the plain ODE sample, R_W the SDE sample). Returns {"images" (n, 3, H, W)
    8-bit quantised as the scorer sees them, "caption" (n,), "toy" (n,) the programmatic score, "by_caption"
    (captions, m) the images of each caption, "noise_level" a}."""
    cfg, pipe, toy, _ = judge.toy_setup()
    images, scores, caption = [], [], []
    for r in range(rounds):
        ro, _, R, _, group = judge.toy_trajectories(pipe, cfg, toy, members, cfg.noise_level,
                                                    S.member_seed(seed, r, -3, 0), captions)  # R (n, W+1)
        images.append(rewards._quantize(models.decode(pipe, ro.completions.flatten(0, 1))))  # (n*(W+1), 3, H, W)
        scores.append(R.flatten())  # (n*(W+1),) trajectory-major, as the images
        caption.append(group.repeat_interleave(R.shape[1]))  # (n*(W+1),)
    caption = torch.cat(caption)  # (N,)
    by_caption = torch.stack([torch.nonzero(caption == c)[:, 0] for c in range(captions)])  # (captions, m)
    return {"images": torch.cat(images), "caption": caption, "toy": torch.cat(scores), "by_caption": by_caption,
            "noise_level": cfg.noise_level}


def draw_pairs(by_caption: torch.Tensor, P: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """P pairs of two different images of one caption (caption uniform, then two distinct images): (P,), (P,)."""
    K, m = by_caption.shape
    c = torch.randint(K, (P,), generator=gen)  # (P,)
    i = torch.randint(m, (P,), generator=gen)  # (P,)
    j = (i + torch.randint(1, m, (P,), generator=gen)) % m  # (P,) never i
    return by_caption[c, i], by_caption[c, j]


def preference_labels(gold_a: torch.Tensor, gold_b: torch.Tensor) -> torch.Tensor:
    """PickScore's labels from the gold scores (P,) x 2: [1, 0] when a is preferred, [0, 1] when b, [0.5, 0.5] for a
    tie (as Pick-a-Pic's ties; kept, not dropped: two images the gold cannot tell apart should score alike). (P, 2)"""
    a_wins = (gold_a > gold_b).float() + 0.5 * (gold_a == gold_b).float()  # (P,)
    return torch.stack([a_wins, 1 - a_wins], 1)  # (P, 2)


def preference_loss(scale: torch.Tensor, cos_a: torch.Tensor, cos_b: torch.Tensor, labels: torch.Tensor):
    """PickScore's objective: p = softmax(s * [cos(x_a, t), cos(x_b, t)]) over the pair, cross-entropy against the
    preference labels (P, 2); cos_a, cos_b (P,) the pair's image-text cosines for its caption t."""
    logits = scale * torch.stack([cos_a, cos_b], 1)  # (P, 2) the pair's PickScores
    # L = -sum_j label_j log softmax(logits)_j
    return -(labels * logits.log_softmax(1)).sum(1).mean()


# ----------------------------------------------------------------------------------------------------------------
# 4. The recipe and the held-out agreement
# ----------------------------------------------------------------------------------------------------------------

CONTRASTIVE_STEPS, PREFERENCE_STEPS, PAIRS = 600, 600, 64
CONTRASTIVE_LR, PREFERENCE_LR, WARMUP = 1e-3, 3e-4, 50
MEMBERS, ROUNDS = 4, 4  # the pool: 4 x 4 trajectories of each caption, 6 completions each: 96 images per caption
HELDOUT_TRAJECTORY_SEED = 4_000_037  # held-out trajectories' noise: no training pool's, no evaluation's


def train(out: str | None, seed: int = 0, contrastive_steps: int = CONTRASTIVE_STEPS,
          preference_steps: int = PREFERENCE_STEPS, pairs: int = PAIRS, members: int = MEMBERS,
          rounds: int = ROUNDS, captions: int = 48, log=print) -> dict:
    """Phase 1 then phase 2 from `seed` (every draw on a generator seeded from it); saves toyscore's folder to
    `out` with its recipe and held-out agreement (None: neither saved nor evaluated, e.g. in tests). `captions`
    < 48 samples the pool from the first captions only (tests). Returns {"model", "seconds", "losses"}."""
    model = build_model(seed).train()
    towers, gen = Towers(model), torch.Generator().manual_seed(seed)
    seconds, losses, start = {}, {"contrastive": [], "preference": []}, time.perf_counter()
    opt = torch.optim.AdamW(model.parameters(), lr=CONTRASTIVE_LR, weight_decay=0.01)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    for step in range(contrastive_steps):
        images, caption = contrastive_batch(step, gen)  # (3K, 3, H, W), (3K,)
        loss = contrastive_loss(towers.scale(), towers.images(images), towers.texts(), caption)
        _step(opt, loss, model)
        warmup.step()
        losses["contrastive"].append(loss.item())
        _progress(log, "contrastive", step, contrastive_steps, losses["contrastive"], start)
    seconds["contrastive"] = time.perf_counter() - start

    pool = sample_pool(members, rounds, seed, captions)
    seconds["pool"] = time.perf_counter() - start - seconds["contrastive"]
    log(f"pool: {len(pool['toy'])} images of {captions} captions in {seconds['pool']:.0f} s")
    opt = torch.optim.AdamW(model.parameters(), lr=PREFERENCE_LR, weight_decay=0.01)
    for step in range(preference_steps):
        a, b = draw_pairs(pool["by_caption"], pairs, gen)  # (P,), (P,)
        img = towers.images(pool["images"][torch.cat([a, b])])  # (2P, D)
        txt = towers.texts()[pool["caption"][a]]  # (P, D) the pair's caption
        cos_a, cos_b = (img[:pairs] * txt).sum(-1), (img[pairs:] * txt).sum(-1)  # (P,) each
        loss = preference_loss(towers.scale(), cos_a, cos_b, preference_labels(pool["toy"][a], pool["toy"][b]))
        _step(opt, loss, model)
        losses["preference"].append(loss.item())
        _progress(log, "preference", step, preference_steps, losses["preference"], start)
    seconds["preference"] = time.perf_counter() - start - seconds["contrastive"] - seconds["pool"]
    model.eval().requires_grad_(False)
    if out is not None:
        recipe = {"command": f"python -m lab.toyscore train --out {out} --seed {seed}", "seed": seed,
                  "model": {"width": WIDTH, "layers": LAYERS, "heads": HEADS, "patch": PATCH,
                            "projection": PROJECTION, "parameters": sum(p.numel() for p in model.parameters())},
                  "contrastive": {"steps": contrastive_steps, "scenes": len(toyworld.all_metadata()),
                                  "lr": CONTRASTIVE_LR, "warmup": WARMUP,
                                  "hard_negatives": "another colour, another count"},
                  "preference": {"steps": preference_steps, "pairs": pairs, "lr": PREFERENCE_LR, "ties": "[0.5, 0.5]",
                                 "pool": {"captions": captions, "trajectories_per_caption": members * rounds,
                                          "images": len(pool["toy"]), "noise_level": pool["noise_level"]}},
                  "seconds": seconds, "machine": machine()}
        save(out, model, recipe)
        recipe["agreement"] = agreement(out, log)
        recipe["seconds"]["agreement"] = time.perf_counter() - start - sum(seconds.values())
        write_json(recipe, os.path.join(out, RECIPE))
    return {"model": model, "seconds": seconds, "losses": losses}


def _step(opt: torch.optim.Optimizer, loss: torch.Tensor, model: CLIPModel) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def _progress(log, phase: str, step: int, steps: int, losses: list[float], start: float) -> None:
    if (step + 1) % 50 == 0 or step + 1 == steps:
        recent = losses[-50:]
        log(f"{phase} step {step + 1:4d}/{steps} | loss {sum(recent) / len(recent):.4f} | "
            f"{time.perf_counter() - start:5.0f} s")


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson's correlation of two (n,) series."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()  # (n,) each
    return (x @ y / (x.norm() * y.norm())).item()


def ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 0..n-1 of (n,) values, tied values sharing their mean rank (what Spearman's correlation needs: the
    programmatic score has many ties). (n,) float64"""
    values, inverse = torch.unique(x, return_inverse=True)  # sorted distinct values, (n,) which one each is
    count = torch.bincount(inverse, minlength=len(values)).double()  # (distinct,)
    first = torch.cumsum(count, 0) - count  # (distinct,) the rank of each value's first occurrence
    return (first + (count - 1) / 2)[inverse]  # (n,)


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    return pearson(ranks(x), ranks(y))


def pair_accuracy(score: torch.Tensor, gold: torch.Tensor, group: torch.Tensor) -> tuple[float, int]:
    """Over every pair of images of one group (caption) whose gold differs: the share the score orders as the gold
    does (a tie in the score counts as wrong), and the number of such pairs. score, gold, group (n,)."""
    same = group[:, None] == group[None, :]  # (n, n)
    gold_order = torch.sign(gold[:, None] - gold[None, :])  # (n, n)
    counted = same & (gold_order > 0)  # (n, n) each pair once, the gold's winner in the row
    right = counted & (score[:, None] > score[None, :])  # (n, n)
    return right.sum().item() / max(counted.sum().item(), 1), int(counted.sum())


def render_agreement(score_fn, n: int = toyworld.HELDOUT_SIZE) -> dict:
    """The held-out split's first n examples rendered (the correct scene) against the same layout under another
    colour and under another count, scored for the correct caption: how often the correct scene scores higher.
    The wrong colour and count are fixed by the example's index (colour + 1 + i mod 3, count + 1 + i mod 3)."""
    prompts, metas, seeds = toyworld.dataset("heldout", 0, n)
    colours, K = list(toyworld.COLORS), len(toyworld.COUNTS)
    colour = [m | {"color": colours[(colours.index(m["color"]) + 1 + i % 3) % len(colours)]}
              for i, m in enumerate(metas)]
    count = [m | {"count": (m["count"] + i % 3) % K + 1} for i, m in enumerate(metas)]
    score = lambda ms: score_fn(toyworld.render(ms, seeds), prompts, metas)  # noqa: E731  (n,) for the true caption
    right = score(metas)  # (n,)
    return {"correct_vs_wrong_colour": (right > score(colour)).float().mean().item(),
            "correct_vs_wrong_count": (right > score(count)).float().mean().item(), "renders": n}


def scorer(folder: str):
    """The ToyScore of a folder through the `toyscore` reward (rewards.load_pickscore), with the gold beside it."""
    both = rewards.load_rewards({"toyscore": 1.0, "toy": 0.0}, model_paths={"toyscore": folder})
    raw = lambda images, prompts, metas: both(images, prompts, metas)[1]["toyscore_raw"]  # noqa: E731  (n,)
    return both, raw


def agreement(folder: str, log=print) -> dict:
    """ToyScore (raw, as papers report PickScore) against the programmatic score on held-out images:
    the held-out evaluation's 1024 ODE samples of the toy checkpoint (toyworld.HELDOUT_SETTINGS, what eval/toy
    scores), 2 held-out-noise trajectories of each caption with their W+1 completions (what training scores; the
    pairs of consecutive completions are the d_k that turning points read), and renders."""
    both, raw = scorer(folder)
    cfg, pipe, _, _ = judge.toy_setup()
    prompts, metas = config.load_prompt_set(cfg.eval_prompts)
    out = evaluation.sample_and_score(pipe, prompts, metas, both, cfg.eval_samples, cfg.eval_steps,
                                      cfg.eval_guidance, cfg.resolution, cfg.max_sequence_length, batch=64,
                                      seed=cfg.eval_seed)
    score, gold = out["values"]["toyscore_raw"], out["values"]["toy"]  # (M,) each
    accuracy, pairs = pair_accuracy(score, gold, caption_index(metas[:cfg.eval_samples]))
    result = {"heldout_samples": {"images": cfg.eval_samples, "pearson": pearson(score, gold),
                                  "spearman": spearman(score, gold), "pair_accuracy": accuracy, "pairs": pairs}}
    ro, _, R, _, group = judge.toy_trajectories(pipe, cfg, rewards.load_rewards({"toy": 1.0}), 2, cfg.noise_level,
                                                HELDOUT_TRAJECTORY_SEED)  # R (n, W+1) the gold of every completion
    traj_metas = [toyworld.all_metadata()[g] for g in group.tolist() for _ in range(R.shape[1])]  # (n*(W+1),)
    proxy = judge.reward_of(pipe, both, ro.completions.flatten(0, 1), [toyworld.caption(m) for m in traj_metas],
                            traj_metas).reshape(R.shape)  # (n, W+1) ToyScore / 26
    d, d_gold = proxy.diff(dim=1), R.diff(dim=1)  # (n, W) each: d_k = R_k - R_{k-1}
    moved = d_gold != 0  # (n, W)
    result["heldout_trajectories"] = {
        "trajectories": R.shape[0], "images": R.numel(), "pearson": pearson(proxy.flatten(), R.flatten()),
        "spearman": spearman(proxy.flatten(), R.flatten()),
        "pair_accuracy": pair_accuracy(proxy.flatten(), R.flatten(), group.repeat_interleave(R.shape[1]))[0],
        "d_sign_agreement_where_gold_moves": (torch.sign(d) == torch.sign(d_gold))[moved].float().mean().item(),
        "d_zero_gold": 1 - moved.float().mean().item(), "d_zero_toyscore": (d == 0).float().mean().item()}
    result["renders"] = render_agreement(raw)
    log(json.dumps(result, indent=1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="make toyscore/ from scratch: contrastive, then preference pairs")
    tr.add_argument("--out", default="toyscore")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--contrastive-steps", type=int, default=CONTRASTIVE_STEPS)
    tr.add_argument("--preference-steps", type=int, default=PREFERENCE_STEPS)
    ev = sub.add_parser("evaluate", help="held-out agreement of a ToyScore folder with the programmatic score")
    ev.add_argument("--model", default="toyscore")
    ev.add_argument("--write", action="store_true", help="write it into the folder's recipe.json")
    for p in (tr, ev):
        p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: bit-for-bit reproducible)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.command == "train":
        if args.contrastive_steps < 0 or args.preference_steps < 0:
            parser.error("steps must be >= 0")
        train(args.out, args.seed, args.contrastive_steps, args.preference_steps)
        print(f"saved to {args.out}")
    else:
        if not os.path.isfile(os.path.join(args.model, RECIPE)):
            parser.error(f"{args.model} is no ToyScore folder (no {RECIPE}); make one with `python -m lab.toyscore "
                         f"train --out {args.model}`")
        result = agreement(args.model)
        if args.write:
            recipe = json.load(open(os.path.join(args.model, RECIPE)))
            write_json(recipe | {"agreement": result}, os.path.join(args.model, RECIPE))


if __name__ == "__main__":
    main()
