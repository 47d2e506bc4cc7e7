"""Tests for quality.py and the DrawBench evaluation: offline, CPU, on tiny random-weight models of both
architectures built in code and saved as the real checkpoints are laid out.

ImageReward: a checkpoint with ImageReward.pt's own key names (BLIP's vit.py / med.py), scored through the loader
and against an independent functional forward of those original weights. UnifiedReward: a tiny Qwen2.5-VL with a
byte-level tokenizer, image processor and chat template; its inputs against transformers' own Qwen2_5_VLProcessor.

Direction (a better image scoring higher) cannot be arranged with random weights for either model: ImageReward's
notion of better is its trained MLP head, UnifiedReward's is the text its trained language model writes. What can be
checked is that the trained parts would be read correctly: the renamed weights give the original forward, the
normalization and the score parsing are the authors' (an answer saying 'Final Score: 4' scores 4)."""

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import (BertTokenizer, GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                          Qwen2_5_VLProcessor, Qwen2Tokenizer)
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

import config
import evaluate
import quality
import rewards
from test_rewards import aesthetic_path, clip_dir, smooth_images  # noqa: F401  (fixtures for the DrawBench run)

# ---------------------------------------------------------------------------------------------------------------
# ImageReward: a tiny checkpoint in the original key names, and the original forward written out
# ---------------------------------------------------------------------------------------------------------------

VIT = dict(width=128, depth=2, mlp=256, patch=16, image=224, heads=2)  # heads = width / 64, as BLIP's ViTs
BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0,
            add_cross_attention=True, encoder_width=768)
WORDS = ["a", "red", "car", "cat", "on", "the", "mat", "of", "photo", "dog", "big", "blue", "sky"]


