"""Reward models R(image, prompt) for TP-GRPO (paper Sec. 5; docs/method.md, 'Rewards'), run in-process, batched.

Models are loaded once. TP-GRPO scores every ODE completion (W+1 images per trajectory, W the window length;
docs/method.md, 'Incremental rewards via ODE completions'), so each reward takes a whole batch of images as one
tensor and keeps its models resident. Rewards:

| name                    | model                                              | training value           |
|-------------------------|----------------------------------------------------|--------------------------|
| pickscore               | PickScore_v1 (CLIP-H): logit_scale * cos(img, txt) | score / 26 (Flow-GRPO)   |
| toyscore                | PickScore's code on toyscore/ (lab/toyscore.py)    | score / 26               |
| ocr                     | rapidocr PP-OCR (ONNX, bundled in the wheel)       | 1 - d / n (Flow-GRPO)    |
| ocr_demo                | same, n counting spaces (demo code's ocr.py)       | 1 - d / n_spaces         |
| geneval                 | Mask2Former (COCO instances) + CLIP-L/14 colours   | partial credit           |
| aesthetic               | LAION aesthetic predictor v2 on CLIP-L/14          | predicted rating (1-10)  |
| jpeg_compressibility    | JPEG size at quality 95 (DDPO)                     | -kilobytes               |
| jpeg_incompressibility  | same                                               | +kilobytes               |

Use:
    score = load_rewards({"pickscore": 1.0}, device="cuda", model_paths={"pickscore": "/models/PickScore_v1"})
    total, parts = score(images, prompts, metadata)       # images (N, 3, H, W) in [0, 1]
    prompts, metadata = config.load_prompts("dataset/geneval/test_metadata.jsonl")   # config.py

Model ids are Hugging Face ids; on an offline cluster download them once (`hf download ID --local-dir DIR`) and
pass model_paths={key: DIR} with the keys of DEFAULT_MODELS. Another file registers a reward by adding a loader
to REWARD_LOADERS: loader(device, batch_size=..., model_paths=..., **options) -> scorer(images, prompts,
metadata) returning (N,) or ((N,), {extra_name: (N,)}); quality.py registers the paper's general-quality metrics
(ImageReward, UnifiedReward) this way.

Shapes: N images in a call, n <= batch_size images in one model forward, Q Mask2Former queries, K detections,
H/W image height/width in pixels (H'/W' after Mask2Former's resizing and padding), D CLIP embedding width.
Rewards see only decoded images, never latents, so no window length W appears in a shape here and the pixels
keep the capitals.
"""

import functools
import io
import os
from pathlib import Path

import numpy as np
import rapidocr
import torch
import torch.nn.functional as F
from PIL import Image
from rapidfuzz.distance import Levenshtein
from rapidocr import RapidOCR
from torch import nn
from transformers import AutoTokenizer, CLIPModel
from transformers.image_processing_utils import ImageProcessingMixin
from transformers.models.mask2former.modeling_mask2former import (
    Mask2FormerForUniversalSegmentation, Mask2FormerModel, Mask2FormerPreTrainedModel)

import geneval
import toyworld

DEFAULT_MODELS = {
    "pickscore": "yuvalkirstain/PickScore_v1",
    # PickScore_v1 ships no processor; Flow-GRPO's PickScoreScorer takes tokenizer and image config from here.
    "pickscore_processor": "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
    # GenEval's colour classifier (open_clip "ViT-L-14", pretrained="openai") and the aesthetic predictor's backbone.
    "clip_l14": "openai/clip-vit-large-patch14",
    # DEVIATION: transformers' port of GenEval's mmdet mask2former_swin-s-p4-w7-224_8xb2-lsj-50e_coco (Swin-S, COCO
    # instances, 80 classes): mmdet is what users fail to install (docs/deviations.md, 'GenEval').
    "mask2former": "facebook/mask2former-swin-small-coco-instance",
    # No hub id: sac+logos+ava1-l14-linearMSE.pth from github.com/christophschuhmann/improved-aesthetic-predictor.
    "aesthetic": None,
    # The toy world's PickScore (lab/toyscore.py): a tiny CLIP with its tokenizer and a 32 px image config, shipped
    # beside this file (found from any working directory, like config.TOY_MODEL)
    "toyscore": os.path.join(os.path.dirname(os.path.abspath(__file__)), "toyscore"),
}
PICKSCORE_TRAIN_SCALE = 26.0  # Flow-GRPO's PickScoreScorer returns score / 26 for training
JPEG_QUALITY = 95  # DDPO ddpo_pytorch/rewards.py: image.save(buffer, "JPEG", quality=95); size = bytes / 1000


