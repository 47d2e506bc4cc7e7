"""lab/toyscore.py and the shipped toyscore/: the `toyscore` reward is the `pickscore` code on the shipped folder
(against a plain transformers computation), scores deterministically, prefers the correct rendered scene as often as
recipe.json says; the recipe's losses and statistics against hand computation, and the recipe reproduces its
weights on a small scale; a run on ToyScore evaluates itself and reports the gold's paired change."""

import json
import os

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, CLIPModel

import config
import evaluate
import rewards
import toyworld
import train
from lab import toyscore as T

FOLDER = rewards.DEFAULT_MODELS["toyscore"]


def heldout_renders(n):
    prompts, metas, seeds = toyworld.dataset("heldout", 0, n)
    return toyworld.render(metas, seeds), prompts, metas  # (n, 3, H, W)


def test_the_reward_is_pickscores_code_on_the_shipped_folder():
    score = rewards.load_rewards({"toyscore": 1.0})
    images, prompts, metas = heldout_renders(6)
    images[3:] = images[3:].flip(-1) * 0.7 + 0.1  # not only renders: mirrored, darkened pixels
    total, parts = score(images, prompts, metas)
    assert set(parts) == {"toyscore", "toyscore_raw"}
    torch.testing.assert_close(total, parts["toyscore_raw"] / rewards.PICKSCORE_TRAIN_SCALE)
    # the oracle: plain transformers on the folder; at 32 px the CLIP preprocessing is only the normalisation
    model, tokenizer = CLIPModel.from_pretrained(FOLDER).eval(), AutoTokenizer.from_pretrained(FOLDER)
    config = json.load(open(os.path.join(FOLDER, "preprocessor_config.json")))
    assert config["size"]["shortest_edge"] == config["crop_size"]["height"] == toyworld.RESOLUTION
    mean, std = (torch.tensor(config[k]).view(1, 3, 1, 1) for k in ("image_mean", "image_std"))
    with torch.no_grad():
        pixels = ((images * 255).round() / 255 - mean) / std  # (6, 3, H, W) 8-bit levels, as every scorer sees
        img = F.normalize(model.get_image_features(pixel_values=pixels).pooler_output, dim=-1)  # (6, D)
        txt = F.normalize(model.get_text_features(**tokenizer(prompts, padding=True, return_tensors="pt"))
                          .pooler_output, dim=-1)  # (6, D)
        expected = model.logit_scale.exp() * (img * txt).sum(-1)  # (6,)
    torch.testing.assert_close(parts["toyscore_raw"], expected, atol=1e-5, rtol=1e-5)


def test_scoring_is_deterministic():
    score = rewards.load_rewards({"toyscore": 1.0}, batch_size=8)
    images, prompts, metas = heldout_renders(12)
    once, again = score(images, prompts, metas)[0], score(images, prompts, metas)[0]
    assert torch.equal(once, again)
    halves = torch.cat([score(images[:5], prompts[:5], metas[:5])[0], score(images[5:], prompts[5:], metas[5:])[0]])
    # another split is another batch shape: CPU kernels may sum in another order there (here or on other CPUs),
    # so the scores agree to float rounding, not bit for bit
    torch.testing.assert_close(halves, once, atol=1e-5, rtol=1e-5)


def test_the_correct_scene_wins_as_often_as_the_recipe_reports():
    reported = json.load(open(os.path.join(FOLDER, T.RECIPE)))["agreement"]["renders"]
    _, raw = T.scorer(FOLDER)
    found = T.render_agreement(raw, reported["renders"])
    for key in ("correct_vs_wrong_colour", "correct_vs_wrong_count"):
        assert found[key] >= reported[key] - 1e-9, key


def test_contrastive_loss_against_the_naive_loops():
    g = torch.Generator().manual_seed(0)
    b, K = 4, 6
    img = F.normalize(torch.randn(3 * b, 8, generator=g), dim=-1)  # (3b, D)
    txt = F.normalize(torch.randn(K, 8, generator=g), dim=-1)  # (K, D)
    caption = torch.tensor([0, 1, 2, 3, 1, 5, 4, 0, 2, 2, 3, 5])  # image 4 shows caption 1, a second positive of row 1
    scale = torch.tensor(10.0)
    loss = T.contrastive_loss(scale, img, txt, caption)
    sim = scale * img @ txt.T  # (3b, K)
    i2t = sum(-sim[r].log_softmax(0)[caption[r]] for r in range(3 * b)) / (3 * b)
    t2i = 0
    for i in range(b):
        keep = [j for j in range(3 * b) if j == i or caption[j] != caption[i]]
        t2i += -sim[keep, caption[i]].log_softmax(0)[keep.index(i)] / b
    torch.testing.assert_close(loss, (i2t + t2i) / 2)


