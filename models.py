"""The two model families, SD3.5-Medium and FLUX.1-dev (paper Sec. 5 and appendix), behind one switch: everything
sampler.py, policy.py and train.py need to know about a model. In order:

  1. loading a pipeline, the latent shape (FLUX packs 2x2 patches of its 16-channel latents into tokens) and
     decoding with the VAE,
  2. the T-step sigma grid of the pipeline's own scheduler (SD3's static shift, FLUX's resolution-dependent one),
     prompt encoding and the guided velocity v(x, sigma, c) (SD3's true classifier-free guidance, FLUX's guidance
     embedding), counting every network evaluation,
  3. the transformer compiled for calls of a fixed size (--compile),
  4. models built in code with random weights, with the same diffusers / transformers classes: tiny ones for the CPU
     tests ("tiny", "tiny-flux"), and SD3.5-M's and FLUX.1-dev's real shapes for GPU smoke tests and bench.py.

`is_flux(pipe or transformer)` is the switch (docs/method.md, 'FLUX.1-dev'); from the velocity on, the sampler
(steps, rollouts, completions), credit assignment, GRPO and the training loop are shared.

Run: `python -m pytest tests/test_sampler.py tests/test_flux.py`.

Shape legend: n images in a call, C/h/w latent channels/height/width, H'/W' decoded pixels, L text tokens, D text
width, P pooled width. A latent is (C, h, w) for SD3 and FLUX's packed tokens (h/2 * w/2, 4C) for FLUX.
"""

from __future__ import annotations

import json
import logging
import math
import os
import string
from contextlib import nullcontext
from dataclasses import dataclass

# diffusers' FLUX pipeline and IP-adapter loader import transformers' CLIPImageProcessor and SiglipImageProcessor
# (for IP-adapters, which we never use); without torchvision, transformers swaps in their PIL versions and says so at
# every start, a line no user can act on. That one message is dropped, before diffusers is imported below.
logging.getLogger("transformers.utils.import_utils").addFilter(
    lambda record: "requires torchvision (not installed); falling back to" not in record.getMessage())

import numpy as np
import torch
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel,
                       SD3Transformer2DModel, StableDiffusion3Pipeline)
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer, T5Config,
                          T5EncoderModel, T5Tokenizer)

# the paper's two models on the hub (models built in code instead: section 4)
SD35_MEDIUM = "stabilityai/stable-diffusion-3.5-medium"
FLUX_DEV = "black-forest-labs/FLUX.1-dev"


# ----------------------------------------------------------------------------------------------------------------
# 1. Loading a real SD3 or FLUX pipeline (or one built in code, section 4), latents and decoding
# ----------------------------------------------------------------------------------------------------------------


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is one line saying which and how to fix it."""


def is_flux(model) -> bool:
    """The one switch between the two model families: a FLUX pipeline or transformer (also inside a DDP /
    DeepSpeed wrapper, which hides it behind .module) -> True, SD3 -> False."""
    transformer = getattr(model, "transformer", model)
    return isinstance(getattr(transformer, "module", transformer), FluxTransformer2DModel)


def load_pipeline(model: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """An SD3 or FLUX pipeline from a name in TINY or RANDOM (random weights, section 4), a hub id (SD35_MEDIUM,
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


def velocity(transformer, x: torch.Tensor, timestep: torch.Tensor, cond: Cond, guidance_scale: float, *,
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
        out = _flux_velocity(transformer, x, timestep, cond, guidance_scale, dtype=dtype)  # (n, h/2 * w/2, 4C)
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


def _flux_velocity(transformer, x: torch.Tensor, timestep: torch.Tensor, cond: Cond, guidance_scale: float, *,
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
# 3. The transformer compiled for a fixed call size (torch.compile), for sampling, completions and evaluation
# ----------------------------------------------------------------------------------------------------------------


class CompiledTransformer:
    """The transformer's forward compiled with torch.compile for calls of exactly `rows` images.

    torch.compile specializes a graph to the input shapes it sees, and a new shape costs a new compilation (about
    a minute at SD3.5-M scale). The wavefront's calls grow and shrink with the number of live completion branches
    (n, 2n, ... per grid index), CFG doubles them, evaluation batches differ and the last batch can be short: a
    naively compiled model would recompile at almost every call. Here every call is cut into chunks of `rows`
    images and the last chunk is padded with copies of its last row, whose outputs are dropped; every image is
    computed alone (no batch statistics in the transformer), so padding changes no result beyond float32
    rounding. One compiled graph per (rows, text length, dtype) then serves a whole run.

    Used like the transformer by `velocity` (it forwards .module, .dtype and the keyword call); the weights stay
    the policy's own, so LoRA updates and EMA swaps are seen without recompiling.
    """

    BATCHED = ("hidden_states", "timestep", "encoder_hidden_states", "pooled_projections", "guidance")

    def __init__(self, transformer, rows: int, backend: str = "inductor"):
        if rows < 1:
            raise ValueError(f"a compiled call needs rows >= 1 images, got {rows}")
        self.module, self.rows = transformer, rows  # .module: is_flux and the FLUX config look behind it
        # dynamic=False: one static graph per shape, the fastest kernels, and a recompile would show in the count
        self.compiled = torch.compile(transformer, backend=backend, dynamic=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.module.dtype

    def __call__(self, **inputs):
        n = inputs["hidden_states"].shape[0]
        outs = []
        for start in range(0, n, self.rows):
            m = min(self.rows, n - start)  # real images in this chunk; rows - m are padding
            chunk = {k: _pad_rows(v[start:start + m], self.rows) if k in self.BATCHED and v is not None else v
                     for k, v in inputs.items()}  # every batched input (rows, ...)
            outs.append(self.compiled(**chunk)[0][:m])  # (m, C, h, w), the padding's outputs dropped
        return (torch.cat(outs),)  # (n, C, h, w), as the transformer returns with return_dict=False


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """(m, ...) -> (rows, ...): the last row repeated (a real input, so the padding computes nothing unusual)."""
    return x if x.shape[0] == rows else torch.cat([x, x[-1:].expand(rows - x.shape[0], *x.shape[1:])])


# ----------------------------------------------------------------------------------------------------------------
# 4. Models built in code with random weights (same classes, same code path): tiny ones for the CPU tests, and
#    SD3.5-M's and FLUX.1-dev's real shapes for GPU smoke tests and bench.py (`--model random-sd35m`)
# ----------------------------------------------------------------------------------------------------------------

RANDOM_SD35M = "random-sd35m"  # SD3.5-M's shapes with random weights (random_sd35m_pipeline)

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

RANDOM_FLUX_DEV = "random-flux-dev"  # FLUX.1-dev's shapes with random weights (random_flux_dev_pipeline)
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
