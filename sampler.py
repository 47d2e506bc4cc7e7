"""Flow-matching sampling for TP-GRPO: SDE/ODE steps with log-probs, windowed rollouts, batched ODE completions.

Implements paper Sec. 3 "Preliminaries" and Sec. 4.1 "step-wise incremental rewards" (docs/method.md, from
'Flow matching and the Euler ODE step' to 'The batched wavefront') for the paper's two models, SD3.5-Medium and
FLUX.1-dev (appendix):

  * the two model families behind one switch, `is_flux`: loading, prompt encoding, the velocity call, the latent
    shape and decoding (docs/method.md, 'FLUX.1-dev'); everything after them is shared,
  * the T-step sigma grid of the pipeline's FlowMatchEulerDiscreteScheduler (static shift for SD3, FLUX's
    resolution-dependent one) and the guided velocities (SD3's true CFG, FLUX's guidance embedding),
  * the Euler ODE step and the two stochastic steps ("sde" = Flow-GRPO's reverse SDE, "cps" =
    coefficients-preserving sampling) with their log-probabilities and the std used by the KL term,
  * a rollout of B prompts x G members whose steps w0 .. w0+W-1 are stochastic (the "SDE window"),
  * the ODE completions R(s_k) needs: every window state s_k is finished with the Euler ODE on the rest of the
    same grid. `complete_naive` is the readable per-state loop (the test oracle); `rollout(..., complete=True)`
    computes the same thing as a "wavefront": one transformer call per grid index for the rollout state and
    every live branch, reusing the rollout's velocity at each branch's first step (55 instead of 64 network
    evaluations per trajectory for T = 10, W = 9, in T calls instead of 64),
  * decoding latents to images in [0, 1].

Run `python bench.py` to count and time it; `python -m pytest tests/test_sampler.py` to check it.

Shape legend: B prompts, G group size, N = B*G trajectories (or any batch of them), T steps, W window length,
C/h/w latent channels/height/width (lower case, so that W only ever means the window
length), H'/W' decoded pixels, L text tokens, D text width, P pooled width. A latent is (C, h, w) for SD3 and
FLUX's packed tokens (h/2 * w/2, 4C) for FLUX: the step, rollout and completion code below is written once for
both and its comments use the SD3 form.
"""

from __future__ import annotations

import json
import math
import os
import string
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel,
                       SD3Transformer2DModel, StableDiffusion3Pipeline)
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer, T5Config,
                          T5EncoderModel, T5Tokenizer)

SD35_MEDIUM = "stabilityai/stable-diffusion-3.5-medium"
RANDOM_SD35M = "random-sd35m"  # SD3.5-M's shapes with random weights, built in code (random_sd35m_pipeline)
SAMPLERS = ("sde", "cps")

# SD3.5-Medium's published configs (stabilityai/stable-diffusion-3.5-medium, transformer/ and vae/config.json):
# MMDiT-X, 24 blocks of width 24 x 64 = 1536, a second image-only attention (attn2) in blocks 0-12, RMS QK-norm;
# 16 latent channels, 8x downsampling (512 px -> 64x64 latents). Text: CLIP-L (768) + CLIP-G (1280) pooled = 2048,
# T5-XXL tokens of width 4096.
SD35M_TRANSFORMER = dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24,
                         attention_head_dim=64, num_attention_heads=24, joint_attention_dim=4096,
                         caption_projection_dim=1536, pooled_projection_dim=2048, pos_embed_max_size=384,
                         dual_attention_layers=tuple(range(13)), qk_norm="rms_norm")
SD35M_VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                 up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
                 layers_per_block=2, latent_channels=16, norm_num_groups=32, sample_size=1024,
                 scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False)
# the text encoders at their real widths (CLIP-L/14, OpenCLIP bigG/14, T5 v1.1 XXL); random_sd35m_pipeline keeps
# 2 layers of each
SD35M_TEXT = dict(
    clip=(dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, projection_dim=768,
               hidden_act="quick_gelu"),
          dict(hidden_size=1280, intermediate_size=5120, num_attention_heads=20, projection_dim=1280,
               hidden_act="gelu")),
    t5=dict(d_model=4096, d_kv=64, d_ff=10240, num_heads=64, relative_attention_num_buckets=32,
            feed_forward_proj="gated-gelu"))

FLUX_DEV = "black-forest-labs/FLUX.1-dev"
RANDOM_FLUX_DEV = "random-flux-dev"  # FLUX.1-dev's shapes with random weights, built in code
# FLUX.1-dev's published configs (black-forest-labs/FLUX.1-dev, transformer/, vae/ and scheduler/): 19 double-stream
# blocks (separate image and text weights, joint attention) + 38 single-stream blocks, width 24 x 128 = 3072,
# RoPE over (index, row, column) with 16 + 56 + 56 = 128 dims; patch_size 1 because the 2x2 patches are packed
# outside the model (unpack); a guidance embedding. The VAE is SD3's architecture with other latent statistics.
FLUX_DEV_TRANSFORMER = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                            num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                            guidance_embeds=True, axes_dims_rope=(16, 56, 56))
FLUX_DEV_VAE = dict(SD35M_VAE, scaling_factor=0.3611, shift_factor=0.1159)
FLUX_DEV_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_image_seq_len=256,
                          max_image_seq_len=4096, base_shift=0.5, max_shift=1.15)
