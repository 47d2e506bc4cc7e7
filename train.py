"""TP-GRPO (and Flow-GRPO, and the incremental-only ablation) for SD3 with LoRA: the paper's training algorithm.

Implements Algorithm 1 of arXiv 2602.06422 (docs/method.md, 'Rollout with an SDE window' to 'The clipped loss')
as one loop, each iteration:

  1. draw B prompts; each process samples its share of the B x G trajectories (the group's members are spread
     over the processes), with stochastic steps only inside the SDE window (sampler.rollout);
  2. TP-GRPO / incremental: ODE-complete every window state in the same batched calls (sampler, Sec. 4.1;
     docs/method.md, 'The batched wavefront');
  3. decode and score every completion: R (N, W+1), column W = R_sde; gather over processes;
  4. per-step rewards (turning_points.step_rewards) and per-timestep advantages (grpo.py);
  5. train on the window steps: clipped surrogate + KL to the adapter-disabled model, gradients accumulated
     over the W steps and micro-batches, `updates_per_iter` optimizer steps per iteration;
  6. EMA of the trainable weights, logging, evaluation, checkpoints.

Run:
  python train.py --task tiny                                # CPU, the toy world (toyworld.py), a few minutes
  accelerate launch train.py --task pickscore                # SD3.5-M, one GPU
  accelerate launch --config_file configs/multi_gpu.yaml train.py --task geneval
  accelerate launch --config_file configs/deepspeed_zero2.yaml train.py --task ocr
  python train.py --help                                     # every field, with its paper symbol

Shape legend: B prompts per iteration, G group size, N = B*G trajectories (all processes), n = N / processes
(this process), b a sampling or training micro-batch, T steps, W window steps, C/h/w latent
channels/height/width (lower case: W is the window length), H'/W' decoded pixels.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

import torch

import grpo
import sampler as S
import toyworld
import turning_points as tp


# ================================================================================================================
# 0. Configuration: one frozen dataclass, one preset per task, every field a command-line flag
# ================================================================================================================


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Config:
    task: str = _f("pickscore", "preset: pickscore | ocr | geneval (SD3.5-M, docs/method.md) | pickscore-flux | "
                                "geneval-flux (FLUX.1-dev) | tiny (CPU toy world)")
    model: str = _f(S.SD35_MEDIUM, "SD3 or FLUX pipeline: hub id, local folder, 'tiny', 'tiny-flux', 'random-sd35m' "
                                   "or 'random-flux-dev' (SD3.5-M's, FLUX.1-dev's shapes; all random weights built "
                                   "in code, no download)")
    algo: str = _f("tp-grpo", "tp-grpo | flow-grpo (outcome reward on every step) | incremental (r_k = d_k)")
    tp_rule: str = _f("strict", "turning-point rule: strict (Def. 5.1, 'w/ constraint') | base (Def. 4.1)")
    rewards: str = _f("pickscore:1", "reward models with weights, 'name:w,name:w' (rewards.py)")
    prompts: str = _f("dataset/pickscore_sfw/train.txt", "training prompts: .txt (one a line) or GenEval .jsonl")
    eval_prompts: str = _f("dataset/pickscore_sfw/test.txt", "evaluation prompts (same formats)")
    resolution: int = _f(512, "image side in pixels")
    steps: int = _f(10, "T, sampling steps during training")
    eval_steps: int = _f(40, "sampling steps at evaluation")
    guidance: float = _f(4.5, "w, classifier-free guidance scale in training (<= 1: no CFG)")
    eval_guidance: float = _f(4.5, "w at evaluation")
    sampler: str = _f("cps", "stochastic step: cps (coefficients-preserving) | sde (Flow-GRPO's SDE), docs/method.md")
    noise_level: float = _f(0.7, "a, the noise level of the stochastic step")
    window: int = _f(9, "W, number of SDE (trained) steps")
    window_start: int = _f(0, "w0, first SDE step; -1 draws it per iteration in [0, T - W]")
    group_size: int = _f(24, "G, trajectories per prompt")
    prompts_per_iter: int = _f(48, "B, prompts per iteration over all processes")
    sample_batch: int = _f(9, "trajectories per rollout call on each process")
    train_batch: int = _f(9, "trajectories per training micro-batch on each process")
    updates_per_iter: int = _f(2, "optimizer steps per iteration (the samples are split this many ways)")
    lr: float = _f(3e-4, "AdamW learning rate")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.999, "AdamW beta2")
    weight_decay: float = _f(1e-4, "AdamW weight decay")
    adam_eps: float = _f(1e-8, "AdamW epsilon")
    max_grad_norm: float = _f(1.0, "gradient-norm clip")
    clip_range: float = _f(1e-5, "epsilon, the ratio clip: clip(rho, 1 - eps, 1 + eps)")
    beta: float = _f(1e-4, "beta, the KL weight (0 skips the reference forward pass)")
    adv_clip: float = _f(5.0, "advantages are clipped to [-adv_clip, adv_clip]")
    drop_zero_adv: bool = _f(True, "leave trajectories whose advantage A_{i,k} is 0 at every window step out of "
                                   "the loss's means (Flow-GRPO and the demo code drop them)")
    lora_rank: int = _f(32, "LoRA r (0 = full fine-tuning of the transformer)")
    lora_alpha: int = _f(64, "LoRA alpha")
    lora_targets: str = _f(",".join(f"attn.{m}" for m in ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj",
                                                           "add_k_proj", "add_v_proj", "to_add_out")),
                           "LoRA target modules, matched as path suffixes: the joint attention's projections of "
                           "both streams, as the demo code and Flow-GRPO (191 layers on SD3.5-M; a bare 'to_q' "
                           "would also match the image-only attn2)")
    ema_decay: float = _f(0.9, "EMA decay cap: after optimizer step s the decay is min(ema_decay, (1+s)/(10+s)) "
                               "(0 disables EMA)")
    ema_every: int = _f(8, "EMA update after optimizer step s when (s+1) % ema_every == 0")
    mixed_precision: str = _f("bf16", "no | bf16 | fp16 (weights of frozen parts and autocast)")
    gradient_checkpointing: bool = _f(False, "recompute transformer activations in backward (saves memory)")
    max_sequence_length: int = _f(128, "T5 tokens per prompt")
    chunk_size: int = _f(0, "max images per transformer call in completions (0 = no cap)")
    reward_batch: int = _f(32, "images per decode/reward call")
    iterations: int = _f(2000, "training iterations")
    eval_every: int = _f(50, "evaluate every this many iterations (0 = only before and after)")
    eval_samples: int = _f(64, "evaluation images (prompts cycled, seeds fixed)")
    save_every: int = _f(50, "checkpoint every this many iterations (0 = only at the end)")
    seed: int = _f(0, "seed of prompts, noise and shuffling: (seed, iteration, prompt, member)")
    output_dir: str = _f("runs/pickscore", "checkpoints, logs, sample grids")
    resume: str = _f("", "checkpoint folder to continue from, or 'latest' in output_dir")
    report_to: str = _f("tensorboard", "tensorboard | wandb | none")


GRID_IMAGES = 32  # evaluation images shown in samples_<tag>.png
# the shipped toy checkpoint, found from any working directory (outputs still go under the working directory)
TOY_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_model")
SD35M = dict(model=S.SD35_MEDIUM, resolution=512, steps=10, eval_steps=40, guidance=4.5, eval_guidance=4.5)
PRESETS = {
    "pickscore": dict(SD35M, rewards="pickscore:1", prompts="dataset/pickscore_sfw/train.txt",
                      eval_prompts="dataset/pickscore_sfw/test.txt", output_dir="runs/pickscore"),
    "ocr": dict(SD35M, rewards="ocr:1", prompts="dataset/ocr/train.txt", eval_prompts="dataset/ocr/test.txt",
                output_dir="runs/ocr"),
    "geneval": dict(SD35M, rewards="geneval:1", prompts="dataset/geneval/train_metadata.jsonl",
                    eval_prompts="dataset/geneval/test_metadata.jsonl", output_dir="runs/geneval"),
    # The toy world (toyworld.py): 32 px shapes, a graded colour + count reward, a ~0.6M-parameter pixel-space SD3
    # pretrained partly on captions that misname the colour (it draws the asked one about half the time). Sized for
    # 2 CPU cores: about 3.5 minutes.
    # T = 6 with a 5-step window from step 0 is the paper's FLUX.1-dev schedule; the held-out evaluation is the
    # one the checkpoint ships values for (toyworld.HELDOUT_SETTINGS: 1024 images, fixed noise)
    "tiny": dict(toyworld.HELDOUT_SETTINGS, model=TOY_MODEL, prompts="toy:train", steps=toyworld.STEPS,
                 guidance=1.0, window=5, group_size=8, prompts_per_iter=4, sample_batch=32, train_batch=16,
                 lr=1e-3, lora_rank=8, lora_alpha=16, mixed_precision="no", reward_batch=64,
                 iterations=30, eval_every=0, save_every=0, output_dir="runs/tiny",
                 beta=0.0, clip_range=1e-4, ema_decay=0.0, report_to="tensorboard"),
}

# ---- FLUX.1-dev (paper appendix; docs/method.md, 'FLUX.1-dev'): the authors' FLUX scripts' settings -------------
# LoRA on FLUX's attention projections of both streams and the feed-forward layers, matched as path suffixes. On
# FLUX.1-dev's shape this adapts 342 layers: in each of the 19 double-stream blocks the 8 attention projections
# and the 4 feed-forward layers of the image (ff) and text (ff_context) streams (228), and in each of the 38
# single-stream blocks attn.to_q/k/v (114; their fused output proj_out and proj_mlp match no suffix, and they have no
# to_out).
FLUX_LORA_TARGETS = ",".join([f"attn.{m}" for m in ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj",
                                                     "add_v_proj", "to_add_out")]
                             + [f"{ff}.{m}" for ff in ("ff", "ff_context") for m in ("net.0.proj", "net.2")])
# 512 px, T = 6 training / 28 evaluation steps, guidance embedding 3.5 in both (no CFG pass), cps with a = 0.8 and
# the window from step 0; G = 24 over B = 48 prompts with 3 trajectories per GPU per micro-batch, 2 updates per
# iteration; AdamW 3e-4, eps 1e-5, beta 0 (no reference pass), EMA on, bf16; LoRA r = 64, alpha = 128
FLUX1_DEV = dict(model=S.FLUX_DEV, resolution=512, steps=6, eval_steps=28, guidance=3.5, eval_guidance=3.5,
                 sampler="cps", noise_level=0.8, window_start=0, group_size=24, prompts_per_iter=48, sample_batch=3,
                 train_batch=3, updates_per_iter=2, lr=3e-4, clip_range=1e-5, beta=0.0, ema_decay=0.9,
                 mixed_precision="bf16", lora_rank=64, lora_alpha=128, lora_targets=FLUX_LORA_TARGETS)
PRESETS.update({
    "pickscore-flux": dict(FLUX1_DEV, window=5, rewards="pickscore:1", prompts="dataset/pickscore_sfw/train.txt",
                           eval_prompts="dataset/pickscore_sfw/test.txt", output_dir="runs/pickscore-flux"),
    "geneval-flux": dict(FLUX1_DEV, window=6, rewards="geneval:1", prompts="dataset/geneval/train_metadata.jsonl",
                         eval_prompts="dataset/geneval/test_metadata.jsonl", output_dir="runs/geneval-flux"),
})


def parse_config(argv: list[str] | None = None) -> Config:
    """--task picks a preset; every other flag overrides one field of it."""
    p = argparse.ArgumentParser(description=__doc__.split("Shape legend")[0],
                                usage="%(prog)s [--task TASK] [--FIELD VALUE ...]  (--help lists every field)",
                                epilog="Defaults shown are the SD3.5-M values (docs/method.md, 'SD3.5-Medium "
                                       "hyperparameters'); --task picks a preset that "
                                       "may change some of them (train.PRESETS).",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        text = f.metadata["help"].replace("%", "%%") + f" (default: {f.default})"  # argparse %-formats help
        if f.type in ("bool", bool):
            p.add_argument(flag, type=lambda v: v.lower() in ("1", "true", "yes"), default=None,
                           metavar="BOOL", help=text)
        else:
            kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
            p.add_argument(flag, type=kind, default=None, help=text)
    args = vars(p.parse_args(argv))
    task = args["task"] or Config.task
    if task not in PRESETS:
        p.error(f"unknown task '{task}'; choose one of {', '.join(PRESETS)}")
    values = dict(PRESETS[task], task=task)
    values.update({k: v for k, v in args.items() if v is not None})
    cfg = Config(**values)
    problem = check_config(cfg)
    if problem:
        p.error(problem)
    return cfg


def check_config(cfg: Config) -> str:
    """One line naming what is inconsistent, or '' (checked before anything is loaded or written)."""
    if cfg.algo not in tp.ALGOS:
        return f"unknown --algo '{cfg.algo}'; choose one of {', '.join(tp.ALGOS)}"
    if cfg.tp_rule not in tp.RULES:
        return f"unknown --tp-rule '{cfg.tp_rule}'; choose one of {', '.join(tp.RULES)}"
    if cfg.sampler not in S.SAMPLERS:
        return f"unknown --sampler '{cfg.sampler}'; choose one of {', '.join(S.SAMPLERS)}"
    if not 1 <= cfg.window <= cfg.steps or cfg.window_start + cfg.window > cfg.steps:
        return f"the SDE window (w0={cfg.window_start}, W={cfg.window}) must fit in T={cfg.steps} steps"
    return ""


def parse_weights(spec: str) -> dict[str, float]:
    """'pickscore:1,ocr:0.5' -> {'pickscore': 1.0, 'ocr': 0.5}."""
    out = {}
    for item in filter(None, spec.split(",")):
        name, _, weight = item.partition(":")
        out[name.strip()] = float(weight or 1)
    return out


# ================================================================================================================
# Helpers the loop uses: prompts, LoRA, EMA, the training state
# ================================================================================================================


def load_prompt_set(spec: str):
    """(prompts, metadata) from a file, or from the toy world's caption grammar ('toy:train' / 'toy:heldout')."""
    if spec.startswith("toy:"):
        split = spec.split(":", 1)[1]
        if split == "train":  # every (count, colour, shape) caption; new noise every iteration
            metas = toyworld.all_metadata()
            return [toyworld.caption(m) for m in metas], metas
        prompts, metas, _ = toyworld.dataset(split, 0, toyworld.HELDOUT_SIZE)  # the held-out evaluation set
        return prompts, metas
    import rewards
    return rewards.load_prompts(spec)


