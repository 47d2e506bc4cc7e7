"""General-quality metrics of the paper's DrawBench table (Sec. 5; docs/method.md, 'Rewards'), run in-process:
ImageReward and UnifiedReward, beside rewards.py's PickScore and LAION aesthetic. They answer the question the
paper asks of every trained model: did the task reward rise at the cost of image quality (reward hacking)?

| name          | model                                                   | value                                    |
|---------------|---------------------------------------------------------|------------------------------------------|
| imagereward   | ImageReward-v1.0 (THUDM): BLIP ViT-L/16 image tokens,   | (MLP(h_CLS) - mean) / std, about N(0, 1) |
|               | BERT-base with cross-attention to them, an MLP head     | over its training set                    |
| unifiedreward | UnifiedReward-qwen-7b (Qwen2.5-VL-7B fine-tune), the    | s of the generated 'Final Score: s',     |
|               | TurningPoint-GRPO demo code's prompt, one generate()    | 1-5; NaN when the answer has none        |

DeQA-Score (the table's fourth column) is not reproduced: its model, mPLUG-Owl2, has no transformers class, so it
runs only on its authors' modeling code (docs/quality.md).

Importing this module registers both metrics in rewards.REWARD_LOADERS and their models in rewards.DEFAULT_MODELS,
so that rewards.load_rewards loads them by name (evaluate.py imports it):

    score = rewards.load_rewards({"imagereward": 1.0, "unifiedreward": 0.0}, device="cuda",
                                 model_paths={"imagereward": DIR_A, "unifiedreward": DIR_B})
    total, parts = score(images, prompts, metadata)   # parts["unifiedreward"] holds NaN where no score was given

Run: `python -m pytest tests/test_quality.py` (tiny random-weight models of both architectures, built in code).

Shapes: N images in a call, n <= batch_size images in one forward, L text tokens, P image patches (BLIP: 1 + 14 x 14
with the class token; Qwen2.5-VL: 36 x 36 patches of 14 px, merged 2 x 2 into 324 image tokens), D widths.
"""

import functools
import json
import math
import re
from pathlib import Path

import huggingface_hub
import torch
from PIL import Image
from torch import nn
from transformers import (AutoTokenizer, BertTokenizer, BlipTextConfig, BlipTextModel, BlipVisionConfig,
                          BlipVisionModel, Qwen2_5_VLForConditionalGeneration)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.processing_utils import ProcessorMixin

import rewards

QUALITY_MODELS = {
    # hf download THUDM/ImageReward --local-dir DIR: ImageReward.pt (the state dict) and med_config.json (the BERT)
    "imagereward": "THUDM/ImageReward",
    # ImageReward's BLIP tokenizer: bert-base-uncased plus two special tokens (blip.py init_tokenizer)
    "imagereward_tokenizer": "google-bert/bert-base-uncased",
    # the checkpoint the TurningPoint-GRPO demo code scores with (flow_grpo/rewards.py, unifiedreward_score_local)
    "unifiedreward": "CodeGoat24/UnifiedReward-qwen-7b",
}


def _hub_file(source: str, filename: str) -> str:
    """`filename` inside a local folder, or fetched from the hub repository `source` (its cache if offline)."""
    if Path(source).expanduser().is_dir():
        path = Path(source).expanduser() / filename
        if not path.is_file():
            raise FileNotFoundError(f"{filename} is not in {source}")
        return str(path)
    return huggingface_hub.hf_hub_download(source, filename)


# ----------------------------------------------------------------------------------------------------------------
# ImageReward (Xu et al. 2023): BLIP's image-grounded text encoder read at [CLS] by an MLP (ImageReward.py, score).
# The package (image-reward 1.5) is not used: it pins timm 0.6.13, which pulls torchvision, and its med.py imports
# apply_chunking_to_forward from transformers.modeling_utils, which transformers 5 no longer has. transformers'
# BLIP classes are ports of the same vit.py / med.py, so the checkpoint loads into them after renaming its keys.
# ----------------------------------------------------------------------------------------------------------------

