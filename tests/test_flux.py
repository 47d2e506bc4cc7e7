"""FLUX.1-dev through the shared sampler, credit assignment and training loop (paper appendix; docs/method.md,
'FLUX.1-dev'), on the tiny random-weight FLUX (32 px, 4 packed tokens, CPU): the ODE sampler against diffusers'
FluxPipeline, log-probs on packed latents against torch.distributions, the batched completions against the naive
loop, train.py's three algorithms, the saved LoRA in FluxPipeline, evaluate.py, and FLUX.1-dev's shapes on the
meta device. The SD3 versions of these checks are in test_sampler.py and test_train.py."""

import json
import math
import os

import pytest
import torch

import config
import evaluate
import models
import sampler as S
import train
from policy import add_lora
from tests.test_train import _adapted, lora_file

T, W, PX = 6, 5, 32  # the FLUX presets' schedule (pickscore-flux: W = 5 from w0 = 0), the tiny model's resolution
PROMPTS = ["a red cat", "two dogs"]
SAMPLING = dict(steps=T, guidance_scale=3.5, resolution=PX, max_sequence_length=32)  # sampler.generate's settings
FAST = ["--task", "pickscore-flux", "--model", "tiny-flux", "--rewards", "jpeg_compressibility:1",
        "--prompts", "toy:train", "--eval-prompts", "toy:heldout", "--resolution", str(PX), "--prompts-per-iter", "2",
        "--group-size", "3", "--eval-samples", "4", "--eval-steps", str(T), "--max-sequence-length", "32",
        "--mixed-precision", "no", "--report-to", "none", "--iterations", "2"]


@pytest.fixture(scope="module")
def pipe():
    return models.load_pipeline("tiny-flux")


@pytest.fixture(scope="module")
def grid(pipe):
    return models.sigma_grid(pipe.scheduler, T, models.latent_shape(pipe, PX))


def _setup(pipe, group=1, seed=0):
    """Conditioning, generators and packed initial noise (n, 4, 64) for PROMPTS x group trajectories."""
    cond = models.encode_prompts(pipe, PROMPTS, 3.5, max_sequence_length=32).repeat(group)
    gens = S.make_generators([S.member_seed(seed, 0, p, m) for p in range(len(PROMPTS)) for m in range(group)])
    return cond, gens, S.draw_noise(gens, models.latent_shape(pipe, PX), "cpu")


def _train(tmp_path, *extra, name="run"):
    out = str(tmp_path / name)
    return train.main(config.parse_config(FAST + ["--output-dir", out, *extra])), out


# ---------------------------------------------------------------- the model-specific parts against diffusers