def add_lora(transformer, cfg: Config):
    """Wrap the transformer's attention projections with LoRA (peft); the base weights stay frozen."""
    from peft import LoraConfig
    if cfg.lora_rank == 0:
        transformer.requires_grad_(True)  # full fine-tuning
        return transformer
    transformer.add_adapter(LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, init_lora_weights="gaussian",
                                       target_modules=cfg.lora_targets.split(",")))
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
        import safetensors.torch
        tensors = {f"shadow.{i}": s.detach().cpu().contiguous() for i, s in enumerate(self.shadow)}
        safetensors.torch.save_file({**tensors, "steps": torch.tensor(self.steps)}, path)

    def load(self, path: str):
        import safetensors.torch
        state = safetensors.torch.load_file(path)
        if len(state) != len(self.shadow) + 1:
            raise ValueError(f"{path} holds {len(state) - 1} EMA tensors, this model has {len(self.shadow)} "
                             f"trainable ones; resume with the configuration it was trained with")
        self.steps = int(state["steps"])
        for i, s in enumerate(self.shadow):
            s.copy_(state[f"shadow.{i}"])


@dataclass
class Progress:
    """The loop's position, saved as progress.json in every checkpoint so --resume continues exactly."""

    iteration: int = 0


@contextlib.contextmanager
def reference_policy(transformer):
    """The KL's reference: the same transformer with its LoRA adapter switched off (docs/method.md, 'The KL to the
    reference policy')."""
    transformer.disable_adapters()
    try:
        yield transformer
    finally:
        transformer.enable_adapters()


