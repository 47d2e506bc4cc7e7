"""The run's configuration: one frozen dataclass whose fields name the paper's symbols, one preset per task, the
command line, reward-weight strings and prompt sets.

Every field of Config is a flag of train.py (`python train.py --help` lists them with their defaults); `--task`
picks a preset (PRESETS) and the other flags override single fields. The SD3.5-M presets are the demo code's
settings (docs/method.md, 'SD3.5-Medium hyperparameters'); the tiny preset is the toy world (toyworld.py).

  cfg = config.parse_config(["--task", "tiny", "--iterations", "5"])
  prompts, metadata = config.load_prompt_set(cfg.prompts)

Used by train.py, evaluate.py and bench.py; tested through tests/test_train.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import models
import prompt_sets
import sampler as S
import toyworld
import turning_points as tp


# TP-GRPO and its incremental ablation take step rewards from completions (turning_points.CREDITS); Flow-GRPO
# takes the outcome reward (Config.completes)
ALGOS = ("tp-grpo", "flow-grpo", "incremental")


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Config:
    # what to train: the task's preset, the model, the algorithm and its reward
    task: str = _f("pickscore", "preset: pickscore | ocr | geneval (SD3.5-M, docs/method.md) | pickscore-flux | "
                                "geneval-flux (FLUX.1-dev) | tiny (CPU toy world); drawbench | drawbench-flux "
                                "are evaluate.py's general-quality table only")
    model: str = _f(models.SD35_MEDIUM, "SD3 or FLUX pipeline: hub id, local folder, 'tiny', 'tiny-flux', "
                                        "'random-sd35m' or 'random-flux-dev' (SD3.5-M's, FLUX.1-dev's shapes; all "
                                        "random weights built in code, no download)")
    algo: str = _f("tp-grpo", "tp-grpo | flow-grpo (outcome reward on every step) | incremental (r_k = d_k)")
    tp_rule: str = _f("strict", "turning-point rule: strict (Def. 5.1, 'w/ constraint') | base (Def. 4.1)")
    rewards: str = _f("pickscore:1", "reward models with weights, 'name:w,name:w' (rewards.py)")
    prompts: str = _f("dataset/pickscore_sfw/train.txt", "training prompts: an official set's name (dataset/..., "
                                                         "fetched on first use: prompt_sets.py), a .txt (one a line) "
                                                         "or GenEval .jsonl, or toy:train / toy:heldout")
    eval_prompts: str = _f("dataset/pickscore_sfw/test.txt", "evaluation prompts (same forms)")
    # sampling (Sec. 3): the grid and the guidance, in training and at evaluation
    resolution: int = _f(512, "image side in pixels")
    steps: int = _f(10, "T, sampling steps during training")
    eval_steps: int = _f(40, "sampling steps at evaluation")
    guidance: float = _f(4.5, "w, classifier-free guidance scale in training (<= 1: no CFG)")
    eval_guidance: float = _f(4.5, "w at evaluation")
    # the SDE window (docs/method.md, 'Rollout with an SDE window')
    sampler: str = _f("cps", "stochastic step: cps (coefficients-preserving) | sde (Flow-GRPO's SDE), docs/method.md")
    completion: str = _f("ode", "how R_k judges a window state s_k: ode (its ODE completion on the whole remaining "
                                "grid, the paper's) | ode:K (at most K Euler steps on a sub-grid) | x0 (= ode:1, "
                                "x0_hat = s_k - sigma_k v(s_k), no extra transformer call) | mc:M (the mean reward of "
                                "M continuations by the training sampler: the stochastic truth, M times the ODE "
                                "judge's cost); docs/method.md, 'Cheaper judges', 'The stochastic truth as a judge'")
    noise_level: float = _f(0.7, "a, the noise level of the stochastic step")
    judge_audit: int = _f(0, "every this many iterations, the judge audit: the judge's R_k of one prompt group against "
                             "the stochastic truth, judge/* metrics (0 = off; audit.py, docs/metrics.md)")
    audit_continuations: int = _f(16, "M, continuations per window state of the audit's truth")
    window: int = _f(9, "W, number of SDE (trained) steps")
    window_start: int = _f(0, "w0, first SDE step; -1 draws it per iteration in [0, T - W]")
    # groups and batches (Algorithm 1)
    group_size: int = _f(24, "G, trajectories per prompt")
    prompts_per_iter: int = _f(48, "B, prompts per iteration over all processes")
    sample_batch: int = _f(9, "trajectories per rollout call on each process")
    train_batch: int = _f(9, "trajectories per training micro-batch on each process")
    updates_per_iter: int = _f(2, "optimizer steps per iteration (the samples are split this many ways)")
    # AdamW
    lr: float = _f(3e-4, "AdamW learning rate")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.999, "AdamW beta2")
    weight_decay: float = _f(1e-4, "AdamW weight decay")
    adam_eps: float = _f(1e-8, "AdamW epsilon")
    # the update (Sec. 5; docs/method.md, 'The clipped loss')
    max_grad_norm: float = _f(1.0, "gradient-norm clip")
    clip_range: float = _f(1e-5, "epsilon, the ratio clip: clip(rho, 1 - eps, 1 + eps)")
    beta: float = _f(1e-4, "beta, the KL weight (0 skips the reference forward pass)")
    adv_clip: float = _f(5.0, "advantages are clipped to [-adv_clip, adv_clip]")
    drop_zero_adv: bool = _f(True, "leave trajectories whose advantage A_{i,k} is 0 at every window step out of "
                                   "the loss's means (as Flow-GRPO's train_sd3.py and the demo code's SD3.5-M and "
                                   "TP-GRPO FLUX scripts; their FLUX baselines keep them)")
    # LoRA and EMA (docs/method.md, 'SD3.5-Medium hyperparameters')
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
    # precision and memory
    mixed_precision: str = _f("bf16", "no | bf16 | fp16 (weights of frozen parts and autocast)")
    gradient_checkpointing: bool = _f(False, "recompute transformer activations in backward (saves memory)")
    max_sequence_length: int = _f(128, "T5 tokens per prompt")
    chunk_size: int = _f(0, "max images per transformer call in completions (0 = no cap)")
    compile: bool = _f(False, "torch.compile the transformer for sampling, completions and evaluation, in calls of "
                              "compile_rows images (a GPU run of hundreds of iterations; docs/gpu.md)")
    compile_rows: int = _f(0, "images per compiled call (0 = one rollout call: sample_batch, x2 with CFG)")
    compile_backend: str = _f("inductor", "torch.compile backend (inductor; eager / aot_eager only trace)")
    reward_batch: int = _f(32, "images per decode/reward call")
    # the run: length, evaluations, checkpoints, seed, outputs
    iterations: int = _f(2000, "training iterations")
    eval_every: int = _f(50, "evaluate every this many iterations (0 = only before and after)")
    eval_samples: int = _f(64, "evaluation images (prompts cycled, seeds fixed)")
    eval_subset: int = _f(0, "at the evaluations on the way (--eval-every) only the first this many of them (0 = "
                             "all): the same images as before training, so the change stays paired")
    eval_seed: int = _f(2_000_003, "evaluation noise: image i starts from the noise seeded (eval_seed, i), the "
                                   "same for every checkpoint (the toy world's validation split has its own)")
    save_every: int = _f(50, "checkpoint every this many iterations (0 = only at the end)")
    seed: int = _f(0, "seed of prompts, noise and shuffling: (seed, iteration, prompt, member)")
    # where things go
    output_dir: str = _f("runs/pickscore", "checkpoints, logs, sample grids")
    resume: str = _f("", "checkpoint folder to continue from ('latest' in output_dir, or output_dir/checkpoints/"
                         "best); the fields that shape the saved state must match it, other changes are printed "
                         "and logged to output_dir/resumes.jsonl (checkpoint.py)")
    report_to: str = _f("tensorboard", "tensorboard | wandb | none")
    # watching a long run (alarms.py; docs/metrics.md, 'Alarms'): the best checkpoint kept, collapse, reward hacking
    # and a degenerate training signal reported as they happen
    keep_best: str = _f("", "keep the policy of the best held-out evaluation so far as output_dir/checkpoints/best, "
                            "by this metric: eval/reward or eval/<name> of a reward in --rewards, a weight-0 gold "
                            "too ('' = off); it is also the metric the collapse alarm watches")
    alarm_se: float = _f(3.0, "a held-out change counts for an alarm beyond this many paired standard errors over "
                              "the evaluation's images: collapse (the watched metric below its best so far), drift "
                              "(the proxy up and a weight-0 gold down since the previous evaluation)")
    alarm_window: int = _f(10, "the training-signal alarms judge the mean of the last this many iterations")
    alarm_zero_std: float = _f(0.5, "alarm when that mean of reward/zero_std_groups (groups without signal) is above "
                                    "this (1 = off)")
    alarm_clip_frac: float = _f(0.49, "alarm when that mean of train/clip_frac is above this (1 = off; it cannot "
                                      "exceed 1 - 1/updates_per_iter: the first update is on-policy)")
    alarm_kl: float = _f(0.0, "alarm when that mean of train/approx_kl (how far an iteration's updates move the "
                              "policy) is above this (0 = off: no GPU run has measured its normal level)")
    stop_on_alarm: bool = _f(False, "end the run cleanly at the first alarm, after an evaluation of that iteration "
                                    "(the best checkpoint kept, a last checkpoint written)")

    @property
    def completes(self) -> bool:
        """TP-GRPO and the incremental ablation score the ODE completion of every window state (R_0 .. R_W) and
        credit each step; Flow-GRPO has only the outcome R_sde, the same reward for every step (docs/method.md,
        'Per-step rewards of the three methods'). The one place that says what Flow-GRPO means."""
        return self.algo != "flow-grpo"


EVAL_SEED = Config.eval_seed  # every task's evaluation noise, never a training trajectory's seed
# the shipped toy checkpoint, found from any working directory (outputs still go under the working directory)
TOY_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_model")
SD35M = dict(model=models.SD35_MEDIUM, resolution=512, steps=10, eval_steps=40, guidance=4.5, eval_guidance=4.5)
PRESETS = {
    "pickscore": dict(SD35M, rewards="pickscore:1", prompts="dataset/pickscore_sfw/train.txt",
                      eval_prompts="dataset/pickscore_sfw/test.txt", output_dir="runs/pickscore"),
    "ocr": dict(SD35M, rewards="ocr:1", prompts="dataset/ocr/train.txt", eval_prompts="dataset/ocr/test.txt",
                output_dir="runs/ocr"),
    "geneval": dict(SD35M, rewards="geneval:1", prompts="dataset/geneval/train_metadata.jsonl",
                    eval_prompts="dataset/geneval/test_metadata.jsonl", output_dir="runs/geneval"),
    # The toy world (toyworld.py): 32 px shapes, a graded colour + count reward, a ~0.6M-parameter pixel-space SD3
    # pretrained partly on captions that misname the colour (it draws the asked one about half the time). Sized for
    # 2 CPU cores: about 3.5 minutes on an idle machine. The judge audit runs every 10 iterations with 8
    # continuations per window state (audit.py; about a tenth of the run's time).
    # T = 6 with a 5-step window from step 0 is the paper's FLUX.1-dev schedule; the held-out evaluation is the
    # one the checkpoint ships values for (toyworld.HELDOUT_SETTINGS: 1024 images, fixed noise). lr and the ratio
    # clip are TP-GRPO's choice on the validation split (`python -m lab.compare report grid`, lab/reports/grid.md)
    "tiny": dict(toyworld.HELDOUT_SETTINGS, model=TOY_MODEL, prompts="toy:train", steps=toyworld.STEPS,
                 guidance=1.0, window=5, group_size=8, prompts_per_iter=4, sample_batch=32, train_batch=16,
                 lr=3e-3, lora_rank=8, lora_alpha=16, mixed_precision="no", reward_batch=64, judge_audit=10,
                 audit_continuations=8,
                 iterations=30, eval_every=0, save_every=0, output_dir="runs/tiny",
                 beta=0.0, clip_range=1e-5, ema_decay=0.0, report_to="tensorboard",
                 # the training-signal alarms above the committed laboratory runs at the preset's lr and clip (the
                 # KL's above all but one of 134; docs/metrics.md, 'Alarms'): the programmatic reward's groups tie
                 # once it is learned, up to 0.525 of them over 10 iterations, hence 0.6 for the zero-std share
                 alarm_zero_std=0.6, alarm_kl=2e-7),
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
# The demo code's FLUX configs with a and beta from its TP-GRPO launch scripts, the basis of the SD3.5-M presets
# too (docs/method.md, 'FLUX.1-dev'): 512 px, T = 6 training / 28 evaluation steps, guidance embedding 3.5 in both
# (no CFG pass), cps with a = 0.7 and the window from step 0; G = 24 over B = 48 prompts with 3 trajectories per GPU
# per micro-batch, 2 updates per iteration; AdamW 3e-4, ratio clip 1e-5, beta = 1e-4, EMA on, bf16; LoRA r = 64,
# alpha = 128. (The demo's config file says a = 0.8 and beta = 0; its launch scripts pass 0.7 and 1e-4.)
FLUX1_DEV = dict(model=models.FLUX_DEV, resolution=512, steps=6, eval_steps=28, guidance=3.5, eval_guidance=3.5,
                 sampler="cps", noise_level=0.7, window_start=0, group_size=24, prompts_per_iter=48, sample_batch=3,
                 train_batch=3, updates_per_iter=2, lr=3e-4, clip_range=1e-5, beta=1e-4, ema_decay=0.9,
                 mixed_precision="bf16", lora_rank=64, lora_alpha=128, lora_targets=FLUX_LORA_TARGETS)
PRESETS.update({
    "pickscore-flux": dict(FLUX1_DEV, window=5, rewards="pickscore:1", prompts="dataset/pickscore_sfw/train.txt",
                           eval_prompts="dataset/pickscore_sfw/test.txt", output_dir="runs/pickscore-flux"),
    # W = T = 6, as the demo's GenEval config: the sixth step ends at sigma = 0 with no noise (std 0), so its KL term
    # is 0 (grpo.kl_to_reference; the demo code would divide by 0) and, its completion being the final image, its
    # TP-GRPO advantage is 0 too (docs/method.md, 'FLUX.1-dev')
    "geneval-flux": dict(FLUX1_DEV, window=6, rewards="geneval:1", prompts="dataset/geneval/train_metadata.jsonl",
                         eval_prompts="dataset/geneval/test_metadata.jsonl", output_dir="runs/geneval-flux"),
})


# ---- DrawBench (Sec. 5): the general-quality table of any trained checkpoint, evaluation only ---------------------
# One image per line of dataset/drawbench/test.txt (DrawBench's 200 prompts, each 5 times, so 5 seeds per prompt),
# sampled with the model's evaluation settings and scored by PickScore (the reward row), the LAION aesthetic
# predictor, ImageReward and UnifiedReward (weights 0: reported, not added). Nothing trains on it (check_config).
DRAWBENCH = dict(rewards="pickscore:1,aesthetic:0,imagereward:0,unifiedreward:0", eval_samples=1000,
                 eval_prompts="dataset/drawbench/test.txt")
EVAL_ONLY = ("drawbench", "drawbench-flux")
PRESETS.update({
    "drawbench": dict(SD35M, **DRAWBENCH, output_dir="runs/drawbench"),
    "drawbench-flux": dict(FLUX1_DEV, **DRAWBENCH, output_dir="runs/drawbench-flux"),
})


def parse_config(argv: list[str] | None = None, description: str = "") -> Config:
    """--task picks a preset; every other flag overrides one field of it (`description` heads --help)."""
    p = argparse.ArgumentParser(description=description or __doc__,
                                usage="%(prog)s [--task TASK] [--FIELD VALUE ...]  (--help lists every field)",
                                epilog="Defaults shown are the SD3.5-M values (docs/method.md, 'SD3.5-Medium "
                                       "hyperparameters'); --task picks a preset that "
                                       "may change some of them (config.PRESETS).",
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


def _at_least(low):
    return (lambda v: v >= low), f">= {low}"


def _above(low):
    return (lambda v: v > low), f"> {low}"


_FRACTION = (lambda v: 0 <= v < 1), "in [0, 1)"
_SHARE = (lambda v: 0 <= v <= 1), "in [0, 1]"
# Every numeric field's range, as (field, (test, the range in words), why): check_config refuses a value outside it
# (or not finite) with one line. The window's fit in the grid and cps's noise level need two fields (below).
RANGES = (
    ("resolution", _above(0), "pixels"),
    ("steps", _at_least(1), ""),
    ("eval_steps", _at_least(1), ""),
    ("guidance", _at_least(0), "<= 1 turns CFG off"),
    ("eval_guidance", _at_least(0), "<= 1 turns CFG off"),
    ("noise_level", _at_least(0), "0 makes every step the deterministic ODE step"),
    ("judge_audit", _at_least(0), "0 = off"),
    ("audit_continuations", _at_least(2), "the truth's standard error needs two"),
    ("window", _at_least(1), "the SDE steps that are trained"),
    ("window_start", _at_least(-1), "a grid index, or -1 to draw it per iteration"),
    ("group_size", _at_least(2), "GRPO's advantage compares a prompt's trajectories with each other"),
    ("prompts_per_iter", _at_least(1), ""),
    ("sample_batch", _at_least(1), ""),
    ("train_batch", _at_least(1), ""),
    ("updates_per_iter", _at_least(1), ""),
    ("lr", _above(0), ""),
    ("adam_beta1", _FRACTION, "AdamW's moment decay"),
    ("adam_beta2", _FRACTION, "AdamW's moment decay"),
    ("weight_decay", _at_least(0), ""),
    ("adam_eps", _above(0), "it keeps AdamW's division finite"),
    ("max_grad_norm", _above(0), ""),
    ("clip_range", _above(0), "the ratio clip's half-width"),
    ("beta", _at_least(0), "0 drops the KL term"),
    ("adv_clip", _above(0), ""),
    ("lora_rank", _at_least(0), "0 = full fine-tuning"),
    ("lora_alpha", _above(0), "LoRA's output is scaled by alpha / r"),
    ("ema_decay", _FRACTION, "0 turns the EMA off"),
    ("ema_every", _at_least(1), ""),
    ("max_sequence_length", _at_least(1), ""),
    ("chunk_size", _at_least(0), "0 = no cap"),
    ("compile_rows", _at_least(0), "0 = one rollout call's images"),
    ("reward_batch", _at_least(1), ""),
    ("iterations", _at_least(1), ""),
    ("eval_every", _at_least(0), "0 = only before and after training"),
    ("eval_samples", _at_least(1), ""),
    ("eval_subset", _at_least(0), "0 = every evaluation image"),
    ("eval_seed", _at_least(0), ""),
    ("save_every", _at_least(0), "0 = only at the end"),
    ("seed", _at_least(0), ""),
    ("alarm_se", _above(0), "paired standard errors"),
    ("alarm_window", _at_least(1), "iterations"),
    ("alarm_zero_std", _SHARE, "1 = off"),
    ("alarm_clip_frac", _SHARE, "1 = off"),
    ("alarm_kl", _at_least(0), "0 = off"),
)


def check_ranges(cfg: Config) -> str:
    """One line naming the first numeric field outside its range (RANGES) and the range, or ''."""
    for name, (ok, bound), why in RANGES:
        value = getattr(cfg, name)
        if not (math.isfinite(value) and ok(value)):
            flag = "--" + name.replace("_", "-")
            return f"{flag} {value} is out of range: it must be {bound}" + (f" ({why})" if why else "")
    if cfg.sampler == "cps" and cfg.noise_level > 1:  # past a = 1 sin(a pi / 2) falls again: a repeats a smaller a
        return (f"--noise-level {cfg.noise_level} is out of range for --sampler cps: it must be in [0, 1] (the "
                f"injected noise is sigma' sin(a pi / 2), all of sigma' at a = 1)")
    return ""


def check_config(cfg: Config) -> str:
    """One line naming what is inconsistent or out of range, or '' (checked before anything is loaded or
    written)."""
    problem = check_ranges(cfg)
    if problem:
        return problem
    if cfg.task in EVAL_ONLY:
        return (f"--task {cfg.task} is an evaluation preset (python evaluate.py --task {cfg.task} --checkpoint ...); "
                f"train with pickscore, ocr, geneval, their -flux forms or tiny")
    if cfg.algo not in ALGOS:
        return f"unknown --algo '{cfg.algo}'; choose one of {', '.join(ALGOS)}"
    if cfg.tp_rule not in tp.RULES:
        return f"unknown --tp-rule '{cfg.tp_rule}'; choose one of {', '.join(tp.RULES)}"
    if cfg.sampler not in S.SAMPLERS:
        return f"unknown --sampler '{cfg.sampler}'; choose one of {', '.join(S.SAMPLERS)}"
    try:
        S.parse_completion(cfg.completion)
    except ValueError as e:
        return f"--completion: {e}"
    if not 1 <= cfg.window <= cfg.steps or cfg.window_start + cfg.window > cfg.steps:
        return f"the SDE window (w0={cfg.window_start}, W={cfg.window}) must fit in T={cfg.steps} steps"
    metrics = heldout_metrics(cfg.rewards)
    if cfg.keep_best and cfg.keep_best not in metrics:
        return (f"--keep-best {cfg.keep_best} is not a held-out metric of this run; name one of "
                f"{', '.join(metrics)} (eval/<name> for each reward of --rewards)")
    own = eval_seed_for(cfg.eval_prompts, cfg.eval_seed)
    if cfg.eval_seed != own:
        return f"--eval-prompts {cfg.eval_prompts} needs --eval-seed {own} (its own noise)"
    return ""


def heldout_metrics(rewards: str) -> list[str]:
    """The held-out metrics --keep-best may name: eval/reward (the weighted total) and eval/<name> of every reward
    of `rewards`, weight 0 included (a malformed `rewards` is reported where the rewards load)."""
    try:
        return ["eval/reward"] + [f"eval/{name}" for name in parse_weights(rewards)]
    except ValueError:
        return ["eval/reward"]


def eval_seed_for(eval_prompts: str, default: int) -> int:
    """The evaluation noise a prompt set is scored on: a toy split's own (toyworld.SHIPPED_EVALS, so that a score
    is comparable with the shipped base values), else `default`."""
    for _, settings in toyworld.SHIPPED_EVALS.values():
        if eval_prompts == settings["eval_prompts"]:
            return settings["eval_seed"]
    return default


def parse_weights(spec: str) -> dict[str, float]:
    """'pickscore:1,ocr:0.5' -> {'pickscore': 1.0, 'ocr': 0.5}."""
    out = {}
    for item in filter(None, spec.split(",")):
        name, _, weight = item.partition(":")
        out[name.strip()] = float(weight or 1)
    return out


def parse_model_paths(spec: str) -> dict[str, str]:
    """'aesthetic=/w/sac.pth,imagereward=/m/IR' -> {'aesthetic': '/w/sac.pth', 'imagereward': '/m/IR'}
    (rewards.load_rewards' model_paths)."""
    out = {}
    for item in filter(None, spec.split(",")):
        key, sep, path = item.partition("=")
        if not sep or not key.strip() or not path.strip():
            raise ValueError(f"model path '{item}' is not key=path (e.g. aesthetic=sac+logos+ava1-l14-linearMSE.pth)")
        out[key.strip()] = path.strip()
    return out


def load_prompt_set(spec: str):
    """(prompts, metadata) from a file, or from the toy world's caption grammar ('toy:train' / 'toy:heldout' /
    'toy:validation')."""
    if spec.startswith("toy:"):
        split = spec.split(":", 1)[1]
        if split == "train":  # every (count, colour, shape) caption; new noise every iteration
            metas = toyworld.all_metadata()
            return [toyworld.caption(m) for m in metas], metas
        prompts, metas, _ = toyworld.dataset(split, 0, toyworld.HELDOUT_SIZE)  # a held-out or validation set
        return prompts, metas
    return load_prompts(spec)


def load_prompts(path):
    """A prompt set: .txt (one prompt a line, metadata {}) or GenEval .jsonl -> (prompts, metadata records). An
    official set's name (`dataset/...`, as the presets write it) is its verified copy in the data folder, fetched
    on first use (prompt_sets.py); any other path is read as it is."""
    path = prompt_sets.local_copy(path) if prompt_sets.is_official(path) else Path(path)
    where = f"the official sets, fetched by these names on first use, are {', '.join(prompt_sets.FILES)}"
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} not found; {where}")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"prompt file {path} is empty; {where}")
    if path.suffix == ".txt":
        return lines, [{} for _ in lines]
    if path.suffix == ".jsonl":
        records = []
        for number, line in enumerate(lines, 1):
            record = json.loads(line)
            if "prompt" not in record:
                raise ValueError(f"{path}, record {number}: no 'prompt' field (expected GenEval metadata lines)")
            records.append(record)
        return [r["prompt"] for r in records], records
    raise ValueError(f"prompt file {path}: unknown suffix '{path.suffix}', expected .txt or .jsonl")