IMAGEREWARD_MEAN, IMAGEREWARD_STD = 0.16717362830052426, 1.0333394966054072  # ImageReward.py: self.mean, self.std
IMAGEREWARD_MAX_TOKENS = 35  # ImageReward.py: tokenizer(prompt, padding="max_length", truncation=True, max_length=35)
# ImageReward.py _transform(224): Resize(224, BICUBIC) of the short side, CenterCrop(224), Normalize with CLIP's
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
BLIP_HEAD_DIM = 64  # blip.py create_vit: ViT-B 768 / 12 heads, ViT-L 1024 / 16 heads

# ImageReward.pt's keys (BLIP's vit.py and med.py names under blip.*, the head under mlp.layers.*) -> ours. The
# first pattern that matches a key renames it; keys no pattern matches (blip.vision_proj, blip.text_proj, the
# position_ids buffer) are not used by the score.
IMAGEREWARD_KEYS = [
    (r"blip\.visual_encoder\.cls_token$", "vision.embeddings.class_embedding"),
    (r"blip\.visual_encoder\.pos_embed$", "vision.embeddings.position_embedding"),
    (r"blip\.visual_encoder\.patch_embed\.proj\.", "vision.embeddings.patch_embedding."),
    (r"blip\.visual_encoder\.blocks\.(\d+)\.norm1\.", r"vision.encoder.layers.\1.layer_norm1."),
    (r"blip\.visual_encoder\.blocks\.(\d+)\.attn\.qkv\.", r"vision.encoder.layers.\1.self_attn.qkv."),
    (r"blip\.visual_encoder\.blocks\.(\d+)\.attn\.proj\.", r"vision.encoder.layers.\1.self_attn.projection."),
    (r"blip\.visual_encoder\.blocks\.(\d+)\.norm2\.", r"vision.encoder.layers.\1.layer_norm2."),
    (r"blip\.visual_encoder\.blocks\.(\d+)\.mlp\.", r"vision.encoder.layers.\1.mlp."),
    (r"blip\.visual_encoder\.norm\.", "vision.post_layernorm."),
    (r"blip\.text_encoder\.(?!embeddings\.position_ids$)", "text."),  # med.py's BertModel = BlipTextModel's names
    (r"mlp\.layers\.", "mlp."),
]


def imagereward_state_dict(checkpoint: dict) -> dict:
    """ImageReward.pt's state dict -> ImageRewardModel's (IMAGEREWARD_KEYS), tensors unchanged."""
    renamed = {}
    for key, value in checkpoint.items():
        for pattern, replacement in IMAGEREWARD_KEYS:
            if re.match(pattern, key):
                renamed[re.sub(pattern, replacement, key, count=1)] = value
                break
    return renamed


def imagereward_configs(checkpoint: dict, med_config: dict) -> tuple[BlipVisionConfig, BlipTextConfig]:
    """The two halves' configs: the ViT's sizes read off the checkpoint's shapes (BLIP builds it in code, with
    LayerNorm eps 1e-6 and exact GELU), the BERT's from med_config.json with cross-attention to the ViT's width."""
    patch = checkpoint["blip.visual_encoder.patch_embed.proj.weight"]  # (Dv, 3, p, p)
    positions = checkpoint["blip.visual_encoder.pos_embed"].shape[1]  # 1 + (image / p)^2
    depth = 1 + max(int(k.split(".")[3]) for k in checkpoint if k.startswith("blip.visual_encoder.blocks."))
    width = patch.shape[0]
    vision = BlipVisionConfig(
        hidden_size=width, intermediate_size=checkpoint["blip.visual_encoder.blocks.0.mlp.fc1.weight"].shape[0],
        num_hidden_layers=depth, num_attention_heads=width // BLIP_HEAD_DIM, patch_size=patch.shape[-1],
        image_size=patch.shape[-1] * math.isqrt(positions - 1), layer_norm_eps=1e-6, hidden_act="gelu")
    # BLIP_Pretrain: encoder_config.encoder_width = vision_width; its BertLayer adds cross-attention, which
    # transformers' BlipTextLayer builds when is_decoder is set (the forward still attends both ways).
    text = BlipTextConfig(
        vocab_size=med_config["vocab_size"], hidden_size=med_config["hidden_size"],
        encoder_hidden_size=width, intermediate_size=med_config["intermediate_size"],
        num_hidden_layers=med_config["num_hidden_layers"], num_attention_heads=med_config["num_attention_heads"],
        max_position_embeddings=med_config["max_position_embeddings"], hidden_act=med_config["hidden_act"],
        layer_norm_eps=med_config["layer_norm_eps"], pad_token_id=med_config.get("pad_token_id", 0),
        is_decoder=True)
    return vision, text


