"""The trained policy: LoRA on the transformer, its reference (adapters off), the EMA of its weights, the per-step
GRPO loss evaluated on it, and its weights in diffusers' format.

Paper (arXiv 2602.06422) Sec. 5 and Flow-GRPO (arXiv 2505.05470): the policy pi_theta is the flow model's
stochastic step with the transformer's LoRA-adapted velocity; the KL's reference pi_ref is the same transformer
with the adapter switched off (docs/method.md, 'The KL to the reference policy', 'The clipped loss'). The EMA and
LoRA settings are the demo code's (docs/method.md, 'SD3.5-Medium hyperparameters').

Used by train.py (the training loop), bench.py (a timed training step) and toymodel.py (the EMA of pretraining);
tested through `python -m pytest tests/test_train.py tests/test_grpo.py`.

Shape legend: b rows of a training micro-batch, C/h/w latent channels/height/width.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

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
            # trainable weights in float32 even when the frozen base is bf16 (under DeepSpeed the engine casts them to
            # bf16 again, keeping float32 master copies in the optimizer)
            p.data = p.data.float()
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
        # DEVIATION: one move per optimizer step, however it is split into micro-batches; the demo code moves it
        # per micro-batch, one step early (docs/deviations.md, 'EMA updates').
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


@dataclass(frozen=True)
class WindowStepLoss:
    """Sec. 5's loss of one window step, with the run's settings bound once (train.setup): the policy's stochastic
    step (sampler, noise level a, CFG scale w), the ratio clip eps, the KL weight beta and its reference policy.
    Called on a micro-batch of b stored transitions x -> x_next (b, C, h, w) at one grid index."""

    reference: Callable  # () -> a context manager yielding the KL's reference model (reference_policy)
    sampler: str  # "sde" | "cps" (sampler.stochastic_step)
    noise_level: float  # a
    guidance: float  # w (<= 1: no CFG)
    clip_range: float  # eps
    beta: float  # the KL weight (0: no reference pass)
    autocast: Callable = contextlib.nullcontext  # bf16 base, float32 LoRA (under DeepSpeed: no autocast, all bf16)

    def __call__(self, policy, x, x_next, *, t, cond, sigma, sigma_next, logp_old, adv, mask=None):
        """log pi_theta of the stored x_next under `policy` (with grad), the reference's step mean when beta > 0,
        and grpo.grpo_loss. t (b,), cond: the b rows' prompts, sigma / sigma_next the step's grid values,
        logp_old / adv (b,), mask (b,) bool or None. Returns (loss, stats, log_prob (b,))."""
        where = dict(t=t, cond=cond, sigma=sigma, sigma_next=sigma_next)
        # log pi_theta(x_next | x): the STORED next sample under the current policy (docs/method.md, 'The clipped
        # loss')
        out = self.step(policy, x, x_next, **where)
        ref_mean = None
        if self.beta > 0:
            with torch.no_grad(), self.reference() as ref:
                ref_mean = self.step(ref, x, x_next, **where).mean  # (b, C, h, w)
        loss, stats = grpo.grpo_loss(out.log_prob, logp_old, adv, mean=out.mean, ref_mean=ref_mean, std_kl=out.std_kl,
                                     clip_range=self.clip_range, beta=self.beta, mask=mask)
        return loss, stats, out.log_prob

    def step(self, model, x, x_next, *, t, cond, sigma, sigma_next) -> S.StepOut:
        """`model`'s stochastic step from x, evaluated at the given x_next."""
        with self.autocast():
            v = models.velocity(model, x, t, cond, self.guidance)  # (b, C, h, w)
        return S.stochastic_step(x, v, sigma, sigma_next, self.noise_level, self.sampler, next_sample=x_next)


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
