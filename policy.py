"""The trained policy: LoRA on the transformer, its reference (adapters off), the EMA of its weights, the per-step
GRPO loss evaluated on it and the statistics of an iteration's updates, its compiled form for sampling, and its
weights in diffusers' format.

Flow-GRPO (arXiv 2505.05470), as the paper (arXiv 2602.06422) trains with it: the policy pi_theta is the flow
model's stochastic step with the transformer's LoRA-adapted velocity; the KL's reference pi_ref is the same
transformer with the adapter switched off (docs/method.md, 'The KL to the reference policy', 'The clipped loss').
The EMA and LoRA settings are the demo code's (docs/method.md, 'SD3.5-Medium hyperparameters').

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

import collectives
import grpo
import models
import sampler as S
from config import Config


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
        for sh, p in zip(self.shadow, self.params):
            tmp = p.detach().clone()
            p.copy_(sh)
            sh.copy_(tmp)

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
    """Flow-GRPO's clipped loss of one window step (docs/method.md, 'The clipped loss'), with the run's settings
    bound once (train.setup): the policy's stochastic step (sampler, noise level a, CFG scale w), the ratio clip
    eps, the KL weight beta and its reference policy. Called on a micro-batch of b stored transitions x -> x_next
    (b, C, h, w) at one grid index."""

    reference: Callable  # () -> a context manager yielding the KL's reference model (reference_policy)
    sampler: str  # "sde" | "cps" (sampler.stochastic_step)
    noise_level: float  # a
    guidance: float  # w (<= 1: no CFG)
    clip_range: float  # eps
    beta: float  # the KL weight (0: no reference pass)
    autocast: Callable = contextlib.nullcontext  # bf16 base, float32 LoRA (under DeepSpeed: no autocast, all bf16)

    def __call__(self, policy, x, x_next, *, t, cond, sigma, sigma_next, log_weight_old, adv, mask=None):
        """The step's log-weight of the stored x_next under `policy` (with grad; sampler.StepOut), the reference's
        step mean when beta > 0, and grpo.grpo_loss. t (b,), cond: the b rows' prompts, sigma / sigma_next the
        step's grid values, log_weight_old / adv (b,), mask (b,) bool or None. Returns (loss, stats,
        log_weight (b,))."""
        where = dict(t=t, cond=cond, sigma=sigma, sigma_next=sigma_next)
        # log w_theta(x_next | x) (log pi_theta for "sde"): the STORED next sample under the current policy
        # (docs/method.md, 'The clipped loss')
        out = self.step(policy, x, x_next, **where)
        ref_mean = None
        if self.beta > 0:
            with torch.no_grad(), self.reference() as ref:
                ref_mean = self.step(ref, x, x_next, **where).mean  # (b, C, h, w)
        loss, stats = grpo.grpo_loss(out.log_weight, log_weight_old, adv, mean=out.mean, ref_mean=ref_mean,
                                     std_kl=out.std_kl, clip_range=self.clip_range, beta=self.beta, mask=mask)
        return loss, stats, out.log_weight

    def step(self, model, x, x_next, *, t, cond, sigma, sigma_next) -> S.StepOut:
        """`model`'s stochastic step from x, evaluated at the given x_next."""
        with self.autocast():
            v = models.velocity(model, x, t, cond, self.guidance)  # (b, C, h, w)
        return S.stochastic_step(x, v, sigma, sigma_next, self.noise_level, kind=self.sampler, next_sample=x_next)


class UpdateStats:
    """The training statistics of one iteration (docs/metrics.md): grpo_loss's statistics and the loss as
    means over every counted (row, window step) of the iteration; the same for the first micro-batch alone
    ("first_"), which trains before any optimizer step, so its ratio rho must be 1 up to the numerics
    (first_ratio_dev, max |rho - 1| over all its rows, counted or not, checks the on-policy recomputation); the
    mean gradient norm; the share of zero-advantage trajectories."""

    def __init__(self):
        self.sums, self.first, self.first_dev, self.grad_norms = {}, {}, 0.0, []

    def add(self, stats: dict, loss: torch.Tensor, *, counted: int, first: bool, log_weight: torch.Tensor,
            log_weight_old: torch.Tensor):
        """One window step of a micro-batch: its stats weighted by its `counted` rows; log_weight, log_weight_old
        (b,), the step's log-weights now and at sampling time."""
        for into in (self.sums, self.first) if first else (self.sums,):
            for key, val in {**stats, "loss": loss.detach(), "rows": 1.0}.items():
                into[key] = into.get(key, 0.0) + float(val) * counted
        if first:
            rho = torch.exp(log_weight.detach() - log_weight_old)  # (b,)
            self.first_dev = max(self.first_dev, float((rho - 1).abs().max()))

    def grad_norm(self, norm):
        self.grad_norms.extend([] if norm is None else [float(norm)])  # DeepSpeed may return None

    def summary(self, acc, zero_adv: torch.Tensor, N: int) -> dict[str, float]:
        """Means over all processes; zero_adv (n,) bool marks this process's zero-advantage rows."""
        out = collectives.mean_over_processes(acc, self.sums)
        out.update({f"first_{name}": v for name, v in collectives.mean_over_processes(acc, self.first).items()})
        out["first_ratio_dev"] = collectives.max_over_processes(acc, self.first_dev)
        out["zero_adv_frac"] = float(collectives.reduce_sum(acc, zero_adv.sum())) / N
        out["grad_norm"] = sum(self.grad_norms) / max(len(self.grad_norms), 1)
        return out


def compiled_policy(policy, cfg: Config) -> models.CompiledTransformer:
    """The policy compiled for sampling, completions and evaluation (--compile), in calls of a fixed number of
    images: by default one rollout call's, sample_batch (x2 with CFG: SD3 stacks the negative prompt's half), so
    the wavefront's calls of n(1 + live) trajectories split into whole chunks and need no padding; evaluation's
    batches are padded to it. One graph then serves the run (docs/gpu.md, 'Compiling the transformer')."""
    cfg_pair = 2 if cfg.guidance > 1 and not models.is_flux(policy) else 1
    return models.CompiledTransformer(policy, cfg.compile_rows or cfg.sample_batch * cfg_pair, cfg.compile_backend)


def lora_state_dict(transformer) -> dict[str, torch.Tensor]:
    return {name: v.detach().cpu().contiguous() for name, v in get_peft_model_state_dict(transformer).items()}


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
