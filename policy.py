"""The trained policy: LoRA on the transformer, its reference (adapters off), the EMA of its weights, the per-step
GRPO loss evaluated on it, and its weights in diffusers' format.

Paper (arXiv 2602.06422) Sec. 5 and Flow-GRPO (arXiv 2505.05470): the policy pi_theta is the flow model's
stochastic step with the transformer's LoRA-adapted velocity; the KL's reference pi_ref is the same transformer
with the adapter switched off (docs/method.md, 'The KL to the reference policy', 'The clipped loss'). The EMA and
LoRA settings are the demo code's (docs/method.md, 'SD3.5-Medium hyperparameters').

Used by train.py (the training loop), bench.py (a timed training step) and toymodel.py (the EMA of pretraining);
tested through `python -m pytest tests/test_train.py tests/test_grpo.py`.

Shape legend: b rows of a training micro-batch, C/h/w latent channels/height/width (lower case: W is the window
length elsewhere).
"""

from __future__ import annotations

import contextlib
import os

import safetensors.torch
import torch
from diffusers import StableDiffusion3Pipeline
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

import grpo
import models
import sampler as S


def add_lora(transformer, rank: int, alpha: int, targets: list[str]):
    """Wrap the `targets` modules (path suffixes) with LoRA (peft); the base weights stay frozen. rank 0 = full
    fine-tuning. Returns the transformer (the same object)."""
    if rank == 0:
        transformer.requires_grad_(True)  # full fine-tuning
        return transformer
    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian",
                                       target_modules=targets))
    for p in transformer.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # trainable weights in float32 even when the frozen base is bf16
    return transformer


class EMA:
    """Exponential moving average of the trainable weights, as Flow-GRPO's EMAModuleWrapper (flow_grpo/ema.py):
    after optimizer step s (counted from 0) the shadow moves when (s + 1) % every == 0, with a decay warmed up from
    ~0.47 (s = 7) to its cap (reached at s = 80 for 0.9), so the first updates mostly forget the initial weights."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float, every: int):
        self.params, self.decay, self.every, self.steps = params, decay, every, 0
        self.shadow = [p.detach().clone().float() for p in params]

    def decay_at(self, s: int) -> float:
        """decay_s = min(decay, (1 + s) / (10 + s)) (Flow-GRPO's get_current_decay)."""
        return min(self.decay, (1 + s) / (10 + s))

    @torch.no_grad()
    def step(self):
        """Call once after every optimizer step."""
        # DEVIATION: the demo code (as Flow-GRPO's train_sd3.py) calls ema.step after every training micro-batch
        # with its optimizer-step counter, already incremented by the step just taken: with its 2 micro-batches per
        # optimizer step (SD3.5-M on 32 GPUs) the shadow moves twice at each qualifying step, one step earlier. After
        # 80 optimizer steps its shadow holds ~0.5% of the initial weights, ours 7% (0.9 every 8 steps: 35%). We
        # update once per optimizer step, because an average over optimizer steps should not depend on how a step
        # is split into micro-batches.
        s = self.steps  # the index of the optimizer step just taken
        self.steps += 1
        if self.decay > 0 and (s + 1) % self.every == 0:
            decay = self.decay_at(s)
            for sh, p in zip(self.shadow, self.params):
                sh.lerp_(p.detach().float(), 1 - decay)  # shadow <- decay_s shadow + (1 - decay_s) p

    @torch.no_grad()
    def swap(self):
        """Exchange the live weights and the averaged ones (call twice to undo)."""
        for s, p in zip(self.shadow, self.params):
            tmp = p.detach().clone()
            p.copy_(s)
            s.copy_(tmp)

    def save(self, path: str):
        """The shadow weights and the step counter as safetensors (no pickle: loading it runs no code)."""
        tensors = {f"shadow.{i}": s.detach().cpu().contiguous() for i, s in enumerate(self.shadow)}
        safetensors.torch.save_file({**tensors, "steps": torch.tensor(self.steps)}, path)

    def load(self, path: str):
        state = safetensors.torch.load_file(path)
        if len(state) != len(self.shadow) + 1:
            raise ValueError(f"{path} holds {len(state) - 1} EMA tensors, this model has {len(self.shadow)} "
                             f"trainable ones; resume with the configuration it was trained with")
        self.steps = int(state["steps"])
        for i, s in enumerate(self.shadow):
            s.copy_(state[f"shadow.{i}"])


@contextlib.contextmanager
def reference_policy(transformer):
    """The KL's reference: the same transformer with its LoRA adapter switched off (docs/method.md, 'The KL to the
    reference policy')."""
    transformer.disable_adapters()
    try:
        yield transformer
    finally:
        transformer.enable_adapters()


def window_step_loss(policy, reference, x, x_next, t, cond, sigma, sigma_next, logp_old, adv, cfg, mask=None,
                     autocast=contextlib.nullcontext):
    """Section 5's work for one window step of a micro-batch of b rows: log p_theta of the stored next states
    x_next (b, C, h, w) under `policy` (with grad), the reference policy's step mean when beta > 0 (`reference()`
    is a context manager yielding the reference model), and grpo.grpo_loss. `cfg` is a config.Config (guidance,
    sampler, noise_level, clip_range, beta). Returns (loss, stats, log_prob (b,)).
    """
    with autocast():  # bf16 base weights with float32 LoRA weights
        v = models.velocity(policy, x, t, cond, cfg.guidance)  # (b, C, h, w), with grad
    # log p_theta of the STORED next sample under the current policy (docs/method.md, 'The clipped loss')
    out = S.sde_step(x, v, sigma, sigma_next, cfg.noise_level, cfg.sampler, next_sample=x_next)
    ref_mean = None
    if cfg.beta > 0:
        with torch.no_grad(), reference() as ref, autocast():
            v_ref = models.velocity(ref, x, t, cond, cfg.guidance)  # (b, C, h, w)
        ref_mean = S.sde_step(x, v_ref, sigma, sigma_next, cfg.noise_level, cfg.sampler,
                              next_sample=x_next).mean  # (b, C, h, w)
    loss, stats = grpo.grpo_loss(out.log_prob, logp_old, adv, out.mean, ref_mean, out.std_kl, cfg.clip_range,
                                 cfg.beta, mask=mask)
    return loss, stats, out.log_prob


def lora_state_dict(transformer) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(transformer).items()}


def save_weights(transformer, folder: str):
    """The trained weights in diffusers' format: LoRA for `pipe.load_lora_weights(folder)`, else (full fine-tuning)
    the transformer."""
    if not getattr(transformer, "peft_config", None):
        transformer.save_pretrained(os.path.join(folder, "transformer"))
        return
    # the adapter metadata carries lora_alpha: without it diffusers would load the LoRA with scale 1, not alpha/r
    StableDiffusion3Pipeline.save_lora_weights(
        folder, transformer_lora_layers=lora_state_dict(transformer),
        transformer_lora_adapter_metadata=transformer.peft_config["default"].to_dict())