def test_ode_sampler_and_decoding_equal_diffusers_flux_pipeline(pipe, grid):
    cond, gens, x_T = _setup(pipe)
    assert x_T.shape == (2, (PX // 8 // 2) ** 2, 64)  # 16x4x4 latents packed into 2x2 tokens of 4 x 16 values
    kwargs = dict(prompt=PROMPTS, num_inference_steps=T, guidance_scale=3.5, height=PX, width=PX,
                  max_sequence_length=32)
    ref = pipe(latents=x_T.clone(), output_type="latent", **kwargs).images  # (2, 4, 64)
    torch.testing.assert_close(grid[0], pipe.scheduler.sigmas, rtol=0, atol=0)  # the same shifted grid
    sigmas, timesteps = grid
    ode = S.ode_complete(pipe.transformer, x_T, 0, cond, sigmas=sigmas, timesteps=timesteps, guidance_scale=3.5)
    ro = S.rollout(pipe.transformer, cond, x_T, gens, sigmas=sigmas, timesteps=timesteps, w0=0, window=W,
                   noise_level=0.0, kind="cps", guidance_scale=3.5)  # a = 0: all ODE
    torch.testing.assert_close(ode, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(ro.final, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(models.unpack(ref), pipe._unpack_latents(ref, PX, PX, pipe.vae_scale_factor), rtol=0, atol=0)
    images = pipe(latents=x_T.clone(), output_type="pt", **kwargs).images  # (2, 3, 32, 32) unpacked, scaled, shifted
    torch.testing.assert_close(models.decode(pipe, ode), images, rtol=0, atol=1e-5)


def test_dynamic_shift_depends_on_the_image_size(pipe):
    # 512 px: 64x64 latents, 32 x 32 = 1024 tokens, mu = 0.5 + (1024 - 256) (1.15 - 0.5) / (4096 - 256) = 0.63
    shape = models.latent_shape(pipe, 512)
    assert shape == (1024, 64)
    sigmas, timesteps = models.sigma_grid(pipe.scheduler, T, shape)
    mu = 0.5 + (1024 - 256) * 0.65 / 3840
    plain = torch.linspace(1, 1 / T, T, dtype=torch.float64)  # FluxPipeline's unshifted grid
    shifted = math.exp(mu) * plain / (1 + (math.exp(mu) - 1) * plain)
    torch.testing.assert_close(sigmas[:-1].double(), shifted, rtol=0, atol=1e-6)
    assert sigmas[-1] == 0 and torch.equal(timesteps, sigmas[:-1] * 1000)
    assert models.sigma_grid(pipe.scheduler, T, models.latent_shape(pipe, PX))[0][1] < sigmas[1]  # fewer tokens, less shift
    with pytest.raises(ValueError, match="latent shape"):
        models.sigma_grid(pipe.scheduler, T)


# ---------------------------------------------------------------- the shared steps on packed latents


@pytest.mark.parametrize("kind", S.SAMPLERS)
@pytest.mark.parametrize("i", [0, 3, T - 1])
def test_log_probs_on_packed_latents_are_the_gaussian_ones(grid, kind, i):
    sigmas, _ = grid
    g = torch.Generator().manual_seed(i)
    x, v, eps = (torch.randn(3, 16, 64, generator=g) for _ in range(3))  # (n, h/2 * w/2, 4C) each
    out = S.stochastic_step(x, v, sigmas[i], sigmas[i + 1], 0.8, kind=kind, noise=eps)
    assert out.log_weight.shape == out.std_kl.shape == (3,)
    s, s1 = sigmas[i].double(), sigmas[i + 1].double()
    if kind == "sde":  # docs/method.md, 'The sde step': a Gaussian of std a sqrt(sigma / (1 - sigma)) sqrt(-dt)
        std = 0.8 * torch.sqrt(s / (1 - (s1 if s == 1 else s))) * torch.sqrt(s - s1)
        expected = torch.distributions.Normal(out.mean.double(), std).log_prob(out.next.double()).mean(dim=(1, 2))
    else:  # docs/method.md, 'The cps step': -mean((x' - mean)^2) with x' - mean = sigma' sin(a pi / 2) eps
        std = s1 * math.sin(0.8 * math.pi / 2)
        expected = -((std * eps.double()) ** 2).mean(dim=(1, 2))
    torch.testing.assert_close(out.log_weight.double(), expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out.next.double(), out.mean.double() + std * eps.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", S.SAMPLERS)
def test_batched_completions_equal_the_naive_loop_one_pass_per_image(pipe, grid, kind):
    cond, gens, x_T = _setup(pipe, group=3)
    settings = dict(sigmas=grid[0], timesteps=grid[1], w0=0, window=W, noise_level=0.8, kind=kind, guidance_scale=3.5)
    ro = S.wavefront_rollout(pipe.transformer, cond, x_T, gens, **settings)
    naive = S.complete_naive(pipe.transformer, ro, cond, 3.5)
    assert ro.completions.shape == (6, W + 1, 4, 64) == naive.shape
    torch.testing.assert_close(ro.completions, naive, rtol=0, atol=1e-5)
    assert (ro.completions[:, 0] - ro.completions[:, -1]).abs().max() > 1e-3  # the window's noise moved them
    # T = 6, W = 5: 6 + 5 + 4 + 3 + 2 + 1 = 21 evaluations in 6 calls, each image once (no CFG pair)
    assert ro.counter.nfe == 21 * 6 and ro.counter.calls == T
    # a cheaper judge on packed latents: two Euler steps per state, batched as the naive loop computes them
    gens = S.make_generators([S.member_seed(0, 0, 0, m) for m in range(6)])
    two = S.wavefront_rollout(pipe.transformer, cond, x_T, gens, **settings, completion_steps=2)
    torch.testing.assert_close(two.completions, S.complete_naive(pipe.transformer, two, cond, 3.5, completion_steps=2),
                               rtol=0, atol=1e-5)
    # the rollout's log-probs are what training recomputes from the stored states
    sigmas, timesteps = grid
    v = models.velocity(pipe.transformer, ro.states[:, 2], timesteps[2].expand(6), cond, 3.5)
    again = S.stochastic_step(ro.states[:, 2], v, sigmas[2], sigmas[3], 0.8, kind=kind, next_sample=ro.states[:, 3])
    torch.testing.assert_close(again.log_weight, ro.log_weights[:, 2], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- train.py and evaluate.py


@pytest.mark.parametrize("algo", ["tp-grpo", "flow-grpo", "incremental"])
def test_two_iterations_train_the_lora_only(tmp_path, algo):
    result, out = _train(tmp_path, "--algo", algo)
    history = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [h["iteration"] for h in history] == [1, 2]
    assert history[0]["cost/evals_per_trajectory"] == (T if algo == "flow-grpo" else 21)
    # on-policy: rho = 1 before any optimizer step, up to float32 rounding here: on the CPU the tiny FLUX's forward
    # pass is not bit-identical across batch sizes (the rollout evaluates up to 6 stacked copies, training 3 rows)
    assert all(h["train/first_ratio_dev"] < 1e-6 for h in history)
    assert all(math.isfinite(h["train/loss"]) for h in history)
    trained, fresh = result["policy"], models.tiny_flux_pipeline().transformer.state_dict()
    lora = {k: v for k, v in trained.named_parameters() if "lora_" in k}
    assert max(v.abs().max().item() for k, v in lora.items() if "lora_B" in k) > 1e-6  # moved from B = 0
    for name, p in trained.named_parameters():
        if "lora_" not in name:
            assert not p.requires_grad and torch.equal(p.detach(), fresh[name.replace(".base_layer", "")]), name


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tp-grpo run with a large step and a fast EMA, so that LoRA and EMA both visibly move."""
    return _train(tmp_path_factory.mktemp("flux"), "--ema-decay", "0.5", "--ema-every", "1", "--lr", "3e-2")


def test_saved_lora_loads_into_flux_pipeline_and_reproduces_the_policy(trained):
    result, out = trained
    folder = os.path.join(out, "checkpoints", "iter-000002", "lora")
    seeds = [1, 2]
    pipe = models.tiny_flux_pipeline()
    base = S.generate(pipe, PROMPTS, seeds, **SAMPLING)
    pipe.load_lora_weights(folder)  # FluxPipeline's LoRA loader (diffusers' format, lora_alpha in the metadata)
    loaded = S.generate(pipe, PROMPTS, seeds, **SAMPLING)
    assert (loaded - base).abs().max() > 1e-4
    policy = models.tiny_flux_pipeline()
    policy.transformer = result["policy"].eval()
    torch.testing.assert_close(loaded, S.generate(policy, PROMPTS, seeds, **SAMPLING), rtol=0, atol=1e-5)
    live, ema = lora_file(out, 2), lora_file(out, 2, "lora_ema")
    assert live.keys() == ema.keys() and any(not torch.equal(live[k], ema[k]) for k in live)


def test_evaluate_on_a_saved_tiny_flux_folder(trained, tmp_path):
    model = str(tmp_path / "tiny-flux")
    models.tiny_flux_pipeline().save_pretrained(model)  # a local folder: model_index.json names FluxPipeline
    checkpoint = os.path.join(trained[1], "checkpoints", "iter-000002")
    summary = evaluate.main(["--task", "pickscore-flux", "--model", model, "--eval-prompts", "toy:heldout",
                             "--rewards", "jpeg_compressibility:1", "--checkpoint", checkpoint, "--ema",
                             "--eval-samples", "3", "--eval-steps", "2", "--output-dir", str(tmp_path / "eval")])
    written = json.load(open(tmp_path / "eval" / "eval.json"))
    assert written["samples"] == 3 and written["guidance"] == 3.5 and len(written["per_image"]["reward"]) == 3
    assert math.isfinite(summary["reward"]) and os.path.getsize(tmp_path / "eval" / "grid.png") > 0


# ---------------------------------------------------------------- presets, LoRA layers, FLUX.1-dev's shapes


def test_presets_carry_the_authors_flux_settings(capsys):
    with pytest.raises(SystemExit):
        config.parse_config(["--help"])
    assert "pickscore-flux" in capsys.readouterr().out
    for task, window in (("pickscore-flux", 5), ("geneval-flux", 6)):
        cfg = config.parse_config(["--task", task])
        assert (cfg.model, cfg.resolution, cfg.steps, cfg.eval_steps, cfg.window, cfg.window_start) == \
            (models.FLUX_DEV, 512, 6, 28, window, 0)
        # a and beta as the demo's TP-GRPO launch scripts pass them (its config file says 0.8 and 0)
        assert (cfg.guidance, cfg.eval_guidance, cfg.sampler, cfg.noise_level) == (3.5, 3.5, "cps", 0.7)
        assert (cfg.group_size, cfg.sample_batch, cfg.train_batch, cfg.lr, cfg.clip_range, cfg.beta) == \
            (24, 3, 3, 3e-4, 1e-5, 1e-4)
        assert (cfg.lora_rank, cfg.lora_alpha, cfg.mixed_precision) == (64, 128, "bf16") and cfg.ema_decay > 0


def test_lora_targets_are_342_layers_on_flux_dev():
    from diffusers import FluxTransformer2DModel
    with torch.device("meta"):  # FLUX.1-dev's 11.9B parameters as shapes only
        transformer = FluxTransformer2DModel(**models.FLUX_DEV_TRANSFORMER)
    cfg = config.parse_config(["--task", "pickscore-flux"])
    add_lora(transformer, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets.split(","))
    adapted = _adapted(transformer)
    double = {f"transformer_blocks.{b}.{m}" for b in range(19) for m in config.FLUX_LORA_TARGETS.split(",")}
    single = {f"single_transformer_blocks.{b}.attn.{m}" for b in range(38) for m in ("to_q", "to_k", "to_v")}
    assert adapted == double | single and len(double) == 228 and len(adapted) == 342


def test_random_flux_dev_has_flux_dev_shapes_on_the_meta_device():
    pipe = models.load_pipeline(models.RANDOM_FLUX_DEV, torch.bfloat16, "meta")
    assert pipe.transformer.dtype == torch.bfloat16 and pipe.vae.dtype == torch.float32
    assert sum(p.numel() for p in pipe.transformer.parameters()) == 11_901_408_320
    assert (pipe.text_encoder.config.hidden_size, pipe.text_encoder_2.config.d_model) == (768, 4096)
    shape = models.latent_shape(pipe, 512)
    assert shape == (1024, 64)  # 512 px -> 16x64x64 latents -> 32 x 32 tokens of 4 x 16 values
    cond = models.encode_prompts(pipe, PROMPTS, 3.5, max_sequence_length=128)
    assert cond.embeds.shape == (2, 128, 4096) and cond.pooled.shape == (2, 768) and cond.neg_embeds is None
    x = torch.zeros(2, *shape, device="meta")
    assert models.velocity(pipe.transformer, x, torch.full((2,), 500.0), cond, 3.5).shape == (2, 1024, 64)
    assert models.decode(pipe, x).shape == (2, 3, 512, 512)


def test_missing_flux_model_gives_one_clear_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(models.ModelLoadError) as err:
        models.load_pipeline(os.path.join("/nonexistent", "flux-model"))
    message = str(err.value)
    assert "\n" not in message and "cannot load the FLUX pipeline" in message and models.FLUX_DEV in message