def tiny_bert_vocab():
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + list("abcdefghijklmnopqrstuvwxyz.,")
    return {p: i for i, p in enumerate(pieces + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"])}


def original_imagereward_weights(vocab_size, seed=0):
    """Random weights under ImageReward.pt's names: BLIP's ViT, the med.py BERT with cross-attention, the MLP,
    and the parts the score never reads (projections, the position_ids buffer)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    def linear(key, n_out, n_in):
        sd[key + ".weight"], sd[key + ".bias"] = r(n_out, n_in, scale=n_in ** -0.5), r(n_out, scale=0.02)

    def norm(key, n):
        sd[key + ".weight"], sd[key + ".bias"] = 1 + r(n), r(n)

    sd, D, H = {}, VIT["width"], BERT["hidden_size"]
    v, t = "blip.visual_encoder.", "blip.text_encoder."
    sd[v + "cls_token"], sd[v + "pos_embed"] = r(1, 1, D), r(1, 1 + (VIT["image"] // VIT["patch"]) ** 2, D)
    sd[v + "patch_embed.proj.weight"], sd[v + "patch_embed.proj.bias"] = r(D, 3, VIT["patch"], VIT["patch"]), r(D)
    for i in range(VIT["depth"]):
        b = f"{v}blocks.{i}."
        norm(b + "norm1", D), linear(b + "attn.qkv", 3 * D, D), linear(b + "attn.proj", D, D)
        norm(b + "norm2", D), linear(b + "mlp.fc1", VIT["mlp"], D), linear(b + "mlp.fc2", D, VIT["mlp"])
    norm(v + "norm", D)
    sd[t + "embeddings.word_embeddings.weight"] = r(vocab_size, H, scale=1.0)
    sd[t + "embeddings.position_embeddings.weight"] = r(BERT["max_position_embeddings"], H, scale=1.0)
    sd[t + "embeddings.position_ids"] = torch.arange(BERT["max_position_embeddings"])[None]
    norm(t + "embeddings.LayerNorm", H)
    for i in range(BERT["num_hidden_layers"]):
        b = f"{t}encoder.layer.{i}."
        for part, width in (("attention", H), ("crossattention", D)):
            linear(b + part + ".self.query", H, H)
            linear(b + part + ".self.key", H, width), linear(b + part + ".self.value", H, width)
            linear(b + part + ".output.dense", H, H), norm(b + part + ".output.LayerNorm", H)
        linear(b + "intermediate.dense", BERT["intermediate_size"], H)
        linear(b + "output.dense", H, BERT["intermediate_size"]), norm(b + "output.LayerNorm", H)
    for j, (n_out, n_in) in zip((0, 2, 4, 6, 7), ((1024, H), (128, 1024), (64, 128), (16, 64), (1, 16))):
        linear(f"mlp.layers.{j}", n_out, n_in)
    linear("blip.vision_proj", 256, D), linear("blip.text_proj", 256, H)
    return sd


def reference_imagereward(sd, pixels, input_ids, attention_mask):
    """ImageReward.score_gard written out on the original weights (vit.py, med.py with mode='multimodal')."""
    def lin(x, key):
        return F.linear(x, sd[key + ".weight"], sd[key + ".bias"])

    def ln(x, key, eps):
        return F.layer_norm(x, x.shape[-1:], sd[key + ".weight"], sd[key + ".bias"], eps)

    def attend(q, k, v, heads, bias=0.0):
        n, length, width = q.shape
        split = lambda x: x.view(n, x.shape[1], heads, width // heads).transpose(1, 2)  # noqa: E731
        s = split(q) @ split(k).transpose(-1, -2) / math.sqrt(width // heads) + bias
        return (s.softmax(-1) @ split(v)).transpose(1, 2).reshape(n, length, width)

    v, t = "blip.visual_encoder.", "blip.text_encoder."
    x = F.conv2d(pixels, sd[v + "patch_embed.proj.weight"], sd[v + "patch_embed.proj.bias"], stride=VIT["patch"])
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([sd[v + "cls_token"].expand(len(x), -1, -1), x], 1) + sd[v + "pos_embed"]
    for i in range(VIT["depth"]):
        b = f"{v}blocks.{i}."
        q, k, val = lin(ln(x, b + "norm1", 1e-6), b + "attn.qkv").chunk(3, dim=-1)
        x = x + lin(attend(q, k, val, VIT["heads"]), b + "attn.proj")
        x = x + lin(F.gelu(lin(ln(x, b + "norm2", 1e-6), b + "mlp.fc1")), b + "mlp.fc2")
    image = ln(x, v + "norm", 1e-6)
    y = sd[t + "embeddings.word_embeddings.weight"][input_ids]
    y = ln(y + sd[t + "embeddings.position_embeddings.weight"][:input_ids.shape[1]], t + "embeddings.LayerNorm", 1e-12)
    mask = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0  # med.py get_extended_attention_mask
    heads = BERT["num_attention_heads"]
    for i in range(BERT["num_hidden_layers"]):
        b = f"{t}encoder.layer.{i}."
        for part, source, bias in (("attention", y, mask), ("crossattention", image, 0.0)):
            a = attend(lin(y, b + part + ".self.query"), lin(source, b + part + ".self.key"),
                       lin(source, b + part + ".self.value"), heads, bias)
            y = ln(lin(a, b + part + ".output.dense") + y, b + part + ".output.LayerNorm", 1e-12)
        y = ln(lin(F.gelu(lin(y, b + "intermediate.dense")), b + "output.dense") + y, b + "output.LayerNorm", 1e-12)
    r = y[:, 0]
    for j in (0, 2, 4, 6, 7):
        r = lin(r, f"mlp.layers.{j}")
    return (r.squeeze(-1) - 0.16717362830052426) / 1.0333394966054072  # ImageReward.py's mean and std


@pytest.fixture(scope="module")
def imagereward_dir(tmp_path_factory):
    """ImageReward.pt (a plain state dict of tensors), med_config.json and a bert-style tokenizer in one folder."""
    path = tmp_path_factory.mktemp("tiny_imagereward")
    vocab = tiny_bert_vocab()
    BertTokenizer(vocab=vocab).save_pretrained(path)
    torch.save(original_imagereward_weights(len(vocab) + 2), path / "ImageReward.pt")  # + [DEC], [ENC]
    (path / "med_config.json").write_text(json.dumps(dict(BERT, vocab_size=len(vocab) + 2, model_type="bert")))
    return path


PROMPTS = ["a red car", "a photo of a cat on the mat", "a big blue sky " * 12, "dog"]  # the third > 35 tokens


def test_imagereward_is_the_original_forward_of_the_renamed_weights(imagereward_dir):
    paths = {"imagereward": str(imagereward_dir), "imagereward_tokenizer": str(imagereward_dir)}
    total, parts = rewards.load_rewards({"imagereward": 1.0}, model_paths=paths, batch_size=3)(
        smooth_images(4, 96, 128), PROMPTS, [{}] * 4)
    model, tokenizer = quality._load_imagereward(str(imagereward_dir), str(imagereward_dir), "cpu")
    assert model.vision.config.num_attention_heads == VIT["heads"] and len(tokenizer) == len(tiny_bert_vocab()) + 2
    assert model.vision.config.layer_norm_eps == 1e-6  # vit.py: partial(nn.LayerNorm, eps=1e-6)
    tokens = tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    assert tokens.input_ids.shape == (4, 35) and tokens.attention_mask[2].all() and not tokens.attention_mask[0].all()
    assert (tokens.input_ids[:, 0] == tokenizer.cls_token_id).all()  # [CLS] stays first: its state is scored
    pixels = rewards.clip_preprocess(rewards._quantize(smooth_images(4, 96, 128)), 224, (224, 224),
                                     torch.tensor(quality.CLIP_MEAN).view(1, 3, 1, 1),
                                     torch.tensor(quality.CLIP_STD).view(1, 3, 1, 1))
    state = torch.load(imagereward_dir / "ImageReward.pt", weights_only=True)
    expected = reference_imagereward(state, pixels, tokens.input_ids, tokens.attention_mask)
    assert expected.std() > 0.05  # the prompts and images move the score: the comparison can fail
    torch.testing.assert_close(parts["imagereward"], expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(total, parts["imagereward"])


def test_imagereward_preprocessing_is_pil_bicubic_224_with_clip_statistics():
    """ImageReward.py's _transform on PIL: Resize(224, BICUBIC) of the short side, CenterCrop(224), CLIP mean/std."""
    image = rewards._quantize(smooth_images(1, 300, 240, seed=4))
    pil = Image.fromarray((image[0] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy())
    pil = pil.resize((224, 280), Image.BICUBIC).crop((0, 28, 224, 252))  # 240 x 300 -> 224 x 280, centre 224
    expected = (torch.tensor(list(pil.getdata()), dtype=torch.float32).view(224, 224, 3).permute(2, 0, 1) / 255
                - torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)) \
        / torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)
    got = rewards.clip_preprocess(image, 224, (224, 224), torch.tensor(quality.CLIP_MEAN).view(1, 3, 1, 1),
                                  torch.tensor(quality.CLIP_STD).view(1, 3, 1, 1))[0]
    diff = (got - expected).abs()
    assert diff.max() < 0.05 and diff.mean() < 0.01  # PIL's uint8 rounding after its bicubic pass


def test_imagereward_batches_equal_one_by_one_and_missing_files_fail_in_one_line(imagereward_dir, tmp_path):
    paths = {"imagereward": str(imagereward_dir), "imagereward_tokenizer": str(imagereward_dir)}
    images = smooth_images(4, 64, 64, seed=5)
    batched = rewards.load_rewards({"imagereward": 1.0}, model_paths=paths, batch_size=4)(images, PROMPTS, [{}] * 4)
    single = rewards.load_rewards({"imagereward": 1.0}, model_paths=paths, batch_size=1)(images, PROMPTS, [{}] * 4)
    torch.testing.assert_close(batched[0], single[0], atol=1e-5, rtol=0)
    (tmp_path / "med_config.json").write_text("{}")
    with pytest.raises(rewards.RewardLoadError) as err:
        rewards.load_rewards({"imagereward": 1.0}, model_paths={"imagereward": str(tmp_path)})
    assert "ImageReward.pt is not in" in str(err.value) and "\n" not in str(err.value)
    assert "hf download THUDM/ImageReward" in str(err.value)


def test_imagereward_key_mapping_drops_only_unused_weights():
    state = original_imagereward_weights(50)
    renamed = quality.imagereward_state_dict(state)
    dropped = {k for k in state if not any(re.match(p, k) for p, _ in quality.IMAGEREWARD_KEYS)}
    assert dropped == {"blip.text_encoder.embeddings.position_ids", "blip.vision_proj.weight", "blip.vision_proj.bias",
                       "blip.text_proj.weight", "blip.text_proj.bias"}
    proj = "vision.encoder.layers.1.self_attn.projection.weight"
    assert renamed[proj] is state["blip.visual_encoder.blocks.1.attn.proj.weight"]
    assert renamed["text.encoder.layer.0.crossattention.self.key.weight"].shape == (32, VIT["width"])
    assert renamed["mlp.7.bias"] is state["mlp.layers.7.bias"]


# ---------------------------------------------------------------------------------------------------------------
# UnifiedReward: a tiny Qwen2.5-VL saved as a checkpoint folder
# ---------------------------------------------------------------------------------------------------------------

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                "<|video_pad|>"]
# Qwen2-VL's chat template, shortened to what one user turn with an image and a text uses (its default system turn
# included)
QWEN_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def unifiedreward_dir(tmp_path_factory):
    """A 1-layer Qwen2.5-VL (vision and text width 32) with greedy decoding, one token per byte, the PIL image
    processor and the chat template, saved as UnifiedReward-qwen-7b's folder is laid out."""
    path = tmp_path_factory.mktemp("tiny_unifiedreward")
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    vocab.update({s: len(vocab) + i for i, s in enumerate(QWEN_SPECIAL)})
    Qwen2Tokenizer(vocab=vocab, merges=[], additional_special_tokens=QWEN_SPECIAL[1:]).save_pretrained(path)
    Qwen2VLImageProcessorPil().save_pretrained(path)
    (path / "chat_template.jinja").write_text(QWEN_TEMPLATE)
    ids = {s: vocab[s] for s in QWEN_SPECIAL}
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                           fullatt_block_indexes=[0]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    model.generation_config = GenerationConfig(do_sample=False, eos_token_id=ids["<|im_end|>"],
                                               pad_token_id=ids["<|endoftext|>"])
    model.save_pretrained(path)
    return path