def window_step_loss(policy, reference, x, x_next, t, cond, sigma, sigma_next, logp_old, adv, cfg: Config,
                     mask=None, autocast=contextlib.nullcontext):
    """Section 5's work for one window step of a micro-batch of b rows: log p_theta of the stored next states
    x_next (b, C, h, w) under `policy` (with grad), the reference policy's step mean when beta > 0 (`reference()`
    is a context manager yielding the reference model), and grpo.grpo_loss. Returns (loss, stats, log_prob (b,)).
    """
    with autocast():  # bf16 base weights with float32 LoRA weights
        v = S.velocity(policy, x, t, cond, cfg.guidance)  # (b, C, h, w), with grad
    # log p_theta of the STORED next sample under the current policy (docs/method.md, 'The clipped loss')
    out = S.sde_step(x, v, sigma, sigma_next, cfg.noise_level, cfg.sampler, next_sample=x_next)
    ref_mean = None
    if cfg.beta > 0:
        with torch.no_grad(), reference() as ref, autocast():
            v_ref = S.velocity(ref, x, t, cond, cfg.guidance)  # (b, C, h, w)
        ref_mean = S.sde_step(x, v_ref, sigma, sigma_next, cfg.noise_level, cfg.sampler,
                              next_sample=x_next).mean  # (b, C, h, w)
    loss, stats = grpo.grpo_loss(out.log_prob, logp_old, adv, out.mean, ref_mean, out.std_kl, cfg.clip_range,
                                 cfg.beta, mask=mask)
    return loss, stats, out.log_prob


