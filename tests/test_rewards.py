"""Tests for rewards.py: offline, CPU. Tiny random-weight CLIP / Mask2Former models are built from configs once
per module and saved with save_pretrained (weights, tokenizer and image processor) so the real loading code runs;
OCR runs the real rapidocr models bundled in its wheel on PIL-rendered text."""

import glob
import json

import huggingface_hub
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont
from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTokenizer, Mask2FormerConfig, SwinConfig

import geneval
import rewards
from config import load_prompts
from geneval import (GENEVAL_CLASSES, compute_iou, geneval_judge, geneval_summary, mask2former_inputs,
                     mask2former_instances, masks_to_boxes, object_crops, relative_position, select_objects,
                     zero_shot_weights)
from rewards import RewardLoadError, clip_preprocess, load_rewards, ocr_reward, ocr_target

# ---------------------------------------------------------------------------------------------------------------
# Tiny models, saved once per module.
# ---------------------------------------------------------------------------------------------------------------

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-'\".,!?"


def tiny_tokenizer():
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in CHARS:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[]), len(vocab)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    """A tiny CLIP (projection 16) with tokenizer and the real CLIP image-processor config (224 crop)."""
    path = tmp_path_factory.mktemp("tiny_clip")
    tokenizer, vocab_size = tiny_tokenizer()
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=vocab_size, max_position_embeddings=77, bos_token_id=0, eos_token_id=1,
                         pad_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                           image_size=224, patch_size=32),
        projection_dim=16)
    CLIPModel(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    CLIPImageProcessorPil().save_pretrained(path)
    return str(path)


CAR = GENEVAL_CLASSES.index("car")


@pytest.fixture(scope="module")
def mask2former_dir(tmp_path_factory):
    """A tiny Mask2Former with 80 COCO classes whose class head is biased to "car", so random weights still
    give confident detections and the colour path runs."""
    path = tmp_path_factory.mktemp("tiny_m2f")
    torch.manual_seed(0)
    swin = SwinConfig(image_size=224, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
                      window_size=7, out_features=["stage1", "stage2", "stage3", "stage4"])
    config = Mask2FormerConfig(backbone_config=swin, feature_size=32, mask_feature_size=32, hidden_dim=32,
                               encoder_feedforward_dim=64, encoder_layers=1, decoder_layers=2, num_attention_heads=2,
                               dim_feedforward=64, num_queries=10, num_labels=len(GENEVAL_CLASSES))
    model = rewards._Mask2FormerNoLoss(config).eval()
    with torch.no_grad():
        model.class_predictor.bias[CAR] = 30.0
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def aesthetic_path(tmp_path_factory):
    torch.manual_seed(0)
    mlp = rewards.aesthetic_mlp(16)
    path = tmp_path_factory.mktemp("aesthetic") / "tiny-linearMSE.pth"
    torch.save({f"layers.{k}": v for k, v in mlp.state_dict().items()}, path)
    return str(path)


def smooth_images(n, h, w, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = F.interpolate(torch.rand(n, 3, max(h // 8, 1), max(w // 8, 1), generator=g), size=(h, w), mode="bilinear")
    return (x + 0.1 * torch.rand(n, 3, h, w, generator=g)).clamp(0, 1)  # (n, 3, h, w)


def to_pil(image):
    return Image.fromarray((image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy())


# ---------------------------------------------------------------------------------------------------------------
# CLIP preprocessing, PickScore, aesthetic
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hw", [(300, 200), (200, 333), (512, 512)])
def test_clip_preprocess_matches_processor_on_pil(hw):
    processor = CLIPImageProcessorPil()
    image = rewards._quantize(smooth_images(1, *hw))  # (1, 3, H, W)
    expected = torch.from_numpy(np.asarray(processor(images=to_pil(image[0]), return_tensors="np")["pixel_values"]))
    got = clip_preprocess(image, size=224, crop=(224, 224),
                          mean=torch.tensor(processor.image_mean).view(1, 3, 1, 1),
                          std=torch.tensor(processor.image_std).view(1, 3, 1, 1))
    assert got.shape == expected.shape == (1, 3, 224, 224)
    diff = (got - expected).abs()
    # PIL rounds to uint8 after its bicubic pass: about 2 levels / 255 / std 0.27 = 0.03 at worst.
    assert diff.max() < 0.05 and diff.mean() < 0.01


def test_pickscore_matches_processor_oracle(clip_dir):
    score = load_rewards({"pickscore": 1.0}, model_paths={"pickscore": clip_dir, "pickscore_processor": clip_dir},
                         batch_size=2)
    images = smooth_images(3, 96, 128)
    prompts = ["a red car", "two dogs.", "a cat on a mat"]
    total, parts = score(images, prompts, [{}] * 3)
    assert total.shape == (3,) and total.dtype == torch.float32 and torch.isfinite(total).all()
    torch.testing.assert_close(parts["pickscore"], parts["pickscore_raw"] / 26)
    torch.testing.assert_close(total, parts["pickscore"])
    # Oracle: transformers' own processor on PIL images, then logit_scale * cos.
    model, tokenizer = CLIPModel.from_pretrained(clip_dir).eval(), CLIPTokenizer.from_pretrained(clip_dir)
    pixels = torch.from_numpy(np.asarray(
        CLIPImageProcessorPil.from_pretrained(clip_dir)(images=[to_pil(i) for i in images],
                                                     return_tensors="np")["pixel_values"]))
    with torch.no_grad():
        img = F.normalize(model.get_image_features(pixel_values=pixels).pooler_output, dim=-1)
        txt = F.normalize(model.get_text_features(**tokenizer(prompts, padding=True, return_tensors="pt"))
                          .pooler_output, dim=-1)
        expected = model.logit_scale.exp() * (img * txt).sum(-1)
    torch.testing.assert_close(parts["pickscore_raw"], expected, atol=0.02, rtol=0)


def test_aesthetic_matches_manual_mlp(clip_dir, aesthetic_path):
    score = load_rewards({"aesthetic": 1.0}, model_paths={"clip_l14": clip_dir, "aesthetic": aesthetic_path})
    images = smooth_images(5, 64, 64, seed=1)
    total, parts = score(images, [""] * 5, [{}] * 5)
    assert total.shape == (5,) and torch.isfinite(total).all()
    model, cfg = CLIPModel.from_pretrained(clip_dir).eval(), CLIPImageProcessorPil()
    mlp = rewards.aesthetic_mlp(16)
    mlp.load_state_dict({k.removeprefix("layers."): v for k, v in torch.load(aesthetic_path).items()})
    with torch.no_grad():
        pixels = clip_preprocess(rewards._quantize(images), 224, (224, 224),
                                 torch.tensor(cfg.image_mean).view(1, 3, 1, 1),
                                 torch.tensor(cfg.image_std).view(1, 3, 1, 1))
        emb = model.get_image_features(pixel_values=pixels).pooler_output
        expected = mlp.eval()(emb / emb.norm(dim=-1, keepdim=True)).squeeze(-1)
    torch.testing.assert_close(parts["aesthetic"], expected)


# ---------------------------------------------------------------------------------------------------------------
# OCR: the real bundled PP-OCR models, offline.
# ---------------------------------------------------------------------------------------------------------------

def fonts():
    """Up to three TrueType fonts of the machine plus PIL's built-in scalable font, at several sizes."""
    paths = [p for p in sorted(glob.glob("/usr/share/fonts/**/*.ttf", recursive=True))
             if not any(skip in p for skip in ("Math", "ExtraLight"))]
    found = [ImageFont.truetype(p, size) for p, size in zip(paths[::max(1, len(paths) // 3)][:3], (40, 32, 48))]
    return found + [ImageFont.load_default(size=36), ImageFont.load_default(size=52)]


def render(texts, size=512):
    images, choices = [], fonts()
    for k, text in enumerate(texts):
        image = Image.new("RGB", (size, size), (235, 225, 200))
        draw = ImageDraw.Draw(image)
        font = choices[k % len(choices)]
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        draw.text(((size - right + left) // 2, (size - bottom + top) // 2 - top), text, font=font, fill=(25, 25, 70))
        images.append(torch.from_numpy(np.array(image)).permute(2, 0, 1).float() / 255)
    return torch.stack(images)  # (N, 3, size, size)


@pytest.fixture(scope="module")
def ocr_score():
    """The OCR reward with rapidocr's downloader replaced by one that fails: proof that it stays offline."""
    def no_download(*args, **kwargs):
        raise AssertionError("rapidocr tried to download a model")
    from rapidocr.utils.download_file import DownloadFile
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DownloadFile, "run", classmethod(no_download))
        rewards._load_ocr_engine.cache_clear()
        yield load_rewards({"ocr": 1.0, "ocr_demo": 0.0})  # total = ocr; parts hold both


def test_ocr_reads_rendered_text_in_one_batch(ocr_score):
    texts = ["OPEN 24 HOURS", "Hello World", "TP-GRPO", "Coffee Shop", "NASA 2049", "Fresh Bread", "EXIT", "Good Luck"]
    prompts = [f'a neon sign that says "{t}" on a wall' for t in texts]
    total, parts = ocr_score(render(texts), prompts, [{}] * len(texts))
    assert total.shape == (8,) and total.dtype == torch.float32
    assert (parts["ocr"] >= 0.9).all(), parts["ocr"]


def test_ocr_wrong_text_scores_lower_with_edit_distance(ocr_score):
    target = "Happy Birthday"
    # Normalized edit distances to "happybirthday": 0, 2, 5, 13 (blank).
    texts = ["Happy Birthday", "Hoppy Birthdey", "Hoppy Barkdoy"]
    images = torch.cat([render(texts), torch.ones(1, 3, 512, 512)])
    total, parts = ocr_score(images, [f'a cake with "{target}" in icing'] * 4, [{}] * 4)
    assert total[0] > total[1] > total[2] > total[3]
    assert total[3] == 0.0  # a blank image reads nothing
    assert parts["ocr_demo"][3] == pytest.approx(1 - 13 / 14)  # ...but the demo code's n = 14 counts the space
    # The clean renders are read exactly: 1, 1 - 2/13, 1 - 5/13 (one misread character allowed).
    torch.testing.assert_close(total[:3], torch.tensor([1.0, 1 - 2 / 13, 1 - 5 / 13]), atol=1 / 13 + 1e-6, rtol=0)


def test_ocr_reward_formula():
    assert ocr_target('a sign saying "Hello World" at night') == "Hello World"
    assert ocr_target("no quotes here") == "no quotes here"
    # Flow-GRPO's denominator: n = len("helloworld") = 10
    assert ocr_reward("HELLO world", "Hello World") == 1.0  # case and spaces ignored
    assert ocr_reward("hallo world", "Hello World") == pytest.approx(1 - 1 / 10)
    assert ocr_reward("", "Hello World") == 0.0
    assert ocr_reward("a completely different and long text", "Hi") == 0.0  # capped at n
    assert ocr_reward("anything", "") == 1.0
    # the substring rule: the target inside a longer reading is a perfect match (a plain edit distance gives 0.8)
    assert ocr_reward("helloworld!!", "Hello World") == 1.0
    assert ocr_reward("OPEN: Hello World, 24h", "Hello World") == 1.0
    assert ocr_reward("hello worl", "Hello World") == pytest.approx(1 - 1 / 10)  # a prefix is not the target


def test_ocr_demo_denominator_counts_spaces():
    # the demo code: d capped at the space-free length 10, divided by the length with spaces 11
    assert ocr_reward("hallo world", "Hello World", "demo") == pytest.approx(1 - 1 / 11)
    assert ocr_reward("", "Hello World", "demo") == pytest.approx(1 - 10 / 11)  # a blank image scores > 0
    assert ocr_reward("", "Happy 40th Birthday Mom", "demo") == pytest.approx(1 - 20 / 23)
    assert ocr_reward("xx hello world", "Hello World", "demo") == 1.0  # the substring rule too
    assert ocr_reward("helo", "Hi", "demo") == pytest.approx(1 - 2 / 2)  # no space: the two agree
    assert ocr_reward("helo", "Hi") == ocr_reward("helo", "Hi", "demo")
    with pytest.raises(ValueError, match="unknown OCR denominator"):
        ocr_reward("a", "b", "paper")


# ---------------------------------------------------------------------------------------------------------------
# JPEG and the multi-reward interface
# ---------------------------------------------------------------------------------------------------------------

def test_jpeg_flat_is_more_compressible_than_noise():
    images = torch.stack([torch.full((3, 128, 128), 0.4), torch.rand(3, 128, 128, generator=torch.Generator()
                                                                     .manual_seed(0))])
    score = load_rewards({"jpeg_compressibility": 1.0, "jpeg_incompressibility": 1.0})
    _, parts = score(images, ["", ""], [{}, {}])
    assert parts["jpeg_compressibility"][0] > parts["jpeg_compressibility"][1]
    assert parts["jpeg_incompressibility"][1] > parts["jpeg_incompressibility"][0]
    torch.testing.assert_close(parts["jpeg_compressibility"], -parts["jpeg_incompressibility"])
    assert parts["jpeg_incompressibility"][1] > 10  # 128 x 128 noise at quality 95 is tens of kB


def test_weighted_sum_components_and_registered_reward(monkeypatch):
    def load_toy(device, batch_size, model_paths, offset=0.0):
        def score(images, prompts, metadata):
            value = images.mean(dim=(1, 2, 3)) + offset  # (N,)
            return value, {"toy_len": torch.tensor([float(len(p)) for p in prompts])}
        return score
    monkeypatch.setitem(rewards.REWARD_LOADERS, "toy", load_toy)
    images = torch.stack([torch.full((3, 32, 32), 0.25), torch.rand(3, 32, 32)])
    score = load_rewards({"toy": 2.0, "jpeg_incompressibility": 0.5}, options={"toy": {"offset": 1.0}})
    total, parts = score(images, ["ab", "abcd"], [{}, {}])
    assert set(parts) == {"toy", "toy_len", "jpeg_incompressibility"}
    torch.testing.assert_close(parts["toy"], images.mean(dim=(1, 2, 3)) + 1.0)
    torch.testing.assert_close(parts["toy_len"], torch.tensor([2.0, 4.0]))
    torch.testing.assert_close(total, 2.0 * parts["toy"] + 0.5 * parts["jpeg_incompressibility"])


def test_bad_inputs_give_clear_errors():
    score = load_rewards({"jpeg_compressibility": 1.0})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        score(torch.full((1, 3, 8, 8), -1.0), [""], [{}])
    with pytest.raises(ValueError, match="N prompts"):
        score(torch.zeros(2, 3, 8, 8), [""], [{}])
    with pytest.raises(ValueError, match="unknown reward"):
        load_rewards({"pickscor": 1.0})


# ---------------------------------------------------------------------------------------------------------------
# Load errors
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.mark.parametrize("name,key", [("pickscore", "pickscore"), ("geneval", "mask2former"),
                                      ("aesthetic", "clip_l14")])
@pytest.mark.parametrize("source", ["nobody/no-such-model-xyz", "/nonexistent/local/folder"])
def test_missing_model_raises_one_clear_error(offline, aesthetic_path, name, key, source):
    paths = {key: source, "aesthetic": aesthetic_path}
    with pytest.raises(RewardLoadError) as err:
        load_rewards({"jpeg_compressibility": 1.0, name: 1.0}, model_paths=paths)
    message = str(err.value)
    assert source in message and f"model_paths={{'{key}'" in message and "\n" not in message
    assert ("no such file or folder" in message) == source.startswith("/")
    assert err.value.__cause__ is not None


def test_aesthetic_without_weights_path_says_where_to_get_them(clip_dir):
    with pytest.raises(RewardLoadError, match="sac\\+logos\\+ava1-l14-linearMSE.pth"):
        load_rewards({"aesthetic": 1.0}, model_paths={"clip_l14": clip_dir})


# ---------------------------------------------------------------------------------------------------------------
# GenEval: rules on synthetic detections, Mask2Former post-processing, tiny end-to-end
# ---------------------------------------------------------------------------------------------------------------

def test_relative_position_edge_cases():
    b = [100, 100, 140, 140]  # target: 40 x 40 at centre (120, 120)
    assert relative_position([0, 100, 40, 140], b) == {"left of"}
    assert relative_position([200, 100, 240, 140], b) == {"right of"}
    assert relative_position([100, 0, 140, 40], b) == {"above"}  # image y grows downwards
    assert relative_position([100, 200, 140, 240], b) == {"below"}
    assert relative_position([0, 0, 40, 40], b) == {"left of", "above"}  # diagonal: 92 / 141.4 = 0.65 each
    assert relative_position([105, 100, 145, 140], b) == set()  # offset 5 <= 0.1 * (40 + 40): no relation
    assert relative_position(b, b) == set()  # identical boxes: zero offset, no division
    # Mostly horizontal: dx = (100 - 8) / |(100, 30)| = 0.88 > 0.5, dy = (30 - 8) / 104.4 = 0.21 -> left only.
    assert relative_position([0, 130, 40, 170], [100, 100, 140, 140]) == {"left of"}
    # Just past the threshold on y: dy = (50 - 8) / 50 = 0.84 -> below.
    assert relative_position([100, 150, 140, 190], b) == {"below"}
    # A larger box shrinks the offset more: centres 40 apart, threshold 0.1 * (600 + 40) = 64 -> nothing.
    assert relative_position([-200, 100, 400, 140], [120, 100, 160, 140]) == set()


def test_compute_iou_and_select_objects():
    assert compute_iou([0, 0, 9, 9], [0, 0, 9, 9]) == 1.0
    assert compute_iou([0, 0, 9, 9], [10, 10, 19, 19]) == 0.0
    assert compute_iou([0, 0, 9, 9], [5, 0, 14, 9]) == pytest.approx(50 / 150)
    dog, cat = GENEVAL_CLASSES.index("dog"), GENEVAL_CLASSES.index("cat")
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [0, 0, 5, 5], [20, 20, 30, 30]])
    labels = torch.tensor([dog, dog, dog, cat, cat])
    scores = torch.tensor([0.5, 0.95, 0.3, 0.92, 0.2])
    assert select_objects(boxes, labels, scores, 0.3) == {"dog": [1, 0], "cat": [3]}  # > 0.3 strictly, best first
    assert select_objects(boxes, labels, scores, 0.9) == {"dog": [1], "cat": [3]}  # the counting threshold
    assert select_objects(boxes, labels, scores, 0.0, max_objects=1) == {"dog": [1], "cat": [3]}
    assert select_objects(boxes, labels, scores, 0.3, nms_threshold=0.5) == {"dog": [1], "cat": [3]}  # IoU 0.71


def objects(**classes):
    """objects(dog=[(box, colour), ...]) with class names whose spaces are written as underscores."""
    return {name.replace("_", " "): found for name, found in classes.items()}


BOX = [0, 0, 10, 10]


def test_geneval_single_and_two_object():
    single = {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}
    assert geneval_judge(objects(dog=[(BOX, None)]), single) == (True, 1.0)
    assert geneval_judge({}, single) == (False, 0.0)
    # GenEval accepts extra instances; Flow-GRPO's partial credit charges |1 - 2| / 1.
    assert geneval_judge(objects(dog=[(BOX, None)] * 2), single) == (True, 0.0)
    assert geneval_judge(objects(dog=[(BOX, None)] * 3), single) == (True, -1.0)
    two = {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "tv remote", "count": 1}]}
    assert geneval_judge(objects(dog=[(BOX, None)], tv_remote=[(BOX, None)]), two) == (True, 1.0)
    assert geneval_judge(objects(tv_remote=[(BOX, None)]), two) == (False, 0.5)


def test_geneval_counting():
    meta = {"tag": "counting", "include": [{"class": "cat", "count": 3}], "exclude": [{"class": "cat", "count": 4}]}
    assert geneval_judge(objects(cat=[(BOX, None)] * 3), meta) == (True, 1.0)
    assert geneval_judge(objects(cat=[(BOX, None)] * 4), meta) == (False, pytest.approx(2 / 3))  # exclude fails
    assert geneval_judge(objects(cat=[(BOX, None)] * 2), meta) == (False, pytest.approx(2 / 3))
    assert geneval_judge(objects(cat=[(BOX, None)] * 6), meta) == (False, 0.0)


def test_geneval_colors():
    meta = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
    assert geneval_judge(objects(car=[(BOX, "red")]), meta) == (True, 1.0)
    assert geneval_judge(objects(car=[(BOX, "blue")]), meta) == (False, 0.5)  # count met, colour not
    assert geneval_judge({}, meta) == (False, 0.0)  # count term 0 and the colour term 0
    # GenEval judges the most confident car only; Flow-GRPO wants exactly one car.
    assert geneval_judge(objects(car=[(BOX, "red"), (BOX, None)]), meta) == (True, 0.0)
    assert geneval_judge(objects(car=[(BOX, "blue"), (BOX, None)]), meta) == (False, 0.0)


def test_geneval_position():
    # "a photo of a dog left of a cat": include 0 is the cat (target), include 1 the dog with ("left of", 0).
    meta = {"tag": "position", "include": [{"class": "cat", "count": 1},
                                           {"class": "dog", "count": 1, "position": ["left of", 0]}]}
    cat, left, right = [200, 0, 240, 40], [0, 0, 40, 40], [400, 0, 440, 40]
    assert geneval_judge(objects(cat=[(cat, None)], dog=[(left, None)]), meta) == (True, 1.0)
    assert geneval_judge(objects(cat=[(cat, None)], dog=[(right, None)]), meta) == (False, pytest.approx(2 / 3))
    assert geneval_judge(objects(dog=[(left, None)]), meta) == (False, pytest.approx(1 / 3))  # no target
    assert geneval_judge(objects(cat=[(cat, None)], dog=[(left, None), (right, None)]), meta) == (
        True, pytest.approx(1 / 3))  # GenEval judges the best dog; Flow-GRPO: 2 != 1 -> [1, 0, 0]
    # Overlapping objects have no relation at all.
    assert geneval_judge(objects(cat=[(cat, None)], dog=[(cat, None)]), meta)[0] is False


def test_geneval_color_attr_and_summary():
    meta = {"tag": "color_attr", "include": [{"class": "bus", "count": 1, "color": "yellow"},
                                             {"class": "handbag", "count": 1, "color": "orange"}]}
    assert geneval_judge(objects(bus=[(BOX, "yellow")], handbag=[(BOX, "orange")]), meta) == (True, 1.0)
    assert geneval_judge(objects(bus=[(BOX, "yellow")], handbag=[(BOX, "red")]), meta) == (False, 0.75)
    assert geneval_judge(objects(bus=[(BOX, "yellow")]), meta) == (False, 0.5)
    summary = geneval_summary([1, 0, 1, 1, 0], ["counting", "counting", "colors", "position", "position"])
    assert summary == {"geneval_score": pytest.approx((0.5 + 1 + 0.5) / 3), "geneval/counting": 0.5,
                       "geneval/colors": 1.0, "geneval/position": 0.5}


def test_mask2former_postprocess_on_hand_built_logits():
    q, classes, h, w = 3, len(GENEVAL_CLASSES), 20, 30
    class_logits = torch.full((q, classes + 1), -10.0)
    class_logits[0, 16] = 10.0  # query 0: a confident dog
    class_logits[1, -1] = 10.0  # query 1: no object
    class_logits[2] = 0.0
    class_logits[2, 2] = 1.0  # query 2: unsure, car at e / (e + 80) = 0.033
    mask_logits = torch.full((q, h, w), -5.0)
    mask_logits[0, 4:10, 5:25] = 5.0  # rows 4..9, columns 5..24
    mask_logits[2, 0:2, 0:2] = 5.0
    boxes, labels, scores, masks = mask2former_instances(class_logits, mask_logits, max_per_image=2)
    assert labels.tolist() == [16, 2] and masks.shape == (2, h, w)
    assert boxes[0].tolist() == [5.0, 4.0, 25.0, 10.0]  # mmdet mask2bbox: (x1, y1, x2 + 1, y2 + 1)
    assert scores[0].item() == pytest.approx(torch.sigmoid(torch.tensor(5.0)).item(), abs=1e-3)
    assert scores[1].item() == pytest.approx(np.e / (np.e + 80) * torch.sigmoid(torch.tensor(5.0)).item(), rel=1e-3)
    empty = masks_to_boxes(torch.zeros(1, 4, 4, dtype=torch.bool))
    assert empty.tolist() == [[0.0, 0.0, 0.0, 0.0]]


def test_mask2former_inputs_follow_mmdet_test_pipeline():
    images = torch.stack([torch.full((3, 64, 96), 0.485), torch.zeros(3, 64, 96)])  # (2, 3, 64, 96)
    pixels, pixel_mask, (h, w) = mask2former_inputs(images)
    assert (h, w) == (800, 1200)  # scale min(800 / 64, 1333 / 96) = 12.5
    assert pixels.shape == (2, 3, 800, 1216) and pixel_mask.shape == (2, 800, 1216)  # width padded to /32
    assert pixel_mask[:, :, :1200].all() and not pixel_mask[:, :, 1200:].any()
    assert pixels[0, 0, :, :1200].abs().max() < 1e-5  # channel 0 mean 0.485 -> 0
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    torch.testing.assert_close(pixels[1, :, 5, 5], -mean / std)
    assert (pixels[:, :, :, 1200:] == 0).all()


def test_object_crops_paste_on_grey_and_cut_to_box():
    image = torch.rand(3, 10, 12)
    mask = torch.zeros(1, 10, 12, dtype=torch.bool)
    mask[0, 2:5, 3:8] = True
    mask[0, 2, 3] = False  # a hole inside the box shows the grey background
    (crop,) = object_crops(image, masks_to_boxes(mask), mask)
    assert crop.shape == (3, 3, 5)
    torch.testing.assert_close(crop[:, 1:, :], image[:, 3:5, 3:8])
    torch.testing.assert_close(crop[:, 0, 0], torch.full((3,), 0x99 / 255))


def test_zero_shot_weights_average_each_class_templates():
    # Two classes x three templates, class-major: class 0 templates lean on axis 0, class 1 on axis 1.
    feats = F.normalize(torch.tensor([[1.0, 0.2, 0], [1, -0.2, 0], [1, 0, 0.3],
                                      [0.1, 1, 0], [-0.1, 1, 0], [0, 1, 0.0]]), dim=-1)
    weights = zero_shot_weights(feats, 2)
    expected = F.normalize(torch.stack([feats[:3].mean(0), feats[3:].mean(0)]), dim=-1)
    torch.testing.assert_close(weights, expected)
    assert (weights.argmax(-1) == torch.tensor([0, 1])).all()


def test_geneval_tiny_models_end_to_end(mask2former_dir, clip_dir, monkeypatch):
    # 48 x 80 at a 256 shortest edge -> 256 x 427, padded to 448: the padding is cropped off the mask logits.
    monkeypatch.setattr(geneval, "M2F_SHORT", 256)
    score = load_rewards({"geneval": 1.0}, model_paths={"mask2former": mask2former_dir, "clip_l14": clip_dir},
                         batch_size=2)
    metadata = [
        {"tag": "single_object", "include": [{"class": "car", "count": 1}], "prompt": "a photo of a car"},
        {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"},
        {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}], "prompt": "a photo of a red car"},
    ]
    total, parts = score(smooth_images(3, 48, 80, seed=2), [m["prompt"] for m in metadata], metadata)
    assert total.shape == (3,) and torch.isfinite(total).all()
    torch.testing.assert_close(parts["geneval"], total)
    # The class head says "car" for every query: a car is found, a dog never is.
    assert parts["geneval_correct"][:2].tolist() == [1.0, 0.0]
    assert parts["geneval"][1] == 0.0
    with pytest.raises(ValueError, match="GenEval metadata"):
        score(torch.zeros(1, 3, 32, 32), ["a car"], [{}])


def test_geneval_colour_classifier_decides_colour_prompts(mask2former_dir, clip_dir, monkeypatch):
    """The same image asked for each of the 10 colours: the CLIP colour of the best car matches exactly one."""
    monkeypatch.setattr(geneval, "M2F_SHORT", 128)  # a small detector input keeps this test fast
    score = load_rewards({"geneval": 1.0}, model_paths={"mask2former": mask2former_dir, "clip_l14": clip_dir},
                         batch_size=5)
    metadata = [{"tag": "colors", "include": [{"class": "car", "count": 1, "color": c}]}
                for c in geneval.GENEVAL_COLORS]
    images = smooth_images(1, 48, 48, seed=3).expand(10, -1, -1, -1)  # (10, 3, 48, 48)
    _, parts = score(images, ["a car"] * 10, metadata)
    assert parts["geneval_correct"].sum() == 1


# ---------------------------------------------------------------------------------------------------------------
# Prompt sets
# ---------------------------------------------------------------------------------------------------------------

def test_load_prompts(tmp_path):
    txt = tmp_path / "test.txt"
    txt.write_text("a cat\n\n  a dog on a log  \n")
    assert load_prompts(txt) == (["a cat", "a dog on a log"], [{}, {}])
    record = {"tag": "counting", "include": [{"class": "cat", "count": 2}], "prompt": "a photo of two cats"}
    jsonl = tmp_path / "test_metadata.jsonl"
    jsonl.write_text(json.dumps(record) + "\n")
    assert load_prompts(jsonl) == (["a photo of two cats"], [record])
    with pytest.raises(FileNotFoundError, match="dataset/"):
        load_prompts(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        load_prompts(tmp_path / "empty.txt")
    (tmp_path / "bad.jsonl").write_text('{"tag": "x"}\n')
    with pytest.raises(ValueError, match="record 1"):
        load_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "p.csv").write_text("a\n")
    with pytest.raises(ValueError, match="suffix"):
        load_prompts(tmp_path / "p.csv")