class RewardLoadError(RuntimeError):
    """A reward model could not be loaded (offline, gated, wrong id or path)."""


# ----------------------------------------------------------------------------------------------------------------
# Loading: once per process (lru_cache), every failure one line naming the model and the model_paths key.
# ----------------------------------------------------------------------------------------------------------------

def _source(key, model_paths):
    return str((model_paths or {}).get(key) or DEFAULT_MODELS[key])


def _hub_hint(key):
    if key == "toyscore":
        return "it ships with the repository; `python -m lab.toyscore train --out toyscore` remakes it"
    return (f"on an offline machine download it first (hf download {DEFAULT_MODELS[key]} --local-dir DIR) and pass "
            f"model_paths={{'{key}': DIR}}")


def _loaded(what, source, load, hint):
    try:
        return load()
    except Exception as e:  # hub, filesystem and config errors all mean "this model is not there"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if source.startswith(("/", ".", "~")) and not Path(source).expanduser().exists():
            reason = "no such file or folder"
        raise RewardLoadError(f"cannot load {what} from '{source}' ({reason}); {hint}") from e


@functools.lru_cache(maxsize=None)
def _load_clip(key, source, processor_key, processor_source, device):
    """CLIPModel from `source`; tokenizer and image preprocessing constants from `processor_source`."""
    model = _loaded(f"CLIP model '{key}'", source,
                    lambda: CLIPModel.from_pretrained(source, dtype=torch.float32).eval().to(device), _hub_hint(key))
    tokenizer = _loaded(f"tokenizer of '{key}'", processor_source,
                        lambda: AutoTokenizer.from_pretrained(processor_source), _hub_hint(processor_key))
    config = _loaded(f"image processor config of '{key}'", processor_source,
                     lambda: ImageProcessingMixin.get_image_processor_dict(processor_source)[0],
                     _hub_hint(processor_key))
    return model, tokenizer, clip_image_config(config, device)


def clip_image_config(config, device):
    """A CLIPImageProcessor's preprocessor_config.json (dict) -> clip_preprocess's keyword arguments."""
    size, crop = config["size"], config["crop_size"]
    return dict(size=size["shortest_edge"] if isinstance(size, dict) else int(size),
                crop=(crop["height"], crop["width"]) if isinstance(crop, dict) else (int(crop), int(crop)),
                mean=torch.tensor(config["image_mean"], device=device).view(1, 3, 1, 1),  # (1, 3, 1, 1)
                std=torch.tensor(config["image_std"], device=device).view(1, 3, 1, 1))  # (1, 3, 1, 1)


def _quantize(images):
    """Round to 8-bit levels: every reference scorer sees uint8 images (PIL or mmdet's loader)."""
    return (images.float().clamp(0, 1) * 255).round() / 255  # (N, 3, H, W)


def clip_preprocess(images, size, crop, mean, std):
    """CLIPImageProcessor on a tensor: shortest edge -> size (bicubic, antialiased like PIL), centre crop, normalize.

    Output size and crop offsets follow transformers' get_resize_output_image_size / center_crop exactly.
    """
    h, w = images.shape[-2:]
    short, long = min(h, w), max(h, w)
    new_long = int(size * long / short)
    new_hw = (new_long, size) if w <= h else (size, new_long)
    if crop[0] > new_hw[0] or crop[1] > new_hw[1]:
        raise ValueError(f"crop {crop} is larger than the resized image {new_hw}; check the processor config")
    x = F.interpolate(images, size=new_hw, mode="bicubic", antialias=True, align_corners=False)  # (N, 3, h', w')
    x = x.clamp(0, 1)  # PIL clips bicubic overshoot to the uint8 range
    top, left = (new_hw[0] - crop[0]) // 2, (new_hw[1] - crop[1]) // 2
    x = x[..., top:top + crop[0], left:left + crop[1]]  # (N, 3, crop_h, crop_w)
    return (x - mean) / std  # (N, 3, crop_h, crop_w)