def lora_state_dict(transformer) -> dict[str, torch.Tensor]:
    from peft.utils import get_peft_model_state_dict
    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(transformer).items()}


def save_weights(transformer, cfg: Config, folder: str):
    """The trained weights in diffusers' format: LoRA for `pipe.load_lora_weights(folder)`, else a transformer."""
    from diffusers import StableDiffusion3Pipeline
    if cfg.lora_rank == 0:
        transformer.save_pretrained(os.path.join(folder, "transformer"))
    else:
        # the adapter metadata carries lora_alpha: without it diffusers would load the LoRA with scale 1, not alpha/r
        StableDiffusion3Pipeline.save_lora_weights(
            folder, transformer_lora_layers=lora_state_dict(transformer),
            transformer_lora_adapter_metadata=transformer.peft_config["default"].to_dict())


def _trainable_only_hooks(accelerator):
    """accelerate's save_state keeps only the trainable weights (LoRA), not gigabytes of frozen base weights."""
    import safetensors.torch

    def save_hook(models, weights, output_dir):
        for i, model in enumerate(models):
            keep = {name for name, p in model.named_parameters() if p.requires_grad}
            weights[i] = {k: v for k, v in weights[i].items() if k in keep}

    def load_hook(models, input_dir):
        for i in range(len(models)):
            model = models.pop(0)
            name = "model.safetensors" if i == 0 else f"model_{i}.safetensors"
            state = safetensors.torch.load_file(os.path.join(input_dir, name))
            unexpected = model.load_state_dict(state, strict=False).unexpected_keys
            if unexpected:
                raise RuntimeError(f"checkpoint {input_dir} does not fit this model ({unexpected[0]} ...)")

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


def find_checkpoint(cfg: Config) -> str:
    """The folder --resume names ('latest' = the newest complete one in output_dir/checkpoints), or exit."""
    if cfg.resume != "latest":
        path = cfg.resume
    else:
        root = os.path.join(cfg.output_dir, "checkpoints")
        done = sorted(d for d in os.listdir(root) if d.startswith("iter-") and not d.endswith(".tmp")) \
            if os.path.isdir(root) else []
        if not done:
            sys.exit(f"error: --resume latest found no checkpoint in {root}; train first or pass a folder")
        path = os.path.join(root, done[-1])
    if not os.path.isfile(os.path.join(path, "progress.json")):
        sys.exit(f"error: '{path}' is not a training checkpoint (no progress.json); pass a folder "
                 f"output_dir/checkpoints/iter-NNNNNN written by train.py")
    if cfg.ema_decay > 0 and not os.path.isfile(os.path.join(path, "ema.safetensors")):
        sys.exit(f"error: '{path}' has no ema.safetensors (trained with EMA off, or by an older train.py); "
                 f"resume with the --ema-decay it was trained with")
    return path


def save_checkpoint(accelerator, transformer, ema: EMA | None, progress: Progress, cfg: Config) -> str:
    """The whole training state plus diffusers-format weights, written to a temp folder and renamed at the end,
    so that an interrupted save never leaves a checkpoint that looks complete."""
    final = os.path.join(cfg.output_dir, "checkpoints", f"iter-{progress.iteration:06d}")
    tmp = final + ".tmp"
    accelerator.save_state(tmp)
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(transformer)
        save_weights(model, cfg, os.path.join(tmp, "lora"))
        if ema is not None:
            ema.swap()
            save_weights(model, cfg, os.path.join(tmp, "lora_ema"))
            ema.swap()
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(cfg), f, indent=1)
        if ema is not None:
            ema.save(os.path.join(tmp, "ema.safetensors"))
        with open(os.path.join(tmp, "progress.json"), "w") as f:
            json.dump(dataclasses.asdict(progress), f)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()
    return final


def shipped_eval_before(cfg: Config) -> dict[str, torch.Tensor] | None:
    """The base model's held-out values shipped beside it (toyworld.HELDOUT_EVAL, written by `python toyworld.py
    pretrain`), when this run's evaluation settings are exactly the ones they were computed with; else None.
    A run from iteration 0 starts from the base model (LoRA's B = 0), so its "before" evaluation IS these values."""
    path = os.path.join(cfg.model, toyworld.HELDOUT_EVAL)
    if not os.path.isfile(path):
        return None
    saved = json.load(open(path))
    if any(getattr(cfg, k) != v for k, v in saved["settings"].items()):
        return None
    return {k: torch.tensor(v) for k, v in saved["per_image"].items()}  # {metric: (M,)}


def draw_prompts(num_prompts: int, B: int, seed: int, iteration: int) -> torch.Tensor:
    """B prompt indices for this iteration, the same on every process (without replacement when possible)."""
    g = torch.Generator().manual_seed(S.member_seed(seed, iteration, -1, 0))
    if B <= num_prompts:
        return torch.randperm(num_prompts, generator=g)[:B]  # (B,)
    return torch.randint(num_prompts, (B,), generator=g)  # (B,)


def spread_kept(order: torch.Tensor, keep: torch.Tensor, batch: int) -> torch.Tensor:
    """`order` (n,) rearranged so that the kept rows are spread evenly over its micro-batches of `batch` rows.

    Flow-GRPO re-batches the kept samples into equal micro-batches; masking instead (every process must keep the
    same number of backward passes for DDP) would leave it to chance how many counted rows a micro-batch has,
    i.e. how much each of them weighs. Micro-batch m takes the next floor or ceil(K / M) kept rows (K kept, M
    micro-batches) in `order`'s order, then dropped rows fill it up; with every row kept, `order` is unchanged.
    """
    M = order.numel() // batch
    kept, dropped = order[keep[order]], order[~keep[order]]  # (K,), (n - K,) both in `order`'s order
    parts, k, d = [], 0, 0
    for m in range(M):
        size = kept.numel() // M + (m < kept.numel() % M)
        parts += [kept[k:k + size], dropped[d:d + batch - size]]
        k, d = k + size, d + batch - size
    return torch.cat(parts)  # (n,)


