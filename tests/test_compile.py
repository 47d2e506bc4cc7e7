"""--compile on the tiny models (CPU): padding a call to the compiled size changes no result, a compiled rollout
with completions equals the eager one, and a whole training run compiles a bounded number of graphs (dynamo's own
counters) while training what the uncompiled run trains, up to float rounding."""

import json
import os
import shutil

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import config
import models
import sampler as S
import train
from tests import train_worker  # noqa: F401 (registers the smooth 'brightness' reward)

FAST = ["--task", "tiny", "--model", "tiny", "--rewards", "brightness:1", "--resolution", "16",
        "--prompts-per-iter", "2", "--group-size", "4", "--sample-batch", "8", "--train-batch", "4",
        "--eval-samples", "8", "--report-to", "none", "--iterations", "2", "--max-sequence-length", "32",
        "--steps", "6", "--window", "5", "--eval-steps", "6"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test counts its own compilations."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def inputs(name: str, n: int):
    """A tiny pipeline (SD3 16 px with CFG, or FLUX 32 px with its guidance embedding) and n images' inputs."""
    pipe = models.TINY[name]()
    resolution, w = (16, 4.5) if name == "tiny" else (32, 3.5)
    shape = models.latent_shape(pipe, resolution)
    x = S.draw_noise(S.make_generators(list(range(n))), shape, "cpu")  # (n, C, h, w) or (n, h/2 * w/2, 4C)
    cond = models.encode_prompts(pipe, [f"prompt {i}" for i in range(n)], w, 32)
    t = torch.linspace(900, 100, n)  # (n,) a different timestep per image
    return pipe, x, t, cond, w


@pytest.mark.parametrize("name", ["tiny", "tiny-flux"])
@pytest.mark.parametrize("n", [3, 4, 7])
def test_padding_to_the_compiled_size_never_changes_a_result(name, n):
    pipe, x, t, cond, w = inputs(name, n)
    eager = models.velocity(pipe.transformer, x, t, cond, w)  # (n, ...) one call of n (x2 with CFG) images
    # 4 images per call: n = 3 pads one chunk, n = 4 fits, n = 7 is a full chunk and a padded one
    fixed = models.CompiledTransformer(pipe.transformer, rows=4, backend="eager")
    torch.testing.assert_close(models.velocity(fixed, x, t, cond, w), eager, rtol=0, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1  # every chunk had the same shape


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                    reason="inductor on the CPU compiles C++ kernels and needs a C++ compiler")
def test_inductor_compiled_rollout_with_completions_equals_eager():
    pipe, _, _, _, _ = inputs("tiny", 1)
    cond = models.encode_prompts(pipe, ["a red cube", "two blue balls", "one cat"], 4.5, 32)
    shape = models.latent_shape(pipe, 16)
    sigmas, timesteps = models.sigma_grid(pipe.scheduler, 10, shape)

    def rollout(transformer):
        gens = S.make_generators([S.member_seed(0, 0, i, 0) for i in range(3)])
        x_T = S.draw_noise(gens, shape, "cpu")  # (3, C, h, w)
        return S.wavefront_rollout(transformer, cond, x_T, gens, sigmas=sigmas, timesteps=timesteps, w0=0, window=9,
                                   noise_level=0.7, kind="cps", guidance_scale=4.5)

    eager = rollout(pipe.transformer)
    # 6 images per call: the wavefront's calls of 3 x (1 + live) x 2 (CFG) images are whole chunks
    compiled = rollout(models.CompiledTransformer(pipe.transformer, rows=6))
    for a, b in [(compiled.completions, eager.completions), (compiled.log_weights, eager.log_weights),
                 (compiled.states, eager.states)]:
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)  # float32 rounding of other kernels, nothing more
    assert counters["stats"]["unique_graphs"] == 1


def test_a_compiled_training_run_compiles_one_graph_and_trains_the_same_weights(tmp_path):
    def run(name, *extra):
        out = str(tmp_path / name)
        result = train.main(config.parse_config(FAST + ["--output-dir", out, *extra]))
        history = [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
                   for line in open(os.path.join(out, "metrics.jsonl"))]
        return result, history

    # "eager" traces with dynamo (the shapes and the graph count are what inductor would see) without compiling
    # kernels: the compiled run differs from the plain one only in the shapes of its transformer calls
    compiled, h_compiled = run("compiled", "--compile", "true", "--compile-backend", "eager")
    graphs = counters["stats"]["unique_graphs"]
    # sampling (8 trajectories x (1 + live branches) x 2 CFG halves), the completions and both evaluations
    # (8 images x 2) all run in calls of 16 images: one graph for the whole run
    assert graphs == 1, dict(counters["stats"])
    plain, h_plain = run("plain")
    # The plain run calls the transformer with 16, 32, ... images, the compiled one in chunks of 16, and MKL's matrix
    # kernels may round by the call's shape: on an AVX-512 Intel Xeon the runs' metrics differed in the last bits
    # (train/approx_kl 5.487367e-10 vs 5.487757e-10), where this AMD EPYC gives the same bits. What holds on any CPU:
    # the same work; the same images up to rounding, and so (a smooth reward) the same rewards; the same update up
    # to rounding. The training statistics are not compared one by one: where rounding moves a ratio across the
    # clip 1 +- eps, that sample's gradient and clip_frac change (measured: 1 of 40 samples).
    assert [h.keys() for h in h_compiled] == [h.keys() for h in h_plain]
    for c, p in zip(h_compiled, h_plain):
        for key in ("iteration", "cost/transformer_evals", "train/zero_adv_frac"):
            assert c[key] == p[key], key
        for key in [k for k in p if k.startswith(("reward/", "eval/", "steps/d_"))]:
            # rewards near 0.5 and their differences: a change of every velocity by up to 4 float32 ulps moved them
            # by at most 2.3e-7 (relative) and 2e-8 (absolute, the differences and spreads)
            assert c[key] == pytest.approx(p[key], rel=1e-5, abs=1e-6), key
        assert c["train/first_ratio_dev"] <= 1e-6 and p["train/first_ratio_dev"] <= 1e-6  # tests/test_train.py
    # lora_B starts at 0, so it is the update alone: that ulp-level change moved it by up to 5e-5 (relative L2,
    # a ratio crossing the clip included); a 1% larger lr moves it by 2e-2
    a, b = (torch.cat([w.flatten() for k, w in sorted(r["policy"].state_dict().items()) if "lora_B" in k])
            for r in (compiled, plain))
    assert b.norm() > 0 and (a - b).norm() <= 1e-3 * b.norm()