def test_preference_objective_and_labels():
    labels = T.preference_labels(torch.tensor([0.9, 0.2, 0.5]), torch.tensor([0.1, 0.3, 0.5]))
    assert labels.tolist() == [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]
    cos_a, cos_b, s = torch.tensor([0.5, 0.1, 0.2]), torch.tensor([0.1, 0.4, 0.2]), torch.tensor(20.0)
    p_a = torch.sigmoid(s * (cos_a - cos_b))  # a two-way softmax is a sigmoid of the difference
    expected = -(labels[:, 0] * p_a.log() + labels[:, 1] * (1 - p_a).log()).mean()
    torch.testing.assert_close(T.preference_loss(s, cos_a, cos_b, labels), expected)
    # pairs are two different images of one caption
    by_caption = torch.arange(12).reshape(3, 4)
    a, b = T.draw_pairs(by_caption, 200, torch.Generator().manual_seed(1))
    assert bool((a != b).all()) and torch.equal(a // 4, b // 4)


def test_agreement_statistics_against_hand_computation():
    x, y = torch.tensor([1.0, 2.0, 2.0, 5.0]).double(), torch.tensor([0.0, 1.0, 3.0, 2.0]).double()
    assert T.ranks(x).tolist() == [0.0, 1.5, 1.5, 3.0]
    xc, yc = x - x.mean(), y - y.mean()
    assert abs(T.pearson(x, y) - float(xc @ yc / (xc.norm() * yc.norm()))) < 1e-12
    assert abs(T.spearman(x, y) - T.pearson(torch.tensor([0, 1.5, 1.5, 3]), torch.tensor([0.0, 1, 3, 2]))) < 1e-12
    # groups {0, 1, 2} and {3, 4}: gold-different pairs (0,1) (0,2) (1,2) and none in {3, 4} (a gold tie)
    score, gold = torch.tensor([0.3, 0.25, 0.2, 0.0, 1.0]), torch.tensor([1.0, 0.0, 0.5, 0.2, 0.2])
    accuracy, pairs = T.pair_accuracy(score, gold, torch.tensor([0, 0, 0, 1, 1]))
    assert pairs == 3 and accuracy == 2 / 3  # (0,1) and (0,2) right, (1,2) wrong


def test_the_recipe_reproduces_its_weights_on_a_small_scale():
    torch.set_num_threads(1)  # the recipe's one thread: then the same machine gives the same weights, bit for bit
    def run(seed):
        return T.train(None, seed, contrastive_steps=2, preference_steps=2, pairs=4, members=1, rounds=1, captions=2,
                       log=lambda _: None)["model"].state_dict()

    first, second, other = run(0), run(0), run(1)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_a_run_on_toyscore_evaluates_itself_and_reports_the_gold_beside_the_proxy(tmp_path):
    on_toyscore = config.parse_config(["--task", "tiny", "--rewards", "toyscore:1,toy:0"])
    # the checkpoint's shipped values are the programmatic reward's: they stand in for a tiny run's "before" only
    assert toyworld.shipped_heldout_values(config.parse_config(["--task", "tiny"])) is not None
    assert toyworld.shipped_heldout_values(on_toyscore) is None
    out = tmp_path / "run"
    train.main(config.parse_config(["--task", "tiny", "--rewards", "toyscore:1,toy:0", "--iterations", "1",
                                    "--eval-samples", "8", "--prompts-per-iter", "2", "--group-size", "4",
                                    "--sample-batch", "8", "--train-batch", "4", "--output-dir", str(out),
                                    "--report-to", "none"]))
    before, after = (json.load(open(out / f"eval_{tag}.json")) for tag in ("before", "after"))
    change, se = evaluate.paired_change(*(torch.tensor(e["per_image"]["toy"]) for e in (before, after)))
    assert after["eval/toy_change"] == pytest.approx(change, abs=1e-5)
    assert after["eval/toy_change_se"] == pytest.approx(se, abs=1e-5)
    assert after["eval/reward"] == pytest.approx(after["eval/toyscore"])  # the proxy is what trains
    assert "eval/toyscore_change" not in after  # eval/change is the proxy's