def score(pipe, latents: torch.Tensor, prompts: list[str], metadata: list[dict], reward_fn, batch: int):
    """Decode and score latents (M, C, h, w) in chunks: total (M,) and components {name: (M,)}."""
    totals, parts = [], {}
    for start in range(0, latents.shape[0], batch):
        sl = slice(start, start + batch)
        images = S.decode(pipe, latents[sl])  # (m, 3, H', W') in [0, 1]
        total, comps = reward_fn(images, prompts[sl], metadata[sl])
        totals.append(total.float().cpu())
        for k, v in comps.items():
            parts.setdefault(k, []).append(v.float().cpu())
    return torch.cat(totals), {k: torch.cat(v) for k, v in parts.items()}  # (M,), {name: (M,)}


def assign_credit(accelerator, R_mine: torch.Tensor, mine: torch.Tensor, cfg: Config):
    """Gather every process's completion rewards, then per-step rewards and advantages for whole groups.

    R_mine (n, W+1) (Flow-GRPO: (n, 1), R_sde only) holds the rewards of this process's trajectories `mine` (n,).
    Every process computes the same (N, W) tensors from the same gathered rewards, so no broadcast is needed, and
    a group's members may sit on any processes. Returns R_all (N, W+1 or 1), step rewards (N, W), the kept
    turning points (N, W) and this process's advantages (n, W).
    """
    N, W = cfg.prompts_per_iter * cfg.group_size, cfg.window
    device = R_mine.device
    R_all = torch.empty(N, R_mine.shape[1], device=device)  # (N, W+1) or (N, 1)
    # rows go back to trajectory order j, so that trajectory j is member j % G of group j // G
    R_all[accelerator.gather(mine.to(device))] = accelerator.gather(R_mine)
    R_all = R_all.cpu()
    group = torch.arange(N) // cfg.group_size  # (N,) prompt group of every trajectory
    if cfg.algo == "flow-grpo":
        step_r = R_all[:, -1:].expand(N, W)  # (N, W) the outcome reward on every step
        kept = torch.zeros(N, W, dtype=torch.bool)  # (N, W)
        adv = grpo.flow_grpo_advantages(R_all[:, -1], group, W, clip=cfg.adv_clip)  # (N, W)
    else:
        step_r, kept = tp.step_rewards(R_all, group, cfg.algo, cfg.tp_rule)  # (N, W), (N, W)
        adv = grpo.per_timestep_advantages(step_r, group, clip=cfg.adv_clip)  # (N, W)
    return R_all, step_r, kept, adv[mine].to(device)  # adv (n, W)


def mean_over_processes(accelerator, sums: dict[str, float]) -> dict[str, float]:
    """{name: sum of value x rows, 'rows': rows} from every process -> {name: mean per row} over all processes."""
    keys = sorted(sums)
    total = accelerator.reduce(torch.tensor([sums[k] for k in keys], dtype=torch.float64,
                                            device=accelerator.device), "sum").tolist()
    rows = max(total[keys.index("rows")], 1.0) if keys else 1.0
    return {k: v / rows for k, v in zip(keys, total) if k != "rows"}


def max_over_processes(accelerator, value: float) -> float:
    return float(accelerator.gather(torch.tensor([value], device=accelerator.device)).max())


def params_checksum(params: list[torch.Tensor]) -> float:
    """A cheap fingerprint of the trainable weights, to check that every process holds the same model."""
    return float(sum((p.detach().double() * (i + 1)).sum() for i, p in enumerate(params)))


# ================================================================================================================
# The algorithm
# ================================================================================================================