class ImageRewardModel(nn.Module):
    """ImageReward.score_gard on transformers' BLIP halves: (pixels, prompt tokens) -> the normalized reward."""

    def __init__(self, vision: BlipVisionConfig, text: BlipTextConfig):
        super().__init__()
        self.vision = BlipVisionModel(vision)
        self.text = BlipTextModel(text, add_pooling_layer=False)
        # ImageReward's MLP has the improved-aesthetic-predictor's layout (it says so, and the layers match)
        self.mlp = rewards.aesthetic_mlp(text.hidden_size)

    def forward(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        image = self.vision(pixel_values=pixels).last_hidden_state  # (n, P, Dv)
        image_mask = torch.ones(image.shape[:-1], dtype=torch.long, device=image.device)  # (n, P)
        h = self.text(input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=image,
                      encoder_attention_mask=image_mask).last_hidden_state  # (n, L, Dt)
        # ImageReward = (MLP(h_[CLS]) - mean) / std
        return (self.mlp(h[:, 0].float()).squeeze(-1) - IMAGEREWARD_MEAN) / IMAGEREWARD_STD  # (n,)


def imagereward_tokenizer(source: str) -> BertTokenizer:
    """bert-base-uncased as BLIP's init_tokenizer extends it: [DEC] as bos, [ENC] added (vocabulary 30524). Prompts
    keep [CLS] first: ImageReward scores the [CLS] state (BLIP's retrieval head swaps in [ENC], ImageReward
    does not)."""
    tokenizer = BertTokenizer.from_pretrained(source)
    tokenizer.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    return tokenizer


@functools.lru_cache(maxsize=None)
def _load_imagereward(source: str, tokenizer_source: str, device: str):
    hint = rewards._hub_hint("imagereward") + " (a folder with ImageReward.pt and med_config.json)"

    def load():
        # a pickle: read with weights_only=True, which unpickles tensors and plain containers and nothing else
        checkpoint = torch.load(_hub_file(source, "ImageReward.pt"), map_location="cpu", weights_only=True)
        med_config = json.loads(Path(_hub_file(source, "med_config.json")).read_text())
        model = ImageRewardModel(*imagereward_configs(checkpoint, med_config))
        model.load_state_dict(imagereward_state_dict(checkpoint))  # strict: every weight of the score is there
        return model.eval().to(device)

    model = rewards._loaded("ImageReward", source, load, hint)
    tokenizer = rewards._loaded("ImageReward's BERT tokenizer", tokenizer_source,
                                lambda: imagereward_tokenizer(tokenizer_source),
                                rewards._hub_hint("imagereward_tokenizer"))
    if len(tokenizer) != model.text.config.vocab_size:
        raise rewards.RewardLoadError(f"the tokenizer at '{tokenizer_source}' has {len(tokenizer)} tokens with BLIP's "
                                      f"two added, ImageReward's embeddings {model.text.config.vocab_size}; pass "
                                      f"bert-base-uncased as model_paths={{'imagereward_tokenizer': DIR}}")
    return model, tokenizer


def load_imagereward(device, batch_size=16, model_paths=None, **_):
    """ImageReward-v1.0 in float32 (as Flow-GRPO's ImageRewardScorer); the images go through CLIP-style
    preprocessing at 224 px (rewards.clip_preprocess: bicubic, antialiased like PIL)."""
    model, tokenizer = _load_imagereward(rewards._source("imagereward", model_paths),
                                         rewards._source("imagereward_tokenizer", model_paths), str(device))
    image_cfg = dict(size=model.vision.config.image_size, crop=(model.vision.config.image_size,) * 2,
                     mean=torch.tensor(CLIP_MEAN, device=device).view(1, 3, 1, 1),  # (1, 3, 1, 1)
                     std=torch.tensor(CLIP_STD, device=device).view(1, 3, 1, 1))  # (1, 3, 1, 1)

    @torch.no_grad()
    def score(images, prompts, metadata):
        images, out = rewards._quantize(images), []  # (N, 3, H, W)
        for part in rewards._chunks(len(images), batch_size):
            pixels = rewards.clip_preprocess(images[part], **image_cfg)  # (n, 3, 224, 224)
            tokens = tokenizer(prompts[part], padding="max_length", truncation=True,
                               max_length=IMAGEREWARD_MAX_TOKENS, return_tensors="pt").to(device)  # (n, 35)
            out.append(model(pixels, tokens.input_ids, tokens.attention_mask))  # (n,)
        return torch.cat(out).float()  # (N,)

    return score


# ----------------------------------------------------------------------------------------------------------------
# UnifiedReward (Wang et al. 2025): a Qwen2.5-VL judge asked for a 1-5 score, as the TurningPoint-GRPO demo code's
# flow_grpo/unifiedreward_scorer.py asks it: every image resized to 512 x 512, then by qwen_vl_utils.fetch_image
# to a multiple of 28 px (504 x 504), the prompt below under the checkpoint's chat template, answer by generate().
# Qwen2_5_VLProcessor is not used: in transformers 5 it cannot be built without torchvision (its video processor
# needs it), so its three steps are spelled out in unifiedreward_inputs and checked against it in the tests.
# ----------------------------------------------------------------------------------------------------------------

UNIFIEDREWARD_SIDE = 512  # the demo code: Image.fromarray(image).resize((512, 512)) (PIL's default: bicubic)
UNIFIEDREWARD_INPUT = 504  # qwen_vl_utils.fetch_image: smart_resize(512, 512, factor=28) = round(512 / 28) * 28
UNIFIEDREWARD_MAX_NEW_TOKENS = 512  # the demo code: generate(**inputs, max_new_tokens=512)
IMAGE_PAD = "<|image_pad|>"  # Qwen2.5-VL's image placeholder, one per merged 2 x 2 patch
# the demo code's regex: the first 'Final Score:' followed by a digit 1-5 and optional decimals (so "10" reads 1)
FINAL_SCORE = re.compile(r"Final Score:\s*([1-5](?:\.\d+)?)")


def unifiedreward_question(prompt: str) -> str:
    """The demo code's instruction, word for word, with the caption in brackets at the end."""
    return ("You are given a text caption and a generated image based on that caption. Your task is to evaluate "
            "this image based on two key criteria:\n1. Alignment with the Caption: Assess how well this image aligns "
            "with the provided caption. Consider the accuracy of depicted objects, their relationships, and attributes "
            "as described in the caption.\n2. Overall Image Quality: Examine the visual quality of this image, "
            "including clarity, detail preservation, color accuracy, and overall aesthetic appeal.\nExtract key "
            "elements from the provided text caption, evaluate their presence in the generated image using the "
            "format: 'element (type): value' (where value=0 means not generated, and value=1 means generated), and "
            "assign a score from 1 to 5 after 'Final Score:'.\nYour task is provided as follows:\n"
            f"Text Caption: [{prompt}]")


def parse_final_score(answer: str) -> float:
    """The score s in 'Final Score: s', or NaN when the answer has none.

    DEVIATION: NaN (out of evaluate.py's mean, counted in unifiedreward_failed), not the demo code's 0, a score the
    model never gave (docs/deviations.md, 'UnifiedReward without a score').
    """
    match = FINAL_SCORE.search(answer)
    return float(match.group(1)) if match else math.nan


def unifiedreward_images(images: torch.Tensor) -> list[Image.Image]:
    """(N, 3, H, W) in [0, 1] -> PIL images as the judge sees them: 8-bit, resized to 512 then to 504 px (bicubic)."""
    pixels = (rewards._quantize(images) * 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()  # (N, H, W, 3)
    return [Image.fromarray(rgb).resize((UNIFIEDREWARD_SIDE,) * 2).resize((UNIFIEDREWARD_INPUT,) * 2)
            for rgb in pixels]


def unifiedreward_inputs(tokenizer, image_processor, chat_template: str, images: list, prompts: list[str]) -> dict:
    """What Qwen2_5_VLProcessor(text=chat texts, images=images, padding=True) returns, for generate():

    1. the chat text of one user message (the image, then unifiedreward_question) under the checkpoint's template,
    2. the image processor's patches and grids, and each IMAGE_PAD repeated once per merged patch (t h w / m^2),
    3. the tokens, left-padded so every row's answer starts at the same column, and mm_token_type_ids (1 on image
       tokens), without which Qwen2.5-VL silently falls back to 1-D text positions for the image.
    """
    texts = [tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": unifiedreward_question(p)}]}],
        chat_template=chat_template, tokenize=False, add_generation_prompt=True) for p in prompts]
    vision = image_processor(images=images, return_tensors="pt")  # pixel_values (sum of P, 3*2*14*14), grids (n, 3)
    merged = (vision["image_grid_thw"].prod(-1) // image_processor.merge_size ** 2).tolist()  # image tokens per image
    texts = [t.replace(IMAGE_PAD, IMAGE_PAD * k, 1) for t, k in zip(texts, merged)]
    tokens = tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")  # (n, L)
    image_token = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    mm_token_type_ids = (tokens["input_ids"] == image_token).long()  # (n, L)
    return {**tokens, "mm_token_type_ids": mm_token_type_ids, **vision}


@torch.no_grad()
def unifiedreward_answers(model, tokenizer, image_processor, chat_template: str, images: list, prompts: list[str],
                          max_new_tokens: int = UNIFIEDREWARD_MAX_NEW_TOKENS) -> list[str]:
    """One batched generate() (the checkpoint's generation config, as the demo code) -> each row's answer text."""
    inputs = unifiedreward_inputs(tokenizer, image_processor, chat_template, images, prompts)
    inputs = {k: v.to(model.device) for k, v in inputs.items()}
    inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
    out = model.generate(**inputs, max_new_tokens=max_new_tokens)  # (n, L + new tokens)
    answers = out[:, inputs["input_ids"].shape[1]:]  # (n, new tokens): left padding aligns every row's prompt end
    return [a.strip() for a in tokenizer.batch_decode(answers, skip_special_tokens=True,
                                                      clean_up_tokenization_spaces=False)]


@functools.lru_cache(maxsize=None)
def _load_unifiedreward(source: str, device: str):
    """Model, tokenizer, image processor and the processor's chat template of a Qwen2.5-VL checkpoint."""
    hint = rewards._hub_hint("unifiedreward")
    # bf16 on GPUs as the demo code (~16.6 GB); float32 elsewhere (CPU tests), where bf16 matmuls are slow
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    model = rewards._loaded("UnifiedReward", source, lambda: Qwen2_5_VLForConditionalGeneration.from_pretrained(
        source, dtype=dtype, device_map={"": device}).eval(), hint)  # straight onto the device, as the demo code
    tokenizer = rewards._loaded("UnifiedReward's tokenizer", source, lambda: AutoTokenizer.from_pretrained(source),
                                hint)
    image_processor = rewards._loaded("UnifiedReward's image processor", source,
                                      lambda: Qwen2VLImageProcessorPil.from_pretrained(source), hint)
    template = rewards._loaded("UnifiedReward's chat template", source,
                               lambda: ProcessorMixin.get_processor_dict(source)[0].get("chat_template"), hint)
    if not template:
        raise rewards.RewardLoadError(f"no chat template (chat_template.jinja or chat_template.json) in '{source}'; "
                                      f"{hint}")
    return model, tokenizer, image_processor, template


def load_unifiedreward(device, batch_size=16, model_paths=None, max_new_tokens=UNIFIEDREWARD_MAX_NEW_TOKENS, **_):
    """UnifiedReward's 1-5 score per image, NaN where its answer gives none (parse_final_score). The demo code's
    scorer returns s / 5; evaluate.py reports s, the scale the model answers on."""
    model, tokenizer, image_processor, template = _load_unifiedreward(rewards._source("unifiedreward", model_paths),
                                                                      str(device))

    def score(images, prompts, metadata):
        pil, scores = unifiedreward_images(images), []
        for part in rewards._chunks(len(pil), batch_size):
            answers = unifiedreward_answers(model, tokenizer, image_processor, template, pil[part], prompts[part],
                                            max_new_tokens)
            scores += [parse_final_score(a) for a in answers]
        return torch.tensor(scores, dtype=torch.float32, device=device)  # (N,)

    return score


# Registration: rewards.load_rewards finds both metrics by name once this module is imported.
rewards.DEFAULT_MODELS.update(QUALITY_MODELS)
rewards.REWARD_LOADERS.update({"imagereward": load_imagereward, "unifiedreward": load_unifiedreward})