def processor_oracle(tokenizer, image_processor, template):
    """transformers' Qwen2_5_VLProcessor without the video processor it cannot build here (torchvision): the image
    and text paths the demo code calls are the real ones."""
    processor = Qwen2_5_VLProcessor.__new__(Qwen2_5_VLProcessor)
    processor.image_processor, processor.tokenizer, processor.chat_template = image_processor, tokenizer, template
    processor.video_processor = None
    processor.image_token, processor.video_token = "<|image_pad|>", "<|video_pad|>"
    processor.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    processor.video_token_id = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    return processor


CAPTIONS = ["a red car", "a photo of a cat sitting on a striped mat", "x"]


def test_unifiedreward_inputs_match_the_qwen_processor_on_the_demo_prompt(unifiedreward_dir, monkeypatch):
    model, tokenizer, image_processor, template = quality._load_unifiedreward(str(unifiedreward_dir), "cpu")
    assert smart_resize(512, 512) == (quality.UNIFIEDREWARD_INPUT,) * 2  # fetch_image's size, a no-op afterwards
    images = quality.unifiedreward_images(smooth_images(3, 64, 96, seed=6))
    assert [im.size for im in images] == [(504, 504)] * 3
    ours = quality.unifiedreward_inputs(tokenizer, image_processor, template, images, CAPTIONS)
    processor = processor_oracle(tokenizer, image_processor, template)
    messages = [[{"role": "user", "content": [{"type": "image", "image": im},
                                              {"type": "text", "text": quality.unifiedreward_question(c)}]}]
                for im, c in zip(images, CAPTIONS)]
    texts = [processor.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
    monkeypatch.setattr(tokenizer, "padding_side", "left")  # the processor pads on the tokenizer's side
    expected = processor(text=texts, images=images, padding=True, return_tensors="pt")
    assert set(ours) == set(expected)
    for key in expected:
        assert torch.equal(ours[key], expected[key]), key
    assert (ours["mm_token_type_ids"].sum(-1) == 324).all()  # (504 / 14)^2 patches merged 2 x 2
    assert ours["attention_mask"][:, -1].all() and not ours["attention_mask"][:, 0].all()  # left padding
    text = tokenizer.decode(ours["input_ids"][1], skip_special_tokens=False)
    assert text.count("<|image_pad|>") == 324 and text.endswith(
        "after 'Final Score:'.\nYour task is provided as follows:\nText Caption: [a photo of a cat sitting on a "
        "striped mat]<|im_end|>\n<|im_start|>assistant\n")
    assert "<|vision_end|>You are given a text caption and a generated image based on that caption." in text


def test_unifiedreward_batched_answers_equal_one_by_one_and_random_ones_score_nan(unifiedreward_dir):
    model, tokenizer, image_processor, template = quality._load_unifiedreward(str(unifiedreward_dir), "cpu")
    images = quality.unifiedreward_images(smooth_images(3, 32, 32, seed=7))
    batched = quality.unifiedreward_answers(model, tokenizer, image_processor, template, images, CAPTIONS, 6)
    single = [quality.unifiedreward_answers(model, tokenizer, image_processor, template, [im], [c], 6)[0]
              for im, c in zip(images, CAPTIONS)]
    assert batched == single and len(set(batched)) > 1  # prompts of different lengths, left-padded together
    score = rewards.load_rewards({"unifiedreward": 1.0}, model_paths={"unifiedreward": str(unifiedreward_dir)},
                                 batch_size=2, options={"unifiedreward": {"max_new_tokens": 6}})
    total, parts = score(smooth_images(3, 32, 32, seed=7), CAPTIONS, [{}] * 3)
    assert parts["unifiedreward"].isnan().all() and total.isnan().all()  # random bytes: no score, no crash


def test_parse_final_score_is_the_demo_regex():
    assert quality.parse_final_score("car (object): 1\nFinal Score: 4") == 4.0
    assert quality.parse_final_score("Final Score:3.5 because") == 3.5
    assert quality.parse_final_score("Final Score: 2 ... Final Score: 5") == 2.0  # the first one
    assert quality.parse_final_score("Final Score: 10") == 1.0  # [1-5] then optional decimals: reads "1"
    for unparsable in ("final score: 4", "Final Score: 0", "Final Score: 7", "Score: 4", "", "Final Score: four"):
        assert math.isnan(quality.parse_final_score(unparsable)), unparsable


def test_unifiedreward_reads_each_rows_answer_after_left_padding(unifiedreward_dir, monkeypatch):
    """generate() stubbed to answer given texts: the scorer cuts each row's answer after the shared prompt end."""
    model, tokenizer, _, _ = quality._load_unifiedreward(str(unifiedreward_dir), "cpu")
    answers = ["car (object): 1\nFinal Score: 4", "I cannot tell.", "Final Score: 2.5"]
    seen = {}

    def generate(input_ids, max_new_tokens, **inputs):
        seen.update(inputs, input_ids=input_ids)
        new = tokenizer(answers, padding=True, padding_side="right", return_tensors="pt").input_ids
        return torch.cat([input_ids, new], dim=1)

    monkeypatch.setattr(model, "generate", generate)
    score = rewards.load_rewards({"unifiedreward": 1.0}, model_paths={"unifiedreward": str(unifiedreward_dir)},
                                 batch_size=3)
    _, parts = score(smooth_images(3, 32, 32, seed=8), CAPTIONS, [{}] * 3)
    torch.testing.assert_close(parts["unifiedreward"], torch.tensor([4.0, math.nan, 2.5]), equal_nan=True)
    assert seen["pixel_values"].dtype == model.dtype and seen["image_grid_thw"].tolist() == [[1, 36, 36]] * 3


# ---------------------------------------------------------------------------------------------------------------
# The DrawBench table end to end, and NaN in the summary
# ---------------------------------------------------------------------------------------------------------------

def test_summarize_leaves_nan_out_and_counts_it():
    summary = evaluate.summarize({"u": torch.tensor([1.0, math.nan, 3.0, math.nan]), "p": torch.tensor([1.0, 2.0])})
    # over the two values: mean 2, std of [1, 3] = sqrt 2, SE = sqrt 2 / sqrt 2
    assert summary["u"] == 2.0 and summary["u_failed"] == 2 and summary["u_se"] == pytest.approx(1.0)
    assert "p_failed" not in summary and summary["p"] == 1.5
    assert evaluate.per_image({"u": torch.tensor([0.5, math.nan])}) == {"u": [0.5, None]}


def test_drawbench_table_on_tiny_models(tmp_path, capsys, clip_dir, aesthetic_path, imagereward_dir,
                                        unifiedreward_dir):
    """`evaluate.py --task drawbench --model tiny --checkpoint none` offline: every column of the table."""
    prompts = tmp_path / "drawbench.txt"
    prompts.write_text("a red car\na cat on a mat\nan elephant under the sea\n")
    paths = (f"pickscore={clip_dir},pickscore_processor={clip_dir},clip_l14={clip_dir},aesthetic={aesthetic_path},"
             f"imagereward={imagereward_dir},imagereward_tokenizer={imagereward_dir},unifiedreward={unifiedreward_dir}")
    out = tmp_path / "eval"
    summary = evaluate.main(["--task", "drawbench", "--model", "tiny", "--checkpoint", "none", "--eval-prompts",
                             str(prompts), "--eval-samples", "3", "--eval-steps", "2", "--resolution", "32",
                             "--reward-batch", "2", "--model-paths", paths, "--output-dir", str(out)])
    written = json.loads((out / "eval.json").read_text())
    for metric in ("pickscore_raw", "aesthetic", "imagereward"):
        assert math.isfinite(written[metric]) and len(written["per_image"][metric]) == 3, metric
        assert written[metric + "_se"] > 0
    # the tiny judge writes random bytes: no score, counted, the table still written
    assert written["per_image"]["unifiedreward"] == [None] * 3 and written["unifiedreward_failed"] == 3
    torch.testing.assert_close(torch.tensor(written["per_image"]["reward"]),
                               torch.tensor(written["per_image"]["pickscore"]))  # weights 0: reported only
    assert summary["imagereward"] == written["imagereward"]
    table = capsys.readouterr().out
    assert all(name in table for name in ("pickscore_raw", "aesthetic", "imagereward", "unifiedreward_failed"))
    assert config.PRESETS["drawbench"]["eval_prompts"] == "dataset/drawbench/test.txt"
    with pytest.raises(SystemExit) as err:
        config.parse_config(["--task", "drawbench"])
    assert err.value.code != 0 and "evaluation preset" in capsys.readouterr().err