def clip_image_features(model, image_cfg, images):
    """Unit CLIP image embeddings (n, D) of images (n, 3, H, W) in [0, 1]; differentiable (lab/toyscore.py trains
    through it, so ToyScore learns on exactly the pixels it scores)."""
    pixels = clip_preprocess(images, **image_cfg)  # (n, 3, 224, 224) (ToyScore: (n, 3, 32, 32))
    return F.normalize(model.get_image_features(pixel_values=pixels).pooler_output, dim=-1)  # (n, D)


def clip_text_features(model, tokenizer, texts, device):
    """Unit CLIP text embeddings (len(texts), D); differentiable, as clip_image_features."""
    tokens = tokenizer(texts, padding=True, truncation=True, max_length=77, return_tensors="pt").to(device)
    return F.normalize(model.get_text_features(**tokens).pooler_output, dim=-1)  # (len(texts), D)


def _chunks(n, batch_size):
    return [slice(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


# ----------------------------------------------------------------------------------------------------------------
# PickScore (Kirstain et al. 2023): human-preference CLIP-H fine-tune.
# ----------------------------------------------------------------------------------------------------------------

def load_pickscore(device, batch_size=16, model_paths=None, key="pickscore", processor_key="pickscore_processor",
                   **_):
    """Primary value: PickScore / 26 (Flow-GRPO's training scale); extra '<key>_raw' ('pickscore_raw') is what
    papers report. `key` / `processor_key` name the model and its tokenizer + image config in DEFAULT_MODELS and
    model_paths: the `toyscore` reward is this loader with both on the toyscore/ folder."""
    model, tokenizer, image_cfg = _load_clip(key, _source(key, model_paths), processor_key,
                                             _source(processor_key, model_paths), str(device))

    @torch.no_grad()
    def score(images, prompts, metadata):
        images, raw = _quantize(images), []
        for part in _chunks(len(prompts), batch_size):
            img = clip_image_features(model, image_cfg, images[part])  # (n, D)
            txt = clip_text_features(model, tokenizer, prompts[part], device)  # (n, D)
            # PickScore = exp(logit_scale) * cos(image, text)
            raw.append(model.logit_scale.exp() * (img * txt).sum(-1))  # (n,)
        raw = torch.cat(raw).float()  # (N,)
        return raw / PICKSCORE_TRAIN_SCALE, {f"{key}_raw": raw}

    return score


# ----------------------------------------------------------------------------------------------------------------
# OCR: Flow-GRPO's OcrScorer (flow_grpo/ocr.py): the target inside the recognized text scores 1, otherwise
# 1 - min(edit distance, n) / n; `ocr_demo` is the denominator of the demo code's flow_grpo/ocr.py.
# ----------------------------------------------------------------------------------------------------------------

OCR_DENOMINATORS = ("flow-grpo", "demo")


def ocr_target(prompt):
    """Text between the first pair of double quotes; the whole prompt if it has none (as the demo code's
    flow_grpo/ocr.py; Flow-GRPO's OcrScorer fails on such a prompt)."""
    # DEVIATION: an unpaired quote marks no text to render, so the whole prompt; upstream takes the text after it
    # (docs/deviations.md, 'OCR target with one unpaired quote').
    parts = prompt.split('"')
    return parts[1] if len(parts) >= 3 else prompt


def ocr_reward(recognized, target, denominator="flow-grpo"):
    """The OCR reward of Flow-GRPO's OcrScorer, both texts lower-cased with spaces removed (t = target, r = read):

        d = 0 if t occurs inside r, else min(Levenshtein(r, t), len(t));   reward = 1 - d / n

    with n = len(t), the target's length without spaces ("flow-grpo"), or n = the target's length WITH spaces
    ("demo": the TurningPoint-GRPO demo code's flow_grpo/ocr.py; its reward function imports a module missing from
    its repository, flow_grpo.ocr_mine, so which n the paper's OCR numbers use is not known; with "demo" a blank
    image scores 1 - len(t) / n > 0 for a target with spaces). An empty target scores 1 (nothing to render).
    """
    if denominator not in OCR_DENOMINATORS:
        raise ValueError(f"unknown OCR denominator '{denominator}'; use one of {OCR_DENOMINATORS}")
    read, t = recognized.replace(" ", "").lower(), target.replace(" ", "").lower()
    if not t:
        return 1.0
    # substring rule: extra text around a correct rendering (a sign's other words, a border read as "|") costs nothing
    d = 0 if t in read else min(Levenshtein.distance(read, t), len(t))
    n = len(t) if denominator == "flow-grpo" else len(target)
    return 1.0 - d / n


@functools.lru_cache(maxsize=None)
def _load_ocr_engine():
    """rapidocr with the det/rec ONNX files inside the wheel, named explicitly.

    rapidocr 3.x otherwise derives a file name from its download URL table (default_models.yaml), looks for it
    under <package>/models and downloads it if the checksum does not match; naming model_path directly skips
    that lookup, so nothing is ever downloaded. The recognizer's character table is stored in the ONNX metadata.
    The angle classifier is off, as Flow-GRPO's PaddleOCR(use_angle_cls=False).
    DEVIATION: rapidocr's bundled PP-OCR ONNX models, not Flow-GRPO's PaddleOCR (paddlepaddle is hard to install),
    so absolute OCR scores can differ slightly from the paper's (docs/deviations.md, 'OCR reward').
    """
    models = Path(rapidocr.__file__).parent / "models"
    det, rec = sorted(models.glob("*_det_*.onnx")), sorted(models.glob("*_rec_*.onnx"))
    if not det or not rec:
        raise RewardLoadError(f"rapidocr's bundled ONNX models are missing from {models}; reinstall rapidocr")
    def load():
        engine = RapidOCR(params={"Global.use_cls": False, "Global.log_level": "error",
                                  "Det.model_path": str(det[0]), "Rec.model_path": str(rec[0])})
        # rapidocr opens each ONNX session on first use: run both now so a broken install fails at load time.
        blank = np.zeros((48, 160, 3), np.uint8)
        engine(blank, use_det=True, use_cls=False, use_rec=False)
        engine(blank, use_det=False, use_cls=False, use_rec=True)
        return engine
    return _loaded("rapidocr PP-OCR models", str(models), load, "reinstall rapidocr and onnxruntime")


def load_ocr(device, denominator="flow-grpo", **_):
    """OCR reward of each image against its prompt's quoted text (ocr_reward; `denominator` names its n)."""
    engine = _load_ocr_engine()

    def score(images, prompts, metadata):
        pixels = (_quantize(images) * 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()  # (N, H, W, 3)
        rewards = []
        for rgb, prompt in zip(pixels, prompts):
            # rapidocr reads arrays as BGR (cv2); its use_* flags persist between calls, so name them every time.
            result = engine(np.ascontiguousarray(rgb[..., ::-1]), use_det=True, use_cls=False, use_rec=True)
            # Text boxes come sorted top-to-bottom, left-to-right; Flow-GRPO joins them without separator.
            rewards.append(ocr_reward("".join(result.txts or ()), ocr_target(prompt), denominator))
        return torch.tensor(rewards, dtype=torch.float32, device=device)  # (N,)

    return score


# ----------------------------------------------------------------------------------------------------------------
# Aesthetic: LAION improved-aesthetic-predictor v2 (simple_inference.py): MLP on the L2-normalized CLIP-L/14
# image embedding. Layer layout of MLP.layers (no activations in the "linearMSE" model):
# 0 Linear(768, 1024), 1 Dropout(0.2), 2 Linear(1024, 128), 3 Dropout(0.2), 4 Linear(128, 64), 5 Dropout(0.1),
# 6 Linear(64, 16), 7 Linear(16, 1).
# ----------------------------------------------------------------------------------------------------------------

def aesthetic_mlp(embed_dim=768):
    return nn.Sequential(nn.Linear(embed_dim, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
                         nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))


def load_aesthetic(device, batch_size=16, model_paths=None, **_):
    if not (model_paths or {}).get("aesthetic"):
        raise RewardLoadError(
            "the aesthetic reward needs the LAION predictor weights: download sac+logos+ava1-l14-linearMSE.pth from "
            "github.com/christophschuhmann/improved-aesthetic-predictor and pass model_paths={'aesthetic': PATH}")
    path = str(model_paths["aesthetic"])
    clip, _, image_cfg = _load_clip("clip_l14", _source("clip_l14", model_paths),
                                    "clip_l14", _source("clip_l14", model_paths), str(device))
    mlp = aesthetic_mlp(clip.config.projection_dim)
    hint = "pass model_paths={'aesthetic': PATH} with PATH = sac+logos+ava1-l14-linearMSE.pth"
    state = _loaded("aesthetic predictor weights", path,
                    lambda: torch.load(path, map_location="cpu", weights_only=True), hint)
    # The checkpoint is the state dict of improved-aesthetic-predictor's MLP module, keys "layers.<i>.*".
    _loaded("aesthetic predictor weights", path,
            lambda: mlp.load_state_dict({k.removeprefix("layers."): v for k, v in state.items()}), hint)
    mlp = mlp.eval().to(device)

    @torch.no_grad()
    def score(images, prompts, metadata):
        images = _quantize(images)  # (N, 3, H, W)
        out = [mlp(clip_image_features(clip, image_cfg, images[part])).squeeze(-1)  # (n,)
               for part in _chunks(len(images), batch_size)]
        return torch.cat(out).float()  # (N,)

    return score


# ----------------------------------------------------------------------------------------------------------------
# JPEG (in)compressibility (DDPO, Black et al. 2023): file size in kB at quality 95.
# ----------------------------------------------------------------------------------------------------------------

def jpeg_size_kb(images, quality=JPEG_QUALITY):
    pixels = (_quantize(images) * 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()  # (N, H, W, 3)
    sizes = []
    for rgb in pixels:
        buffer = io.BytesIO()
        Image.fromarray(rgb).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000)  # DDPO divides by 1000, not 1024
    return torch.tensor(sizes, dtype=torch.float32)  # (N,)


def load_jpeg_compressibility(device, **_):
    return lambda images, prompts, metadata: -jpeg_size_kb(images).to(device)  # (N,)


def load_jpeg_incompressibility(device, **_):
    return lambda images, prompts, metadata: jpeg_size_kb(images).to(device)  # (N,)


def _toy_loader(total: str, parts: tuple[str, ...]):
    """A loader for the toy world's programmatic reward (toyworld.py, `train.py --task tiny`): `total` is the
    toyworld.toy_components entry trained on, `parts` the components logged next to it as toy_<name>."""
    def load(device, **_):
        def score(images, prompts, metadata):
            # a prompts file gives empty metadata: then the captions are parsed
            comps = toyworld.toy_components(images, prompts, metadata if all(metadata) else None)
            return comps[total].to(device), {f"toy_{k}": comps[k].to(device) for k in parts}

        return score

    return load


# "toy": the graded colour + count score (the tiny task's reward and held-out score), its terms and the strict
# accuracy logged beside it
load_toy = _toy_loader("score", ("colour", "count", "strict"))


# ----------------------------------------------------------------------------------------------------------------
# GenEval: the Mask2Former detector and CLIP's colour classifier; the rules they feed are in geneval.py.
# ----------------------------------------------------------------------------------------------------------------

class _Mask2FormerNoLoss(Mask2FormerForUniversalSegmentation):
    """Mask2FormerForUniversalSegmentation without its training loss: transformers builds the loss in __init__
    and it requires scipy (Hungarian matching), which inference never calls. Same weights, same forward."""

    def __init__(self, config):
        Mask2FormerPreTrainedModel.__init__(self, config)
        self.model = Mask2FormerModel(config)
        self.class_predictor = nn.Linear(config.hidden_dim, config.num_labels + 1)
        self.post_init()


@functools.lru_cache(maxsize=None)
def _load_mask2former(source, device):
    model = _loaded("Mask2Former detector", source,
                    lambda: _Mask2FormerNoLoss.from_pretrained(source, dtype=torch.float32).eval().to(device),
                    _hub_hint("mask2former"))
    if model.config.num_labels != len(geneval.GENEVAL_CLASSES):
        raise RewardLoadError(f"Mask2Former at '{source}' has {model.config.num_labels} classes, GenEval needs the "
                              f"{len(geneval.GENEVAL_CLASSES)} COCO classes "
                              f"(facebook/mask2former-swin-small-coco-instance)")
    return model


def load_geneval(device, batch_size=16, model_paths=None, **_):
    """Primary value: partial credit; extra 'geneval_correct' (0/1, GenEval's rule) for geneval_summary.

    DEVIATION: the detector sees the decoded pixels (8 bits), not the JPEG (quality 75) Flow-GRPO's reward server
    receives: in-process there is no transport (docs/deviations.md, 'GenEval').
    """
    detector = _load_mask2former(_source("mask2former", model_paths), str(device))
    clip, tokenizer, image_cfg = _load_clip("clip_l14", _source("clip_l14", model_paths),
                                            "clip_l14", _source("clip_l14", model_paths), str(device))
    color_classifiers = {}

    def color_classifier(classname):
        """clip_benchmark zero_shot_classifier: per colour the normalized mean of its normalized template embeddings."""
        if classname not in color_classifiers:
            texts = [t.format(c=c, cls=classname) for c in geneval.GENEVAL_COLORS
                     for t in geneval.GENEVAL_COLOR_TEMPLATES]
            emb = clip_text_features(clip, tokenizer, texts, device)  # (10 * 3, D), colour-major
            color_classifiers[classname] = geneval.zero_shot_weights(emb, len(geneval.GENEVAL_COLORS))  # (10, D)
        return color_classifiers[classname]

    def colors_of(image, boxes, masks, indices, classname):
        crops = geneval.object_crops(image, boxes[indices], masks[indices])  # k x (3, y2 - y1, x2 - x1)
        pixels = torch.cat([clip_preprocess(crop[None], **image_cfg) for crop in crops])  # (k, 3, 224, 224)
        feats = F.normalize(clip.get_image_features(pixel_values=pixels).pooler_output, dim=-1)  # (k, D)
        return [geneval.GENEVAL_COLORS[j] for j in (feats @ color_classifier(classname).T).argmax(-1).tolist()]

    @torch.no_grad()
    def score(images, prompts, metadata):
        for m in metadata:
            if "tag" not in m or "include" not in m:
                raise ValueError("the geneval reward needs GenEval metadata (tag, include, ...) per prompt: load "
                                 "the prompts with config.load_prompts('.../geneval/test_metadata.jsonl')")
        images = _quantize(images.to(device))  # (N, 3, H, W)
        h, w = images.shape[-2:]
        partial, correct = [], []
        for part in _chunks(len(images), batch_size):
            pixels, pixel_mask, (rh, rw) = geneval.mask2former_inputs(images[part])  # (n, 3, H', W')
            out = detector(pixel_values=pixels, pixel_mask=pixel_mask)
            for j, i in enumerate(range(part.start, part.stop)):
                # mmdet: upsample mask logits to the padded input, drop the padding, resize to the original image.
                masks = F.interpolate(out.masks_queries_logits[j:j + 1], size=pixels.shape[-2:], mode="bilinear",
                                      align_corners=False)[:, :, :rh, :rw]  # (1, Q, h', w')
                masks = F.interpolate(masks, size=(h, w), mode="bilinear", align_corners=False)[0]  # (Q, H, W)
                boxes, labels, scores, binary = geneval.mask2former_instances(out.class_queries_logits[j], masks)
                tag = metadata[i]["tag"]
                threshold = geneval.GENEVAL_COUNTING_THRESHOLD if tag == "counting" else geneval.GENEVAL_THRESHOLD
                chosen = geneval.select_objects(boxes, labels, scores, threshold)
                colors = {}
                for req in metadata[i]["include"]:
                    indices = chosen.get(req["class"], [])[:req["count"]]
                    if "color" in req and indices:
                        colors.update(zip(indices, colors_of(images[i], boxes, binary, indices, req["class"])))
                objects = {cls: [(boxes[k].tolist(), colors.get(k)) for k in ks] for cls, ks in chosen.items()}
                ok, credit = geneval.geneval_judge(objects, metadata[i])
                correct.append(float(ok))
                partial.append(credit)
        as_tensor = functools.partial(torch.tensor, dtype=torch.float32, device=device)
        return as_tensor(partial), {"geneval_correct": as_tensor(correct)}  # (N,), (N,)

    return score


# ----------------------------------------------------------------------------------------------------------------
# One interface for all rewards.
# ----------------------------------------------------------------------------------------------------------------

REWARD_LOADERS = {
    "pickscore": load_pickscore,
    # the toy world's learned reward, through PickScore's own loader, preprocessing and scoring (lab/toyscore.py)
    "toyscore": functools.partial(load_pickscore, key="toyscore", processor_key="toyscore"),
    "ocr": load_ocr,
    "ocr_demo": functools.partial(load_ocr, denominator="demo"),  # the demo code's ocr.py (ocr_reward)
    "geneval": load_geneval,
    "aesthetic": load_aesthetic,
    "jpeg_compressibility": load_jpeg_compressibility,
    "jpeg_incompressibility": load_jpeg_incompressibility,
    "toy": load_toy,
}


def load_rewards(weights, device="cpu", model_paths=None, batch_size=16, options=None):
    """{name: weight} -> score(images (N, 3, H, W) in [0, 1], prompts [N], metadata [N]) -> (total (N,), parts).

    parts holds each reward's (N,) value under its name plus the extras it reports (e.g. 'pickscore_raw');
    total = sum of weight * value over the nonzero weights. Each loader is called once, as
    REWARD_LOADERS[name](device, batch_size=batch_size, model_paths=model_paths, **options.get(name, {})); every
    model is loaded before this returns, so a failure raises here (RewardLoadError) and never leaves a partly
    working scorer.
    """
    if not weights:
        raise ValueError("no reward given: pass weights like {'pickscore': 1.0}")
    unknown = sorted(set(weights) - set(REWARD_LOADERS))
    if unknown:
        raise ValueError(f"unknown reward(s) {unknown}; known: {sorted(REWARD_LOADERS)}")
    device = torch.device(device)
    scorers = {name: REWARD_LOADERS[name](device, batch_size=batch_size, model_paths=model_paths,
                                          **(options or {}).get(name, {})) for name in weights}

    def score(images, prompts, metadata):
        if images.ndim != 4 or images.shape[1] != 3 or not len(images) == len(prompts) == len(metadata):
            raise ValueError(f"expected images (N, 3, H, W) with N prompts and N metadata dicts, got images "
                             f"{tuple(images.shape)}, {len(prompts)} prompts, {len(metadata)} metadata")
        if images.min() < -1e-3 or images.max() > 1 + 1e-3:
            raise ValueError(f"images must be in [0, 1] (got [{images.min():.3f}, {images.max():.3f}]); map VAE "
                             "output with (x / 2 + 0.5).clamp(0, 1)")
        images, prompts, metadata = images.to(device).float(), list(prompts), list(metadata)
        total = torch.zeros(len(images), dtype=torch.float32, device=device)  # (N,)
        parts = {}
        for name, scorer in scorers.items():
            value, extras = scorer(images, prompts, metadata), {}
            if isinstance(value, tuple):
                value, extras = value
            parts[name] = value.float().to(device)  # (N,)
            parts.update({k: v.float().to(device) for k, v in extras.items()})
            if weights[name]:  # a 0 weight only reports the metric (and 0 * NaN would still be NaN)
                total = total + weights[name] * parts[name]  # (N,)
        return total, parts

    return score