# text: CLIP-L (its pooled vector only) and T5-XXL, the same encoders as SD3's first and third
FLUX_DEV_TEXT = dict(clip=SD35M_TEXT["clip"][:1], t5=SD35M_TEXT["t5"])


# ----------------------------------------------------------------------------------------------------------------
# 1. Loading: a real SD3 or FLUX pipeline, or a random-weight one built from configs (same classes, same code path)
# ----------------------------------------------------------------------------------------------------------------


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is one line saying which and how to fix it."""


def tiny_text_stack(seed: int = 0, words: list[str] | None = None, width: int = 32, layers: int = 2,
                    clip: tuple[dict, ...] | None = None, t5: dict | None = None, flux: bool = False):
    """Two CLIP text encoders + a T5 with random weights and in-memory character tokenizers (no files, no download);
    flux=True: FLUX's one CLIP (pooled output, no projection) + the T5, named as FluxPipeline names them.

    SD3 needs: T5 d_model = joint_attention_dim = width, and the two CLIP projections concatenated
    = pooled_projection_dim = width, so by default each CLIP projects to width // 2 (FLUX: its pooled_projection_dim
    is the CLIP's hidden size, width // 2). `clip` (one dict per CLIP) and `t5`
    replace those sizes (SD35M_TEXT, FLUX_DEV_TEXT: the real widths). `words` adds whole-word pieces (the
    toy world's vocabulary) on top of the character-level fallback; T5's unigram model uses them, while CLIP's BPE
    without merges still reads letter by letter (the shipped toy checkpoint was trained with exactly this vocabulary,
    so it stays as it is).
    """
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    clip_vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for piece in chars + [c + "</w>" for c in chars] + [w + "</w>" for w in (words or [])]:
        clip_vocab.setdefault(piece, len(clip_vocab))
    t5_pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)]
    t5_pieces += [(c, -2.0) for c in chars] + [("\u2581" + c, -1.5) for c in chars]
    t5_pieces += [("\u2581" + w, -0.5) for w in (words or [])]

    tiny_clip = dict(hidden_size=width // 2, intermediate_size=width, num_attention_heads=2, projection_dim=width // 2,
                     hidden_act="gelu")
    t5 = t5 or dict(d_model=width, d_kv=8, d_ff=2 * width, num_heads=2, relative_attention_num_buckets=8)
    torch.manual_seed(seed)
    components = {}
    clip_class = CLIPTextModel if flux else CLIPTextModelWithProjection
    for name, sizes in zip(("", "_2"), clip or (tiny_clip,) * (1 if flux else 2)):
        cfg = CLIPTextConfig(vocab_size=len(clip_vocab), num_hidden_layers=layers, max_position_embeddings=77,
                             bos_token_id=0, eos_token_id=1, pad_token_id=1, **sizes)
        components["text_encoder" + name] = clip_class(cfg).eval()
        components["tokenizer" + name] = CLIPTokenizer(vocab=clip_vocab, merges=[], model_max_length=77,
                                                       pad_token="<|endoftext|>")
    t5_cfg = T5Config(vocab_size=len(t5_pieces), num_layers=layers, dropout_rate=0.0, pad_token_id=0,
                      eos_token_id=1, decoder_start_token_id=0, **t5)
    t5_name = "_2" if flux else "_3"  # FLUX's second text encoder is the T5
    components["text_encoder" + t5_name] = T5EncoderModel(t5_cfg).eval()
    components["tokenizer" + t5_name] = T5Tokenizer(vocab=t5_pieces, extra_ids=0)
    return components


def tiny_pipeline(seed: int = 0) -> StableDiffusion3Pipeline:
    """A random-weight SD3 pipeline small enough for CPU tests: 16x16 px images, 4x8x8 latents, 2 blocks.

    Every class is the real diffusers/transformers one, so the code after loading is the code that runs SD3.5-M.
    """
    width = 32
    text = tiny_text_stack(seed, width=width)
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=2,
                                        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=width,
                                        caption_projection_dim=16, pooled_projection_dim=width,
                                        pos_embed_max_size=16).eval()
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
                        layers_per_block=1, norm_num_groups=4, sample_size=16, scaling_factor=1.5305,
                        shift_factor=0.0609).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    return StableDiffusion3Pipeline(transformer=transformer, scheduler=scheduler, vae=vae, **text)


def random_sd35m_pipeline(seed: int = 0) -> StableDiffusion3Pipeline:
    """SD3.5-Medium's transformer and VAE with random weights, and its three text encoders at their real widths with
    2 layers each and in-memory tokenizers: the real code path and cost of SD3.5-M on any GPU, without a download.

    Built on the current default device, so `with torch.device("cuda"):` initializes on the GPU and
    `with torch.device("meta"):` allocates nothing (shapes, parameter counts and FLOPs only).
    """
    text = tiny_text_stack(seed, layers=2, **SD35M_TEXT)
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(**SD35M_TRANSFORMER).eval()
    vae = AutoencoderKL(**SD35M_VAE).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)  # SD3.5-M's scheduler config
    return StableDiffusion3Pipeline(transformer=transformer, scheduler=scheduler, vae=vae, **text)


def tiny_flux_pipeline(seed: int = 0) -> FluxPipeline:
    """A random-weight FLUX pipeline small enough for CPU tests, with FLUX's layout at toy widths: a VAE with 8x
    downsampling to 16 channels and FLUX's scaling and shift factors (32 px -> 16x4x4 latents -> 2x2 = 4 tokens of
    64), one double- and one single-stream block of 2 heads x 16 (RoPE axes 4 + 6 + 6 = 16), a guidance
    embedding, and FLUX.1-dev's dynamically shifted scheduler. The same classes as FLUX.1-dev's.
    """
    width = 32
    text = tiny_text_stack(seed, width=width, flux=True)
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=width,
                                         pooled_projection_dim=width // 2, guidance_embeds=True,
                                         axes_dims_rope=(4, 6, 6)).eval()
    vae = AutoencoderKL(**dict(FLUX_DEV_VAE, block_out_channels=(8, 8, 16, 16), layers_per_block=1,
                               norm_num_groups=4, sample_size=32)).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER)
    return FluxPipeline(transformer=transformer, scheduler=scheduler, vae=vae, **text)


def random_flux_dev_pipeline(seed: int = 0) -> FluxPipeline:
    """FLUX.1-dev's transformer (11.9B parameters) and VAE with random weights, its CLIP-L and T5-XXL at their real
    widths with 2 layers each: FLUX.1-dev's code path and cost without a download, built on the current default
    device as random_sd35m_pipeline (`torch.device("meta")`: shapes and FLOPs only)."""
    text = tiny_text_stack(seed, layers=2, flux=True, **FLUX_DEV_TEXT)
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(**FLUX_DEV_TRANSFORMER).eval()
    vae = AutoencoderKL(**FLUX_DEV_VAE).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER)
    return FluxPipeline(transformer=transformer, scheduler=scheduler, vae=vae, **text)


TINY = {"tiny": tiny_pipeline, "tiny-flux": tiny_flux_pipeline}  # float32, CPU-sized
RANDOM = {RANDOM_SD35M: random_sd35m_pipeline, RANDOM_FLUX_DEV: random_flux_dev_pipeline}  # real shapes


def is_flux(model) -> bool:
    """The one switch between the two model families: a FLUX pipeline or transformer (also inside a DDP /
    DeepSpeed wrapper, which hides it behind .module) -> True, SD3 -> False."""
    transformer = getattr(model, "transformer", model)
    return isinstance(getattr(transformer, "module", transformer), FluxTransformer2DModel)


def load_pipeline(model: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """An SD3 or FLUX pipeline from a name in TINY or RANDOM (random weights, built in code), a hub id (SD35_MEDIUM,
    FLUX_DEV) or a local folder, with weights in `dtype` (TINY stays float32) except the VAE's, which decodes in
    float32. A folder is FLUX when its model_index.json says FluxPipeline, a hub id when it names FLUX.

    A local folder may hold a pipeline without a VAE (the toy world's pixel-space model): `decode` handles it.
    Text encoders and the VAE are frozen; only the transformer is ever trained.
    """
    if model in TINY:
        pipe = TINY[model]()
    elif model in RANDOM:
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # created in its dtype where it runs: no 9 GB float32 detour through the CPU
        try:
            with torch.device(device):
                pipe = RANDOM[model]()
        finally:
            torch.set_default_dtype(default)
    else:
        index = os.path.join(model, "model_index.json")
        saved = json.load(open(index)) if os.path.isfile(index) else None
        # A saved pixel-space pipeline records "vae": [null, null]; diffusers then wants vae=None said explicitly.
        no_vae = saved is not None and saved.get("vae", [None])[0] is None
        flux = saved["_class_name"] == "FluxPipeline" if saved else "flux" in model.lower()
        name, hub_id, cls = ("FLUX", FLUX_DEV, FluxPipeline) if flux else ("SD3", SD35_MEDIUM, StableDiffusion3Pipeline)
        try:
            pipe = cls.from_pretrained(model, dtype=dtype, **({"vae": None} if no_vae else {}))
        except Exception as e:  # offline, gated, typo: all end here, and nothing is half-loaded
            raise ModelLoadError(
                f"cannot load the {name} pipeline '{model}' ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                f"pass --model a local copy (`hf download {hub_id} --local-dir DIR` where there is internet, "
                f"after accepting its license) or one of {', '.join(TINY)}") from e
    pipe = pipe.to(device)
    if pipe.vae is not None:
        # float32 as the demo code's `pipeline.vae.to(device, dtype=torch.float32)`: completion rewards are compared
        # through small differences d_k, and bf16 decoding noise could flip their signs (cost: bench.py, decode)
        pipe.vae.float()
    for name in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3", "transformer"):  # FLUX has no third
        module = getattr(pipe, name, None)
        if module is not None:
            module.requires_grad_(False).eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def latent_shape(pipe, resolution: int) -> tuple[int, ...]:
    """(C, h, w) of a latent for a square image of `resolution` pixels (pixel space when there is no VAE); FLUX:
    its packed tokens (h/2 * w/2, 4C).

    FLUX's transformer reads a sequence: each 2x2 patch of the 16-channel latent is one token of 64 values
    (FluxPipeline._pack_latents), and rollouts, SDE steps and log-probs all run on that packed form, as in the
    authors' FLUX code. Initial and SDE noise are drawn directly in it: a permutation of i.i.d. normals is i.i.d.
    normal, so this is FluxPipeline's draw-then-pack in distribution (not number for number).
    """
    factor = 2 ** (len(pipe.vae.config.block_out_channels) - 1) if pipe.vae is not None else 1
    flux = is_flux(pipe)
    patch = 2 if flux else pipe.transformer.config.patch_size  # FLUX: the 2x2 packing is its patching
    if resolution % (factor * patch):
        raise ValueError(f"resolution {resolution} must be divisible by {factor * patch} (VAE factor x patch size)")
    side = resolution // factor  # h = w
    if flux:
        return ((side // 2) ** 2, pipe.transformer.config.in_channels)  # (h/2 * w/2, 4C)
    return (pipe.transformer.config.in_channels, side, side)


def unpack(tokens: torch.Tensor) -> torch.Tensor:
    """FLUX's packed latents (N, h/2 * w/2, 4C) of a square image -> (N, C, h, w) (FluxPipeline._unpack_latents):
    token (r, c) in row-major order holds channel-major 2x2 patches."""
    n, count, packed = tokens.shape
    side = math.isqrt(count)  # h/2 = w/2
    x = tokens.reshape(n, side, side, packed // 4, 2, 2)  # (N, h/2, w/2, C, 2, 2)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(n, packed // 4, 2 * side, 2 * side)  # (N, C, h, w)


@torch.no_grad()
def decode(pipe, latents: torch.Tensor) -> torch.Tensor:
    """Latents (N, C, h, w) (FLUX: packed (N, h/2 * w/2, 4C)) -> images (N, 3, H', W') float32 in [0, 1].

    Both VAEs expect x / scaling_factor + shift_factor (the inverse of what encoding applied; SD3.5: 1.5305 and
    0.0609, FLUX: 0.3611 and 0.1159, from each VAE's config); a pipeline without a
    VAE generates pixels in [-1, 1] directly. The VAE runs in its own dtype (float32 from load_pipeline) with any
    autocast of the caller switched off.
    """
    if is_flux(pipe):
        latents = unpack(latents)  # (N, C, h, w)
    if pipe.vae is None:
        images = latents.float()  # (N, 3, h, w) pixels in [-1, 1]: without a VAE the latent is the image
    else:
        z = latents.float() / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor  # (N, C, h, w)
        kind = z.device.type
        no_autocast = torch.autocast(kind, enabled=False) if torch.amp.is_autocast_available(kind) else nullcontext()
        with no_autocast:
            images = pipe.vae.decode(z.to(pipe.vae.dtype), return_dict=False)[0].float()  # (N, 3, H', W') in [-1, 1]
    return (images / 2 + 0.5).clamp(0, 1)  # (N, 3, H', W')


# ----------------------------------------------------------------------------------------------------------------
# 2. The grid, the prompt conditioning and the guided velocity (Sec. 3; docs/method.md, 'Classifier-free guidance',
#    'FLUX.1-dev')
# ----------------------------------------------------------------------------------------------------------------


def sigma_grid(scheduler, steps: int, shape: tuple[int, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The T-step grid sigma_0 = 1 > ... > sigma_T = 0 and the transformer's timesteps (sigma_i * 1000).

    Taken from the pipeline's own scheduler so that SD3.5-M's static shift (shift = 3) and FLUX's dynamic one apply
    exactly as in diffusers' pipelines. FLUX's shift depends on the image size, so it needs `shape`, the latent
    shape from latent_shape. A copy of the scheduler is used so the pipeline's state is untouched.
    """
    sched = FlowMatchEulerDiscreteScheduler.from_config(scheduler.config)
    if sched.config.use_dynamic_shifting:
        if shape is None:
            raise ValueError("this scheduler's shift depends on the image size: pass the latent shape")
        # FLUX (docs/method.md, 'FLUX.1-dev'): mu = calculate_shift(h/2 * w/2), linear in the token count from
        # base_shift 0.5 at 256 tokens to max_shift 1.15 at 4096 (512 px: 1024 tokens, mu = 0.63); the scheduler
        # then maps FluxPipeline's grid linspace(1, 1/T, T) through sigma -> e^mu sigma / (1 + (e^mu - 1) sigma)
        mu = calculate_shift(shape[0], sched.config.base_image_seq_len, sched.config.max_image_seq_len,
                             sched.config.base_shift, sched.config.max_shift)
        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    else:
        sched.set_timesteps(steps)
    sigmas = sched.sigmas.to(torch.float32).cpu()  # (T+1,)
    timesteps = sched.timesteps.to(torch.float32).cpu()  # (T,)
    return sigmas, timesteps


@dataclass
class Cond:
    """Text conditioning, one row per image: positive and, with CFG, negative ("") embeddings."""

    embeds: torch.Tensor  # (N, L, D)
    pooled: torch.Tensor  # (N, P)
    neg_embeds: torch.Tensor | None = None  # (N, L, D), None without CFG
    neg_pooled: torch.Tensor | None = None  # (N, P)

    def rows(self, index) -> "Cond":
        """The conditioning of a subset (or a repetition) of rows."""
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return Cond(pick(self.embeds), pick(self.pooled), pick(self.neg_embeds), pick(self.neg_pooled))

    @staticmethod
    def cat(conds: list["Cond"]) -> "Cond":
        """Rows of several Conds stacked in order."""
        join = lambda ts: None if ts[0] is None else torch.cat(ts)  # noqa: E731
        return Cond(*(join([getattr(c, f) for c in conds]) for f in ("embeds", "pooled", "neg_embeds", "neg_pooled")))

    def repeat(self, times: int) -> "Cond":
        """Each row `times` times in a row: B prompts -> B*G members, members of one prompt adjacent."""
        return self.rows(torch.arange(self.embeds.shape[0]).repeat_interleave(times))


@torch.no_grad()
def encode_prompts(pipe, prompts: list[str], guidance_scale: float, max_sequence_length: int = 128) -> Cond:
    """Encode B prompts once per batch (frozen text encoders, no grad). CFG (w > 1) adds the "" negative prompt;
    FLUX never has one (its guidance is an embedding, see velocity)."""
    device = pipe.transformer.device
    if is_flux(pipe):
        # FLUX: T5 tokens (B, L, D) for the joint attention and CLIP-L's pooled vector (B, P) for the modulation
        embeds, pooled, _ = pipe.encode_prompt(prompt=prompts, prompt_2=None, device=device,
                                               max_sequence_length=max_sequence_length)
        return Cond(embeds, pooled)
    cfg = guidance_scale > 1.0
    embeds, neg, pooled, neg_pooled = pipe.encode_prompt(
        prompt=prompts, prompt_2=None, prompt_3=None, device=device, do_classifier_free_guidance=cfg,
        negative_prompt=[""] * len(prompts) if cfg else None, max_sequence_length=max_sequence_length)
    # embeds (B, L, D), pooled (B, P); neg_* the same shapes or None
    return Cond(embeds, pooled, neg if cfg else None, neg_pooled if cfg else None)


@dataclass
class EvalCounter:
    """Counts transformer work: `nfe` (network function evaluations) = images x steps, a CFG pair counting once;
    `calls` = forward passes."""

    nfe: int = 0
    calls: int = 0


def velocity(transformer, x: torch.Tensor, timestep: torch.Tensor, cond: Cond, guidance_scale: float,
             counter: EvalCounter | None = None) -> torch.Tensor:
    """Guided velocity v(x, sigma, c) in float32 for a batch of n images at per-image timesteps (n,).

    CFG (docs/method.md, 'Classifier-free guidance'): v = v_uncond + w (v_cond - v_uncond). With CFG the
    conditional and unconditional halves go through the transformer in one call, as in diffusers' pipeline.
    FLUX: w is an input of the guidance-distilled model instead (_flux_velocity).
    """
    n = x.shape[0]
    # a DDP / DeepSpeed wrapper hides .dtype behind .module
    dtype = transformer.dtype if hasattr(transformer, "dtype") else transformer.module.dtype
    if is_flux(transformer):
        out = _flux_velocity(transformer, x, timestep, cond, guidance_scale, dtype)  # (n, h/2 * w/2, 4C)
    else:
        if cond.neg_embeds is not None:
            hidden = torch.cat([x, x]).to(dtype)  # (2n, C, h, w)
            enc = torch.cat([cond.neg_embeds, cond.embeds])  # (2n, L, D)
            pooled = torch.cat([cond.neg_pooled, cond.pooled])  # (2n, P)
            t = torch.cat([timestep, timestep])  # (2n,)
        else:
            hidden, enc, pooled, t = x.to(dtype), cond.embeds, cond.pooled, timestep
        # the timestep stays float32, as diffusers' pipelines pass it: in bf16 a timestep near 1000 moves by up to 2
        # before the sinusoidal embedding (which casts its own output to the model's dtype)
        out = transformer(hidden_states=hidden, timestep=t.to(x.device, torch.float32),
                          encoder_hidden_states=enc.to(dtype), pooled_projections=pooled.to(dtype),
                          return_dict=False)[0].float()  # (2n or n, C, h, w)
    if counter is not None:
        counter.nfe += n
        counter.calls += 1
    if cond.neg_embeds is None:
        return out
    v_uncond, v_cond = out.chunk(2)  # (n, C, h, w) each
    # CFG: v = v_uncond + w (v_cond - v_uncond)
    return v_uncond + guidance_scale * (v_cond - v_uncond)  # (n, C, h, w)


def _flux_velocity(transformer, x: torch.Tensor, timestep: torch.Tensor, cond: Cond, guidance_scale: float,
                   dtype: torch.dtype) -> torch.Tensor:
    """FLUX's velocity for packed latents x (n, h/2 * w/2, 4C) in float32, one forward pass per image.

    FLUX.1-dev is guidance-distilled (docs/method.md, 'FLUX.1-dev'): it was trained to produce the guided velocity
    itself when told the scale, so w = 3.5 enters as an embedding next to the timestep's and there is neither a
    negative prompt nor a second pass. Its velocity has SD3's flow-matching sign (x_0 = x - sigma v), so every step
    formula is shared.
    """
    n, tokens, text = x.shape[0], x.shape[1], cond.embeds.shape[1]
    side = math.isqrt(tokens)  # h/2 = w/2 (square images)
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")  # (h/2, w/2) each
    # RoPE positions (FluxPipeline._prepare_latent_image_ids): each image token is (0, row, column) of its patch,
    # every text token (0, 0, 0), so attention between image tokens depends on their 2-D offset
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(tokens, 3)  # (h/2 * w/2, 3)
    img_ids = img_ids.to(x.device, dtype)  # integers below 256: exact in bf16 too
    txt_ids = torch.zeros(text, 3, device=x.device, dtype=dtype)  # (L, 3)
    base = getattr(transformer, "module", transformer)  # the config behind a DDP / DeepSpeed wrapper
    guidance = torch.full((n,), guidance_scale, device=x.device, dtype=torch.float32) \
        if base.config.guidance_embeds else None  # (n,) FLUX.1-schnell has no guidance embedding
    # FLUX's embedding takes t = sigma in [0, 1] (FluxPipeline passes timestep / 1000) and multiplies by 1000 again,
    # after casting to the model's dtype itself
    return transformer(hidden_states=x.to(dtype), timestep=(timestep / 1000).to(x.device, torch.float32),
                       guidance=guidance, pooled_projections=cond.pooled.to(dtype),
                       encoder_hidden_states=cond.embeds.to(dtype), txt_ids=txt_ids, img_ids=img_ids,
                       return_dict=False)[0].float()  # (n, h/2 * w/2, 4C)


# ----------------------------------------------------------------------------------------------------------------
# 3. One step: ODE, and the two stochastic samplers with log-probabilities (docs/method.md, 'The sde step',
#    'The cps step'). Pure functions, float32.
# ----------------------------------------------------------------------------------------------------------------


def _per_sample(s, like: torch.Tensor) -> torch.Tensor:
    """A scalar or (n,) sigma as (n, 1, 1, 1) float32 on the device of `like`, ready to broadcast."""
    s = torch.as_tensor(s, dtype=torch.float32, device=like.device)
    return s.reshape(-1, *([1] * (like.dim() - 1))).expand(like.shape[0], *([1] * (like.dim() - 1)))


def ode_step(x: torch.Tensor, v: torch.Tensor, sigma, sigma_next) -> torch.Tensor:
    """Euler ODE step, Sec. 3: x_{i+1} = x_i + (sigma_{i+1} - sigma_i) v(x_i, sigma_i)."""
    x, v = x.float(), v.float()
    return x + (_per_sample(sigma_next, x) - _per_sample(sigma, x)) * v  # (n, C, h, w)


@dataclass
class StepOut:
    next: torch.Tensor  # (n, C, h, w) x' (the given one when evaluating a stored sample)
    log_prob: torch.Tensor  # (n,) log p(x' | x), mean over non-batch dims
    mean: torch.Tensor  # (n, C, h, w) mean of p(. | x)
    std_kl: torch.Tensor  # (n,) what the KL term divides by (docs/method.md, 'The KL to the reference policy')


def sde_step(x: torch.Tensor, v: torch.Tensor, sigma, sigma_next, noise_level: float, kind: str = "cps",
             noise: torch.Tensor | None = None, next_sample: torch.Tensor | None = None) -> StepOut:
    """A stochastic step from sigma to sigma' < sigma, or the log-prob of a GIVEN next sample (training).

    Exactly one of `noise` (eps ~ N(0, I), (n, C, h, w)) and `next_sample` (a stored x') is given. With
    noise_level a = 0 both samplers are the Euler ODE step. Everything is float32: bf16/fp16 overflow in the mean.
    """
    if kind not in SAMPLERS:
        raise ValueError(f"unknown sampler '{kind}'; use one of {SAMPLERS}")
    if (noise is None) == (next_sample is None):
        raise ValueError("pass exactly one of noise= (to sample) and next_sample= (to score a stored sample)")
    x, v = x.float(), v.float()
    s, s_next = _per_sample(sigma, x), _per_sample(sigma_next, x)  # (n, 1, 1, 1) each
    dims = tuple(range(1, x.dim()))

    if kind == "sde":
        # "sde" (Flow-GRPO, Euler-Maruyama on the reverse SDE; docs/method.md, 'The sde step'): dt = sigma' - sigma < 0
        dt = s_next - s
        # std = a sqrt(sigma / (1 - sigma)); at sigma = 1 the denominator uses 1 - sigma_1 (= 1 - sigma' there)
        std = noise_level * torch.sqrt(s / torch.where(s == 1, 1 - s_next, 1 - s))  # (n, 1, 1, 1)
        # mean = x (1 + std^2 dt / (2 sigma)) + v (1 + std^2 (1 - sigma) / (2 sigma)) dt
        mean = x * (1 + std**2 * dt / (2 * s)) + v * (1 + std**2 * (1 - s) / (2 * s)) * dt  # (n, C, h, w)
        # x' = mean + std sqrt(-dt) eps: the transition's actual standard deviation
        scale = std * torch.sqrt(-dt)  # (n, 1, 1, 1)
        x_next = mean + scale * noise if next_sample is None else next_sample.float()  # (n, C, h, w)
        # log N(x'; mean, scale^2) = -(x' - mean)^2 / (2 scale^2) - log scale - log sqrt(2 pi), mean over dims.
        # A deterministic step (scale = 0) gets log-prob 0: ratio 1, no gradient, never NaN.
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        log_density = -((x_next - mean) ** 2) / (2 * safe**2) - torch.log(safe) - 0.5 * math.log(2 * math.pi)
        log_prob = torch.where(scale > 0, log_density, torch.zeros_like(log_density)).mean(dims)  # (n,)
        # KL std: `std` WITHOUT sqrt(-dt), as the demo code divides by (beta was tuned to it). The exact Gaussian
        # KL between the two transitions would divide by scale^2 = std^2 (-dt): ours is that KL times (-dt).
        std_kl = std.flatten()  # (n,)
    else:
        # "cps" (coefficients-preserving sampling; docs/method.md, 'The cps step'): predicted clean image and noise
        x0_hat = x - s * v  # (n, C, h, w)
        x1_hat = x + (1 - s) * v  # (n, C, h, w)
        # s = sigma' sin(a pi / 2): the injected noise; the predicted noise keeps the rest of sigma'^2
        noise_std = s_next * math.sin(noise_level * math.pi / 2)  # (n, 1, 1, 1)
        # mean = (1 - sigma') x0_hat + sqrt(sigma'^2 - s^2) x1_hat
        mean = (1 - s_next) * x0_hat + torch.sqrt((s_next**2 - noise_std**2).clamp_min(0)) * x1_hat  # (n, C, h, w)
        x_next = mean + noise_std * noise if next_sample is None else next_sample.float()  # (n, C, h, w)
        # log p := -mean((x' - mean)^2): the demo code drops the constants AND the 1/(2 s^2) factor, and its ratio
        # clip range (1e-5) was tuned for this scale, so we keep it (docs/method.md, 'The cps step'). Only
        # differences of it are used.
        log_prob = -((x_next - mean) ** 2).mean(dims)  # (n,)
        std_kl = noise_std.flatten()  # (n,) exact per-step noise std; 0 on the last step (sigma' = 0)
    return StepOut(x_next, log_prob, mean, std_kl)


# ----------------------------------------------------------------------------------------------------------------
# 4. Seeds: every trajectory is replayable from (seed, iteration, prompt, member), whatever the batch layout
# ----------------------------------------------------------------------------------------------------------------


def member_seed(seed: int, iteration: int, prompt: int, member: int) -> int:
    """A 63-bit seed mixed from the four integers (numpy's SeedSequence: well-spread, no collisions in practice).

    Negative values name other random streams of the same iteration (train.py: -1 prompts, -2 shuffling)."""
    words = [v % 2**32 for v in (seed, iteration, prompt, member)]  # SeedSequence takes non-negative words
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> 1)


def make_generators(seeds: list[int]) -> list[torch.Generator]:
    """One CPU generator per trajectory: noise is drawn on the CPU, so it is the same on every device."""
    return [torch.Generator("cpu").manual_seed(s) for s in seeds]


def draw_noise(generators: list[torch.Generator], shape: tuple[int, ...], device) -> torch.Tensor:
    """eps ~ N(0, I) for each trajectory from its own generator: (n, *shape)."""
    return torch.stack([torch.randn(shape, generator=g) for g in generators]).to(device)  # (n, C, h, w)


# ----------------------------------------------------------------------------------------------------------------
# 5. Rollout with an SDE window (Algorithm 1), optionally with the batched ODE completions (Sec. 4.1; docs/method.md,
#    'Rollout with an SDE window', 'The batched wavefront')
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """What training needs from a batch of n trajectories. Window step k (1..W) takes s_{k-1} to s_k at grid
    index w0 + k - 1, i.e. from sigmas[w0 + k - 1] to sigmas[w0 + k]."""

    sigmas: torch.Tensor  # (T+1,)
    timesteps: torch.Tensor  # (T,)
    w0: int
    window: int  # W
    x_T: torch.Tensor  # (n, C, h, w) the initial noise
    states: torch.Tensor  # (n, W+1, C, h, w) s_0 .. s_W
    log_probs: torch.Tensor  # (n, W) log p(s_k | s_{k-1}) at sampling time (logp_old)
    final: torch.Tensor  # (n, C, h, w) x_0, the trajectory's image latent
    completions: torch.Tensor | None = None  # (n, W+1, C, h, w) ODE-complete(s_k); [:, W] is `final`
    counter: EvalCounter = field(default_factory=EvalCounter)


def check_window(steps: int, w0: int, window: int) -> None:
    if not (window >= 1 and 0 <= w0 and w0 + window <= steps):
        raise ValueError(f"SDE window [w0={w0}, w0+W={w0 + window}) must lie inside the {steps} steps; "
                         f"choose 0 <= w0 and 1 <= W <= T - w0")


@torch.no_grad()
def rollout(transformer, cond: Cond, x_T: torch.Tensor, generators: list[torch.Generator], sigmas: torch.Tensor,
            timesteps: torch.Tensor, w0: int, window: int, noise_level: float, kind: str, guidance_scale: float,
            complete: bool = False, chunk_size: int | None = None) -> Rollout:
    """Sample n trajectories over the T-step grid; steps w0 .. w0+W-1 are stochastic, the rest ODE.

    complete=True also returns ODE-complete(s_k) for k = 0..W (Sec. 4.1) as a wavefront (docs/method.md, 'The
    batched wavefront'): the branch started at s_k
    takes its first Euler step with the velocity the rollout just computed at s_k (an exact reuse), and at every
    later grid index all live branches sit at the same sigma_i as the rollout state, so one transformer call
    evaluates them all. chunk_size caps the images per call (peak memory) without changing any result.
    """
    steps = len(timesteps)
    check_window(steps, w0, window)
    n = x_T.shape[0]
    counter = EvalCounter()
    x = x_T.float()  # (n, C, h, w)
    states, log_probs = [], []
    branches = torch.empty(0, *x.shape[1:], device=x.device)  # (n*live, C, h, w) completion branches
    for i in range(steps):
        # Evaluate the rollout state and, stacked behind it, every live branch: they all sit at sigma_i.
        stacked = torch.cat([x, branches])  # (n*(1+live), C, h, w)
        live = branches.shape[0] // n
        v_all = _chunked_velocity(transformer, stacked, timesteps[i], cond, live + 1, guidance_scale, counter,
                                  chunk_size)  # (n*(1+live), C, h, w)
        v, v_branches = v_all[:n], v_all[n:]  # (n, C, h, w), (n*live, C, h, w)
        branches = ode_step(branches, v_branches, sigmas[i], sigmas[i + 1])  # (n*live, C, h, w)
        in_window = w0 <= i < w0 + window
        if in_window:
            states.append(x)
            if complete:
                # The wavefront's first saving: ODE-complete(s_k) starts with v(s_k, sigma_{w0+k}), which is v:
                # reuse it.
                branches = torch.cat([branches, ode_step(x, v, sigmas[i], sigmas[i + 1])])  # (n*(live+1), C, h, w)
            out = sde_step(x, v, sigmas[i], sigmas[i + 1], noise_level, kind,
                           noise=draw_noise(generators, x.shape[1:], x.device))
            x = out.next  # (n, C, h, w)
            log_probs.append(out.log_prob)
        else:
            x = ode_step(x, v, sigmas[i], sigmas[i + 1])  # (n, C, h, w)
        if i == w0 + window - 1:
            states.append(x)  # s_W
    completions = None
    if complete:
        # branches hold ODE-complete(s_0) .. ODE-complete(s_{W-1}) in blocks of n; s_W's completion is the rollout.
        completions = torch.cat([branches.reshape(window, n, *x.shape[1:]).transpose(0, 1), x[:, None]], 1)
        # (n, W+1, C, h, w)
    return Rollout(sigmas, timesteps, w0, window, x_T.float(), torch.stack(states, 1), torch.stack(log_probs, 1),
                   x, completions, counter)  # states (n, W+1, C, h, w), log_probs (n, W)


def _chunked_velocity(transformer, x: torch.Tensor, timestep: torch.Tensor, cond: Cond, copies: int,
                      guidance_scale: float, counter: EvalCounter, chunk_size: int | None) -> torch.Tensor:
    """velocity() on `copies` stacked blocks of the n rows of `cond`, in chunks of at most chunk_size images."""
    n = cond.embeds.shape[0]
    rows = torch.arange(n, device=cond.embeds.device).repeat(copies)  # (n*copies,) the prompt row of each image
    size = x.shape[0] if chunk_size is None else chunk_size
    out = []
    for start in range(0, x.shape[0], size):
        part = slice(start, start + size)
        t = timestep.expand(x[part].shape[0])  # (m,)
        out.append(velocity(transformer, x[part], t, cond.rows(rows[part]), guidance_scale, counter))
    return torch.cat(out)  # (n*copies, C, h, w)


@torch.no_grad()
def ode_complete(transformer, x: torch.Tensor, start: int, cond: Cond, sigmas: torch.Tensor,
                 timesteps: torch.Tensor, guidance_scale: float, counter: EvalCounter | None = None) -> torch.Tensor:
    """Euler ODE from a state at grid index `start` down to sigma_T = 0 on the same grid (n, C, h, w)."""
    x = x.float()
    for i in range(start, len(timesteps)):
        v = velocity(transformer, x, timesteps[i].expand(x.shape[0]), cond, guidance_scale, counter)
        x = ode_step(x, v, sigmas[i], sigmas[i + 1])  # (n, C, h, w)
    return x


@torch.no_grad()
def complete_naive(transformer, ro: Rollout, cond: Cond, guidance_scale: float,
                   counter: EvalCounter | None = None) -> torch.Tensor:
    """The reference: finish every window state separately (the demo code's layout, with R_0 from the
    trajectory's own x_T). Returns (n, W+1, C, h, w); index W is the rollout's own final latent."""
    # DEVIATION: the demo code's pure-ODE run for R_0 draws fresh noise (generator None); we complete s_0, which
    # is reached from this trajectory's x_T by ODE steps only, because the paper's R_0 is "this trajectory
    # without any SDE step" (Sec. 4.1; docs/method.md, 'Incremental rewards via ODE completions').
    finished = [ode_complete(transformer, ro.states[:, k], ro.w0 + k, cond, ro.sigmas, ro.timesteps,
                             guidance_scale, counter) for k in range(ro.window)]  # W x (n, C, h, w)
    return torch.stack(finished + [ro.final], 1)  # (n, W+1, C, h, w)


@torch.no_grad()
def generate(pipe, prompts: list[str], seeds: list[int], steps: int, guidance_scale: float, resolution: int,
             max_sequence_length: int = 128, batch_size: int = 16) -> torch.Tensor:
    """Plain ODE sampling (evaluation): one image per (prompt, seed), in [0, 1], (N, 3, H', W') on the CPU.

    Seeds make each image independent of batch size and process count, as in training.
    """
    shape = latent_shape(pipe, resolution)
    sigmas, timesteps = sigma_grid(pipe.scheduler, steps, shape)
    images = []
    for start in range(0, len(prompts), batch_size):
        part = prompts[start:start + batch_size]
        cond = encode_prompts(pipe, part, guidance_scale, max_sequence_length)
        x_T = draw_noise(make_generators(seeds[start:start + batch_size]), shape, pipe.transformer.device)
        x_0 = ode_complete(pipe.transformer, x_T, 0, cond, sigmas, timesteps, guidance_scale)  # (b, C, h, w)
        images.append(decode(pipe, x_0).cpu())  # (b, 3, H', W')
    return torch.cat(images)  # (N, 3, H', W')