def main(cfg: Config) -> dict:
    from accelerate import Accelerator, PartialState
    from accelerate.utils import parse_flag_from_env, set_seed

    started = time.perf_counter()
    import evaluate
    import rewards

    # ------------------------------------------------------------------------------------------------------------
    # 1. Set-up: processes, layout of the B x G trajectories, model + LoRA, optimizer, rewards, prompts
    # ------------------------------------------------------------------------------------------------------------
    # the process count is needed before the Accelerator (its accumulation steps depend on it); a CPU launch
    # must say cpu=True here too, or this first PartialState would fix the run to a single process
    P = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU")).num_processes
    N = cfg.prompts_per_iter * cfg.group_size  # trajectories per iteration, all processes
    n = N // P  # this process's trajectories
    rows_per_update = n // cfg.updates_per_iter
    layout = (N % P, n % cfg.updates_per_iter, rows_per_update % cfg.train_batch)
    if any(layout):
        sys.exit(f"error: B*G = {N} trajectories must split evenly over {P} processes, then into "
                 f"--updates-per-iter {cfg.updates_per_iter} x micro-batches of --train-batch {cfg.train_batch}; "
                 f"change --prompts-per-iter, --group-size or --train-batch")
    micro_per_update = rows_per_update // cfg.train_batch
    accelerator = Accelerator(mixed_precision=cfg.mixed_precision,
                              gradient_accumulation_steps=micro_per_update * cfg.window,
                              log_with=None if cfg.report_to == "none" else cfg.report_to,
                              project_dir=cfg.output_dir)
    if accelerator.state.deepspeed_plugin is not None:  # no dataloader: DeepSpeed cannot infer the micro-batch
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = cfg.train_batch
    set_seed(cfg.seed)  # only LoRA's initial weights use the global RNG; every trajectory has its own generator
    rank, main_proc = accelerator.process_index, accelerator.is_main_process
    resume_from = find_checkpoint(cfg) if cfg.resume else ""
    try:
        train_prompts, train_meta = load_prompt_set(cfg.prompts)
        eval_prompts, eval_meta = load_prompt_set(cfg.eval_prompts)
        # DEVIATION: the demo code keeps the transformer's weights in float32 and computes under fp16 autocast
        # (accelerate's prepared forward); we store the frozen base in the autocast dtype (bf16 by default), because
        # that halves the weights' memory and bf16 cannot overflow where fp16 can. The VAE decodes in float32 and
        # the timestep enters the transformer in float32 in both (sampler.load_pipeline, sampler.velocity).
        weight_dtype = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.mixed_precision]
        pipe = S.load_pipeline(cfg.model, weight_dtype, accelerator.device)
        reward_fn = rewards.load_rewards(parse_weights(cfg.rewards), accelerator.device,
                                       batch_size=cfg.reward_batch)
    except (S.ModelLoadError, rewards.RewardLoadError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    # the KL's reference policy: LoRA switches its adapter off; full fine-tuning keeps a frozen copy
    ref_model = copy.deepcopy(pipe.transformer) if cfg.lora_rank == 0 and cfg.beta > 0 else None
    transformer = add_lora(pipe.transformer, cfg)
    if cfg.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  weight_decay=cfg.weight_decay, eps=cfg.adam_eps)
    ema = EMA(params, cfg.ema_decay, cfg.ema_every) if cfg.ema_decay > 0 else None
    progress = Progress()
    _trainable_only_hooks(accelerator)
    transformer, optimizer = accelerator.prepare(transformer, optimizer)
    model = accelerator.unwrap_model(transformer)  # sampling and the reference pass need no DDP sync
    reference = (lambda: reference_policy(model)) if ref_model is None else (lambda: contextlib.nullcontext(ref_model))
    if resume_from:
        # accelerate's state (trainable weights as safetensors; optimizer, RNG states as pickles), then ours:
        # progress.json and ema.safetensors, not accelerate's pickled custom state
        accelerator.load_state(resume_from)
        progress.iteration = json.load(open(os.path.join(resume_from, "progress.json")))["iteration"]
        if ema is not None:
            try:
                ema.load(os.path.join(resume_from, "ema.safetensors"))
            except ValueError as e:
                sys.exit(f"error: {e}")
        accelerator.print(f"resumed from {resume_from} at iteration {progress.iteration}")
    if accelerator.is_main_process:
        os.makedirs(cfg.output_dir, exist_ok=True)
    if cfg.report_to != "none":
        accelerator.init_trackers("tp-grpo", config={k: v for k, v in dataclasses.asdict(cfg).items()})

    shape = S.latent_shape(pipe, cfg.resolution)
    sigmas, timesteps = S.sigma_grid(pipe.scheduler, cfg.steps, shape)  # (T+1,), (T,); FLUX's shift needs the shape
    mine = torch.arange(rank, N, P)  # (n,) this process's trajectory ids j; prompt slot j // G, member j % G
    group = torch.arange(N) // cfg.group_size  # (N,) prompt group of every trajectory (for logging)
    W = cfg.window
    complete = cfg.algo != "flow-grpo"  # Flow-GRPO only needs the final image
    history_path = os.path.join(cfg.output_dir, "metrics.jsonl")

    def run_eval(tag: str, shipped: dict | None = None) -> dict:
        """Evaluate the (EMA) policy on the held-out set; `shipped`: known values of every image, of which only
        the grid's first images are recomputed (and must agree, else the whole set is evaluated)."""
        if ema is not None:
            ema.swap()  # the EMA weights are the ones evaluated (docs/method.md, 'SD3.5-Medium hyperparameters')
        for samples in ([GRID_IMAGES] if shipped else []) + [cfg.eval_samples]:
            with accelerator.autocast():
                result = evaluate.sample_and_score(pipe, eval_prompts, eval_meta, reward_fn, samples,
                                                   cfg.eval_steps, cfg.eval_guidance, cfg.resolution,
                                                   cfg.max_sequence_length, cfg.reward_batch, accelerator)
            if shipped and torch.allclose(result["values"]["reward"], shipped["reward"][:samples], atol=1e-5):
                result |= {"values": shipped, "summary": evaluate.summarize(shipped)}
                accelerator.print(f"eval {tag}: the checkpoint's shipped values ({toyworld.HELDOUT_EVAL}; its first "
                                  f"{samples} images recomputed and equal)")
                break
            if shipped:
                accelerator.print(f"eval {tag}: {toyworld.HELDOUT_EVAL} disagrees with a fresh evaluation of its "
                                  f"first {samples} images on this machine; evaluating all {cfg.eval_samples}")
                shipped = None
        if ema is not None:
            ema.swap()
        summary = {f"eval/{k}": v for k, v in result["summary"].items()}
        values[tag] = result["values"]
        if "before" in values and tag != "before":  # the same images as before training: a paired comparison
            change, change_se = evaluate.paired_change(values["before"]["reward"], result["values"]["reward"])
            summary.update({"eval/change": change, "eval/change_se": change_se})
        if main_proc:
            grid = evaluate.save_grid(result["images"][:GRID_IMAGES],
                                      os.path.join(cfg.output_dir, f"samples_{tag}.png"),
                                      captions=evaluate.captions(eval_prompts, result["index"][:GRID_IMAGES],
                                                                 result["values"]["reward"]))
            for tracker in accelerator.trackers:  # the image grid next to the curves
                if tracker.name == "tensorboard":
                    tracker.log_images({"eval/samples": grid[None]}, progress.iteration, dataformats="NHWC")
                elif tracker.name == "wandb":
                    tracker.log_images({"eval/samples": [grid]}, progress.iteration)
            with open(os.path.join(cfg.output_dir, f"eval_{tag}.json"), "w") as f:
                json.dump({"iteration": progress.iteration, **summary,
                           "per_image": evaluate.per_image(result["values"])}, f, indent=1)
        return summary

    values = {}  # per-image evaluation values by tag, for the paired change
    evals = {"before": run_eval("before", shipped_eval_before(cfg))} if progress.iteration == 0 else {}
    if main_proc and evals:
        accelerator.print("eval before: " + evaluate.format_summary(evals["before"]))
    if main_proc and progress.iteration == 0 and os.path.exists(history_path):
        os.remove(history_path)

    from tqdm.auto import tqdm
    bar = tqdm(range(progress.iteration, cfg.iterations), disable=not main_proc, desc="iterations")
    for it in bar:
        timer = {"sample": 0.0, "reward": 0.0, "train": 0.0}
        # --------------------------------------------------------------------------------------------------------
        # 2. Sampling: this process's share of the B x G trajectories, stochastic only in the SDE window
        # --------------------------------------------------------------------------------------------------------
        start = time.perf_counter()
        slots = draw_prompts(len(train_prompts), cfg.prompts_per_iter, cfg.seed, it)  # (B,) prompt indices
        w0 = cfg.window_start
        if w0 < 0:  # one random window per iteration, the same for every member of every group (docs/method.md,
            # 'Rollout with an SDE window')
            g = torch.Generator().manual_seed(S.member_seed(cfg.seed, it, -3, 0))
            w0 = int(torch.randint(cfg.steps - W + 1, (1,), generator=g))
        my_prompts = [train_prompts[slots[j // cfg.group_size]] for j in mine.tolist()]
        my_meta = [train_meta[slots[j // cfg.group_size]] for j in mine.tolist()]
        batches, evals_count = [], 0
        model.eval()
        for b0 in range(0, n, cfg.sample_batch):
            ids = mine[b0:b0 + cfg.sample_batch]  # (b,) trajectory ids
            cond = S.encode_prompts(pipe, my_prompts[b0:b0 + cfg.sample_batch], cfg.guidance,
                                    cfg.max_sequence_length)
            gens = S.make_generators([S.member_seed(cfg.seed, it, j // cfg.group_size, j % cfg.group_size)
                                      for j in ids.tolist()])
            x_T = S.draw_noise(gens, shape, accelerator.device)  # (b, C, h, w)
            with accelerator.autocast():  # bf16 base weights with float32 LoRA weights
                ro = S.rollout(model, cond, x_T, gens, sigmas, timesteps, w0, W, cfg.noise_level, cfg.sampler,
                               cfg.guidance, complete=complete, chunk_size=cfg.chunk_size or None)
            evals_count += ro.counter.nfe
            batches.append((ro, cond))
        timer["sample"] = time.perf_counter() - start

        # --------------------------------------------------------------------------------------------------------
        # 3. Rewards: R_k = R(ODE-complete(s_k)) for k = 0..W (column W = R_sde), or R_sde alone for Flow-GRPO
        # --------------------------------------------------------------------------------------------------------
        start = time.perf_counter()
        R_mine, comps_final = [], {}
        for bi, (ro, _) in enumerate(batches):
            b0 = bi * cfg.sample_batch
            m = ro.final.shape[0]
            if complete:
                lat = ro.completions.flatten(0, 1)  # (b*(W+1), C, h, w)
                reps = W + 1
            else:
                lat, reps = ro.final, 1  # (b, C, h, w)
            prm = [p for p in my_prompts[b0:b0 + m] for _ in range(reps)]
            meta = [d for d in my_meta[b0:b0 + m] for _ in range(reps)]
            total, comps = score(pipe, lat, prm, meta, reward_fn, cfg.reward_batch)
            R_mine.append(total.reshape(m, reps))  # (b, W+1) or (b, 1)
            for k, v in comps.items():
                comps_final.setdefault(k, []).append(v.reshape(m, reps)[:, -1])
        R_mine = torch.cat(R_mine).to(accelerator.device)  # (n, W+1) or (n, 1)
        comps_final = {k: accelerator.gather(torch.cat(v).to(accelerator.device)).mean().item()
                       for k, v in comps_final.items()}
        evals_total = int(accelerator.gather(torch.tensor([evals_count], device=accelerator.device)).sum())
        timer["reward"] = time.perf_counter() - start

        # --------------------------------------------------------------------------------------------------------
        # 4. Credit assignment: per-step rewards (Sec. 4) and per-timestep group-normalized advantages
        # --------------------------------------------------------------------------------------------------------
        R_all, step_r, kept, adv_mine = assign_credit(accelerator, R_mine, mine, cfg)

        # --------------------------------------------------------------------------------------------------------
        # 5. Policy update on the window steps: clipped surrogate + beta KL (docs/method.md, 'The clipped loss'),
        #    accumulated over W steps
        #    and micro-batches, `updates_per_iter` optimizer steps
        # --------------------------------------------------------------------------------------------------------
        start = time.perf_counter()
        model.train()
        states = torch.cat([ro.states for ro, _ in batches])  # (n, W+1, C, h, w)
        logp_old = torch.cat([ro.log_probs for ro, _ in batches])  # (n, W)
        cond_all = S.Cond.cat([c for _, c in batches])  # n rows
        g = torch.Generator().manual_seed(S.member_seed(cfg.seed, it, -2, rank))
        order = torch.randperm(n, generator=g)  # (n,) which rows go into which update
        # Flow-GRPO's filter: a trajectory whose advantage is 0 at every window step has no policy gradient; left in,
        # it would only dilute its micro-batch's mean (and add its KL term), so it is left out of the loss.
        zero_adv = (adv_mine == 0).all(1).cpu()  # (n,)
        # DEVIATION: Flow-GRPO drops the rows and re-batches the rest (padding the count to a multiple of its
        # micro-batch count with dropped rows, which then add their KL); we keep the layout and mask them, because
        # every process must run the same number of backward passes (DDP), so dropped rows still cost compute.
        mask = ~zero_adv if cfg.drop_zero_adv else None  # (n,) rows that count, or None: all
        if mask is not None:
            order = spread_kept(order, mask, cfg.train_batch)
        stats_sum, grad_norms = {}, []
        first, first_dev = {}, 0.0  # the first micro-batch's statistics: before any optimizer step, rho = 1
        for mb, rows in enumerate(order.split(cfg.train_batch)):  # an update = micro_per_update micro-batches x W
            counted = rows.numel() if mask is None else int(mask[rows].sum())
            for k in range(W):
                i = w0 + k  # grid index of window step k+1: s_k -> s_{k+1}
                x, x_next = states[rows, k], states[rows, k + 1]  # (b, C, h, w) each
                c = cond_all.rows(rows.to(accelerator.device))
                t = timesteps[i].expand(rows.numel())  # (b,)
                with accelerator.accumulate(transformer):
                    loss, stats, log_prob = window_step_loss(
                        transformer, reference, x, x_next, t, c, sigmas[i], sigmas[i + 1], logp_old[rows, k],
                        adv_mine[rows, k], cfg, None if mask is None else mask[rows].to(accelerator.device),
                        accelerator.autocast)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        norm = accelerator.clip_grad_norm_(params, cfg.max_grad_norm)  # DeepSpeed may return None
                        grad_norms.extend([] if norm is None else [float(norm)])
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if accelerator.sync_gradients and ema is not None:
                        ema.step()
                # statistics weighted by counted rows: the means over every counted (row, step) of the iteration
                for into in (stats_sum, first) if mb == 0 else (stats_sum,):
                    for key, val in {**stats, "loss": loss.detach(), "rows": 1.0}.items():
                        into[key] = into.get(key, 0.0) + float(val) * counted
                if mb == 0:  # max |rho - 1| over all its rows (counted or not): the on-policy check of the numerics
                    rho = torch.exp(log_prob.detach() - logp_old[rows, k])  # (b,)
                    first_dev = max(first_dev, float((rho - 1).abs().max()))
        timer["train"] = time.perf_counter() - start
        progress.iteration = it + 1
        del batches, states

        # --------------------------------------------------------------------------------------------------------
        # 6. Logging (main process), evaluation, checkpoints
        # --------------------------------------------------------------------------------------------------------
        r_sde = R_all[:, -1]  # (N,)
        train_stats = mean_over_processes(accelerator, stats_sum)
        train_stats.update({f"first_{k}": v for k, v in mean_over_processes(accelerator, first).items()})
        train_stats["first_ratio_dev"] = max_over_processes(accelerator, first_dev)
        train_stats["zero_adv_frac"] = float(accelerator.reduce(zero_adv.sum().to(accelerator.device), "sum")) / N
        log = {"reward/mean": r_sde.mean().item(), "reward/std": r_sde.std(unbiased=False).item(),
               "reward/zero_std_groups": grpo.zero_std_fraction(r_sde, group).item(),
               "train/grad_norm": sum(grad_norms) / max(len(grad_norms), 1), "train/lr": cfg.lr,
               "cost/transformer_evals": evals_total, "cost/evals_per_trajectory": evals_total / N,
               **{f"train/{k}": v for k, v in train_stats.items()},
               **{f"reward/{k}": v for k, v in comps_final.items()},
               **{f"time/{k}_s": v for k, v in timer.items()}}
        if complete:
            d = tp.incremental_rewards(R_all)  # (N, W)
            detected = tp.detect_turning_points(R_all, cfg.tp_rule)  # (N, W) before balancing
            log["reward/R0_mean"] = R_all[:, 0].mean().item()
            for k in range(W):
                log[f"steps/d_mean_{k + 1}"] = d[:, k].mean().item()
                log[f"steps/d_abs_{k + 1}"] = d[:, k].abs().mean().item()
                log[f"steps/tp_rate_{k + 1}"] = detected[:, k].float().mean().item()
                log[f"steps/tp_kept_{k + 1}"] = kept[:, k].float().mean().item()
            log["steps/tp_rate"] = detected.float().mean().item()
            log["steps/tp_kept"] = kept.float().mean().item()
            for rule in tp.RULES:  # both rules' rates, whichever one trains: how often turning points happen
                log[f"steps/tp_rate_{rule}"] = tp.detect_turning_points(R_all, rule).float().mean().item()
        if cfg.eval_every and progress.iteration % cfg.eval_every == 0 and progress.iteration < cfg.iterations:
            log.update(run_eval(f"iter{progress.iteration:06d}"))
        if progress.iteration == cfg.iterations:
            evals["after"] = run_eval("after")
            log.update(evals["after"])
        log["time/elapsed_s"] = time.perf_counter() - started  # wall time of this call so far, evaluations included
        accelerator.log(log, step=progress.iteration)
        if main_proc:
            bar.set_postfix(reward=f"{log['reward/mean']:.3f}", loss=f"{train_stats['loss']:.3g}")
            with open(history_path, "a") as f:
                f.write(json.dumps({"iteration": progress.iteration, **log}) + "\n")
        if (cfg.save_every and progress.iteration % cfg.save_every == 0) or progress.iteration == cfg.iterations:
            save_checkpoint(accelerator, transformer, ema, progress, cfg)

    # DDP keeps the processes' weights identical by construction; a fingerprint per process proves it
    sums = accelerator.gather(torch.tensor([params_checksum(params)], device=accelerator.device)).tolist()
    if main_proc:
        evaluate.plot_history(history_path, os.path.join(cfg.output_dir, "reward_curve.png"), evals)
        for tag, summary in evals.items():
            accelerator.print(f"eval {tag}: " + evaluate.format_summary(summary))
        if "eval/change" in evals.get("after", {}):
            change, se = evals["after"]["eval/change"], evals["after"]["eval/change_se"]
            accelerator.print(f"held-out change {change:+.4f} +- {se:.4f} (paired SE over {cfg.eval_samples} "
                              f"images) = {change / max(se, 1e-12):+.1f} SE")
        with open(os.path.join(cfg.output_dir, "process_checksums.json"), "w") as f:
            json.dump(sums, f)
    # every process reaches here before any tears its gloo/NCCL group down (a lone destroy can hang or abort)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return {"evals": evals, "transformer": model, "checksums": sums}


if __name__ == "__main__":
    main(parse_config())
