"""TP-GRPO (and Flow-GRPO, and the incremental-only ablation) for SD3.5-Medium and FLUX.1-dev, with LoRA or full
fine-tuning: Algorithm 1 of arXiv 2602.06422 (docs/method.md, 'Rollout with an SDE window' to 'The clipped loss').

Read it top-down: `main` is the algorithm, then come `setup` and the steps of one iteration in the order they run,
each a function with its paper reference, then logging:

  setup            processes, the B x G layout, the pipeline + LoRA (policy.py), optimizer, EMA, rewards, prompts
  per iteration:
  1. sample        draw B prompts; each process samples its share of the B x G trajectories (a group's members are
                   spread over the processes), stochastic only inside the SDE window, and for TP-GRPO /
                   incremental ODE-completes every window state in the same batched calls (Sec. 4.1; docs/method.md,
                   'The batched wavefront': sampler.wavefront_rollout, the fast path of sampler.rollout);
  2. score         decode and score every completion: R_k = R(ODE-complete(s_k)), R (n, W+1), column W = R_sde
                   (Flow-GRPO: R_sde only);
  3. assign_credit gather R over processes; per-step rewards with turning points (turning_points.step_rewards,
                   Sec. 4) and per-timestep advantages (grpo.py, Sec. 4.3);
  4. update_policy Flow-GRPO's clipped surrogate + KL to the adapter-disabled model on the window steps, gradients
                   accumulated over the W steps and micro-batches of an update, then one optimizer step and the EMA,
                   `updates_per_iter` times;
  5. iteration_log, the judge audit when due (audit.py), the held-out evaluation (evaluate.HeldOut) with the alarms
     and the best checkpoint (alarms.Watch: --keep-best, --stop-on-alarm), save_checkpoint (checkpoint.py).

Run:
  python train.py --task tiny                                # CPU, the toy world (toyworld.py), a few minutes
  accelerate launch train.py --task pickscore                # SD3.5-M, one GPU
  accelerate launch --config_file configs/multi_gpu.yaml train.py --task geneval
  accelerate launch --config_file configs/deepspeed_zero2.yaml train.py --task ocr
  python train.py --help                                     # every field, with its paper symbol (config.py)

Shape legend: B prompts per iteration, G group size, N = B*G trajectories (all processes), n = N / processes
(this process), b a sampling or training micro-batch, T steps, W window steps, C/h/w latent
channels/height/width, H'/W' decoded pixels (docs/method.md, 'Notation').
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import parse_flag_from_env, set_seed
from tqdm.auto import tqdm

import collectives
import config
import evaluate
import grpo
import models
import rewards
import sampler as S
import turning_points as tp
from alarms import Watch
from checkpoint import Progress, find_checkpoint, load_checkpoint, register_trainable_only_hooks, save_checkpoint
from audit import JudgeAudit
from config import Config
from policy import EMA, UpdateStats, WindowStepLoss, add_lora, compiled_policy, reference_policy


# ================================================================================================================
# The state every step shares
# ================================================================================================================


@dataclass
class Run:
    """What `setup` builds once and every step reads: the configuration, the processes, the models."""

    cfg: Config
    accelerator: Accelerator
    pipe: object  # the diffusers pipeline (text encoders, VAE, scheduler); pipe.transformer is `policy`
    # Three handles on the one trained transformer:
    policy: torch.nn.Module  # the transformer with LoRA, unwrapped: the reference pass, evaluation, saving
    sampling_policy: object  # what rollouts and evaluation call: `policy`, or with --compile its compiled form
    ddp_policy: torch.nn.Module  # `policy` as accelerate prepared it (DDP / DeepSpeed): training forward/backward
    step_loss: WindowStepLoss  # the clipped loss of one window step, with the run's sampler, clip, KL weight, reference
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]  # the trainable weights (LoRA)
    ema: EMA | None
    reward_fn: object  # rewards.load_rewards: (images, prompts, metadata) -> (total (M,), {name: (M,)})
    train_set: tuple[list[str], list[dict]]  # (prompts, metadata)
    heldout: evaluate.HeldOut  # heldout(tag, iteration): the held-out evaluation, its summary to log
    audit: JudgeAudit  # audit(it, samples, R_all): the judge against the stochastic truth when due, its metrics
    watch: Watch  # watch.step(run, log, summaries): evaluations, alarms, the best checkpoint (alarms.py)
    sigmas: torch.Tensor  # (T+1,) the sigma grid
    timesteps: torch.Tensor  # (T,) the transformer's timestep inputs
    shape: tuple[int, ...]  # one latent: (C, h, w), or FLUX's packed (h/2 * w/2, 4C)
    N: int  # B*G trajectories per iteration, all processes
    mine: torch.Tensor  # (n,) this process's trajectory ids j; prompt slot j // G, member j % G
    progress: Progress = field(default_factory=Progress)


@dataclass
class Samples:
    """One iteration's trajectories on this process (step 1)."""

    batches: list[tuple[S.Rollout, models.Cond]]  # per sampling micro-batch: the rollout and its prompts' conditioning
    w0: int  # first SDE step of the window this iteration
    prompts: list[str]  # (n,) this process's trajectories' prompts
    metadata: list[dict]  # (n,)
    nfe: int  # transformer evaluations spent on this process (images x steps)


# ================================================================================================================
# The algorithm
# ================================================================================================================


def main(cfg: Config) -> dict:
    """Algorithm 1: set up, evaluate the base model, then per iteration sample, score, assign credit, update the
    policy, log, evaluate and save. Returns {"summaries": {tag: evaluation}, "policy": the trained transformer}."""
    started = time.perf_counter()
    run = setup(cfg)
    acc, main_proc = run.accelerator, run.accelerator.is_main_process
    history_path = os.path.join(cfg.output_dir, "metrics.jsonl")
    summaries = {}  # evaluation summaries by tag ("before", "after")
    if run.progress.iteration == 0:
        summaries["before"] = run.heldout("before", 0)
        acc.print("eval before: " + evaluate.format_summary(summaries["before"]))
        if main_proc and os.path.exists(history_path):
            os.remove(history_path)

    bar = tqdm(range(run.progress.iteration, cfg.iterations), disable=not main_proc, desc="iterations")
    for it in bar:
        t0 = time.perf_counter()
        samples = sample(run, it)  # 1. B x G trajectories, SDE window, completions
        t1 = time.perf_counter()
        R_mine, finals = score(run, samples)  # 2. R (n, W+1): one reward per completion
        nfe = int(collectives.gather(acc, torch.tensor([samples.nfe])).sum())
        t2 = time.perf_counter()
        # 3. per-step rewards with turning points, per-timestep advantages
        R_all, kept, detected, adv = assign_credit(acc, R_mine, run.mine, cfg)
        audited = run.audit(it, samples, R_all)  # every --judge-audit iterations: the judge against the truth
        t3 = time.perf_counter()
        train_stats = update_policy(run, samples, adv, it)  # 4. clipped surrogate + KL, optimizer steps, EMA
        timer = {"sample": t1 - t0, "reward": t2 - t1, "train": time.perf_counter() - t3}
        run.progress.iteration = it + 1
        del samples

        # 5. log, evaluate, save
        log = iteration_log(run, R_all, kept, detected, finals=finals, train_stats=train_stats, nfe=nfe, timer=timer)
        log.update(audited)
        done = run.progress.iteration
        stop = run.watch.step(run, log, summaries)  # the evaluation due, the alarms, the best checkpoint (alarms.py)
        log["time/elapsed_s"] = time.perf_counter() - started  # wall time of this call so far, evaluations included
        acc.log(log, step=run.progress.iteration)
        if main_proc:
            bar.set_postfix(reward=f"{log['reward/mean']:.3f}", loss=f"{log['train/loss']:.3g}")
            with open(history_path, "a") as f:
                f.write(json.dumps({"iteration": done, **log}) + "\n")
        if (cfg.save_every and done % cfg.save_every == 0) or done == cfg.iterations or stop:
            save_checkpoint(acc, run.policy, run.ema, run.progress, cfg, extra={"alarms.json": run.watch.state()})
        if stop:  # --stop-on-alarm: every process decided it from the same values
            break
    finish(run, summaries, history_path)
    return {"summaries": summaries, "policy": run.policy}


# ================================================================================================================
# Set-up
# ================================================================================================================


def setup(cfg: Config) -> Run:
    """Processes, the B x G layout, the pipeline with LoRA, optimizer, EMA, rewards, prompts; resume if asked."""
    # the process count is needed before the Accelerator (its accumulation steps depend on it); a CPU launch
    # must say cpu=True here too, or this first PartialState would fix the run to a single process
    P = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU")).num_processes
    N = cfg.prompts_per_iter * cfg.group_size  # trajectories per iteration, all processes
    n = N // P  # this process's trajectories
    rows_per_update = n // cfg.updates_per_iter
    if N % P or n % cfg.updates_per_iter or rows_per_update % cfg.train_batch:
        sys.exit(f"error: B*G = {N} trajectories must split evenly over {P} processes, then into "
                 f"--updates-per-iter {cfg.updates_per_iter} x micro-batches of --train-batch {cfg.train_batch}; "
                 f"change --prompts-per-iter, --group-size or --train-batch")
    accelerator = Accelerator(mixed_precision=cfg.mixed_precision,
                              gradient_accumulation_steps=rows_per_update // cfg.train_batch * cfg.window,
                              log_with=None if cfg.report_to == "none" else cfg.report_to,
                              project_dir=cfg.output_dir)
    if accelerator.state.deepspeed_plugin is not None:  # three settings of its own (docs/gpu.md, 'DeepSpeed ZeRO-2')
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        ds["train_micro_batch_size_per_gpu"] = cfg.train_batch  # no dataloader: DeepSpeed cannot infer it
        ds["gradient_clipping"] = cfg.max_grad_norm  # it clips in its own step; clip_grad_norm_ reads the norm back
        if accelerator.state.deepspeed_plugin.zero_stage >= 1:  # accumulate in float32, not in the weights' bf16
            ds["data_types"] = {"grad_accum_dtype": "fp32"}
    set_seed(cfg.seed)  # only LoRA's initial weights use the global RNG; every trajectory has its own generator
    resume_from = find_checkpoint(cfg) if cfg.resume else ""
    try:
        train_set, eval_set = config.load_prompt_set(cfg.prompts), config.load_prompt_set(cfg.eval_prompts)
        # DEVIATION: frozen base in the autocast dtype, float32 LoRA under autocast, float32 latents, one timestep
        # dtype in both passes; the demo code runs all in fp16/bf16 under ZeRO-2 (docs/deviations.md, 'Precision').
        weight_dtype = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.mixed_precision]
        pipe = models.load_pipeline(cfg.model, weight_dtype, accelerator.device)
        reward_fn = rewards.load_rewards(config.parse_weights(cfg.rewards), accelerator.device,
                                         batch_size=cfg.reward_batch)
    except (models.ModelLoadError, rewards.RewardLoadError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    # the KL's reference policy: LoRA switches its adapter off; full fine-tuning keeps a frozen copy
    ref_model = copy.deepcopy(pipe.transformer) if cfg.lora_rank == 0 and cfg.beta > 0 else None
    transformer = add_lora(pipe.transformer, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets.split(","))
    if cfg.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  weight_decay=cfg.weight_decay, eps=cfg.adam_eps)
    ema = EMA(params, cfg.ema_decay, cfg.ema_every) if cfg.ema_decay > 0 else None
    register_trainable_only_hooks(accelerator)
    ddp_policy, optimizer = accelerator.prepare(transformer, optimizer)
    # sampling and the reference pass call the transformer itself, without DDP's sync: DDP and DeepSpeed only wrap
    # it (as .module). accelerator.unwrap_model would return it too, but imports deepspeed wherever it is installed,
    # and that import prints an accelerator notice on every CPU run.
    policy = transformer
    reference = (lambda: reference_policy(policy)) if ref_model is None else (lambda: contextlib.nullcontext(ref_model))
    step_loss = WindowStepLoss(reference, sampler=cfg.sampler, noise_level=cfg.noise_level, guidance=cfg.guidance,
                               clip_range=cfg.clip_range, beta=cfg.beta, autocast=accelerator.autocast)
    shape = models.latent_shape(pipe, cfg.resolution)
    # (T+1,), (T,); FLUX's shift depends on the image size, so the grid needs the latent shape
    sigmas, timesteps = models.sigma_grid(pipe.scheduler, cfg.steps, shape)
    sampling_policy = compiled_policy(policy, cfg) if cfg.compile else policy  # --compile: for sampling only
    mine = torch.arange(accelerator.process_index, N, P)  # (n,)
    heldout = evaluate.HeldOut(cfg=cfg, accelerator=accelerator, pipe=pipe, reward_fn=reward_fn, prompts=eval_set[0],
                               metadata=eval_set[1], transformer=sampling_policy, ema=ema)
    audit = JudgeAudit(cfg=cfg, accelerator=accelerator, pipe=pipe, reward_fn=reward_fn, transformer=sampling_policy,
                       mine=mine)
    run = Run(cfg=cfg, accelerator=accelerator, pipe=pipe, policy=policy, sampling_policy=sampling_policy,
              ddp_policy=ddp_policy, step_loss=step_loss, optimizer=optimizer, params=params, ema=ema,
              reward_fn=reward_fn, train_set=train_set, heldout=heldout, audit=audit, sigmas=sigmas,
              timesteps=timesteps, shape=shape, N=N, mine=mine, watch=Watch(cfg, resume_from))
    if resume_from:
        load_checkpoint(accelerator, ema, run.progress, resume_from, cfg, optimizer=optimizer)
    if accelerator.is_main_process:
        os.makedirs(cfg.output_dir, exist_ok=True)
    if cfg.report_to != "none":
        accelerator.init_trackers("tp-grpo", config=dataclasses.asdict(cfg))
    return run


# ================================================================================================================
# The steps of one iteration (Algorithm 1)
# ================================================================================================================


def sample(run: Run, it: int) -> Samples:
    """Step 1: this process's share of the B x G trajectories, stochastic only in the SDE window (docs/method.md,
    'Rollout with an SDE window'); TP-GRPO and the incremental ablation also ODE-complete every window state in the
    same calls (Sec. 4.1; 'The batched wavefront'). Every member has its own generator, seeded from (seed,
    iteration, prompt, member), so any trajectory can be replayed alone."""
    cfg, G, W = run.cfg, run.cfg.group_size, run.cfg.window
    train_prompts, train_meta = run.train_set
    slots = S.draw_prompts(len(train_prompts), cfg.prompts_per_iter, cfg.seed, it)  # (B,) prompt indices
    w0 = cfg.window_start
    if w0 < 0:  # one random window per iteration, the same for every member of every group (docs/method.md,
        # 'Rollout with an SDE window')
        g = torch.Generator().manual_seed(S.stream_seed(cfg.seed, it, "window"))
        w0 = int(torch.randint(cfg.steps - W + 1, (1,), generator=g))
    prompts = [train_prompts[slots[j // G]] for j in run.mine.tolist()]
    metadata = [train_meta[slots[j // G]] for j in run.mine.tolist()]
    judge = S.parse_completion(cfg.completion)  # how R_k judges a window state (docs/method.md, 'Cheaper judges')
    batches, nfe = [], 0
    run.policy.eval()
    for b0 in range(0, len(prompts), cfg.sample_batch):
        ids = run.mine[b0:b0 + cfg.sample_batch]  # (b,) trajectory ids
        cond = models.encode_prompts(run.pipe, prompts[b0:b0 + cfg.sample_batch], cfg.guidance, cfg.max_sequence_length)
        slots_members = [(j // G, j % G) for j in ids.tolist()]  # (prompt slot, member) of each trajectory
        gens = S.make_generators([S.member_seed(cfg.seed, it, p, q) for p, q in slots_members])
        x_T = S.draw_noise(gens, run.shape, run.accelerator.device)  # (b, C, h, w)
        with run.accelerator.autocast():  # bf16 base, float32 LoRA (under DeepSpeed: no autocast, all bf16)
            ro = S.wavefront_rollout(run.sampling_policy, cond, x_T, gens, sigmas=run.sigmas, timesteps=run.timesteps,
                                     w0=w0, window=W, noise_level=cfg.noise_level, kind=cfg.sampler,
                                     guidance_scale=cfg.guidance, complete=cfg.completes,
                                     completion_steps=judge.steps, continuations=judge.continuations,
                                     continuation_generators=S.continuation_generators(
                                         cfg.seed, it, slots_members, judge.continuations),
                                     chunk_size=cfg.chunk_size or None)
        nfe += ro.counter.nfe
        batches.append((ro, cond))
    return Samples(batches, w0, prompts, metadata, nfe)


def score(run: Run, samples: Samples) -> tuple[torch.Tensor, dict[str, float]]:
    """Step 2: R_k = R(ODE-complete(s_k)) for k = 0..W, column W = R_sde (docs/method.md, 'Incremental rewards via
    ODE completions'; with mc:M the mean of s_k's M continuations), or R_sde alone for Flow-GRPO. Returns R (n, W+1)
    or (n, 1) and the reward's components on the final images, averaged over all processes."""
    R, finals = [], {}
    for bi, (ro, _) in enumerate(samples.batches):
        b0, m = bi * run.cfg.sample_batch, ro.final.shape[0]
        # (b*(W*M+1), C, h, w) every completion (M of each state for mc:M, else 1), or (b, C, h, w) the final images
        latents = ro.completions.flatten(0, 1) if ro.completions is not None else ro.final
        reps = latents.shape[0] // m
        total, parts = evaluate.decode_and_score(run.pipe, run.reward_fn, latents,
                                                 [p for p in samples.prompts[b0:b0 + m] for _ in range(reps)],
                                                 [d for d in samples.metadata[b0:b0 + m] for _ in range(reps)],
                                                 run.cfg.reward_batch)
        scores = total.reshape(m, reps)  # (b, W*M+1) or (b, 1)
        R.append(S.judge_rewards(scores, ro.continuations) if ro.completions is not None else scores)  # (b, W+1)
        for name, v in parts.items():
            finals.setdefault(name, []).append(v.reshape(m, reps)[:, -1])  # (b,) the final image's
    finals = {name: collectives.gather(run.accelerator, torch.cat(v)).mean().item() for name, v in finals.items()}
    return torch.cat(R).to(run.accelerator.device), finals  # (n, W+1) or (n, 1)


def assign_credit(accelerator, R_mine: torch.Tensor, mine: torch.Tensor, cfg: Config):
    """Step 3: gather every process's completion rewards, then per-step rewards (Sec. 4, Def. 5.1: turning points,
    aggregated rewards, balancing; docs/method.md, 'Per-step rewards of the three methods') and per-timestep
    advantages (Sec. 4.3; 'Per-timestep advantages') for whole groups.

    R_mine (n, W+1) (Flow-GRPO: (n, 1), R_sde only) holds the rewards of this process's trajectories `mine` (n,).
    Every process computes the same (N, W) tensors from the same gathered rewards, so no broadcast is needed, and
    a group's members may sit on any processes. Returns R_all (N, W+1 or 1), the kept turning points (N, W), the
    detected ones (N, W) (all False for Flow-GRPO, which has no completions) and this process's advantages (n, W).
    """
    N, W = cfg.prompts_per_iter * cfg.group_size, cfg.window
    device = accelerator.device
    G = cfg.group_size
    R_all = torch.empty(N, R_mine.shape[1], device=device)  # (N, W+1) or (N, 1)
    # Each gathered row goes to its trajectory id j, whichever process sampled it and in whatever order the gather
    # returns them: row j is member j % G of group j // G, so every group is G consecutive rows, the layout grpo.py's
    # (B, G, W) views rely on.
    R_all[collectives.gather(accelerator, mine)] = collectives.gather(accelerator, R_mine)
    R_all = R_all.cpu()
    if cfg.completes:  # TP-GRPO and the incremental ablation: a reward per step, normalized per step
        step_r, kept, detected = tp.step_rewards(R_all, G, cfg.algo, cfg.tp_rule)  # (N, W) x 3
        adv = grpo.per_timestep_advantages(step_r, G, clip=cfg.adv_clip)  # (N, W)
    else:  # Flow-GRPO: the outcome R_sde, normalized once, on every step
        kept = detected = torch.zeros(N, W, dtype=torch.bool)  # (N, W)
        adv = grpo.flow_grpo_advantages(R_all[:, -1], G, W, clip=cfg.adv_clip)  # (N, W)
    return R_all, kept, detected, adv[mine].to(device)  # adv (n, W)


def update_policy(run: Run, samples: Samples, adv: torch.Tensor, it: int) -> dict[str, float]:
    """Step 4: Flow-GRPO's clipped surrogate + beta KL on every window step (docs/method.md, 'The clipped loss'). The
    iteration's rows are shuffled and split into `updates_per_iter` updates; an update accumulates the gradients of
    its micro-batches x W window steps, then takes one optimizer step and moves the EMA. adv (n, W) this process's
    advantages. Returns the iteration's training statistics (UpdateStats), means over all processes.
    """
    cfg, acc, W, w0 = run.cfg, run.accelerator, run.cfg.window, samples.w0
    n, rank = adv.shape[0], acc.process_index
    run.policy.train()
    states = torch.cat([ro.states for ro, _ in samples.batches])  # (n, W+1, C, h, w) s_0 .. s_W
    log_weight_old = torch.cat([ro.log_weights for ro, _ in samples.batches])  # (n, W)
    cond = models.Cond.cat([c for _, c in samples.batches])  # n rows
    g = torch.Generator().manual_seed(S.stream_seed(cfg.seed, it, "shuffle", rank))
    order = torch.randperm(n, generator=g)  # (n,) which rows go into which update
    # Flow-GRPO's filter: a trajectory whose advantage is 0 at every window step has no policy gradient, so it is
    # left out of the loss's means (docs/method.md, 'The clipped loss').
    zero_adv = (adv == 0).all(1).cpu()  # (n,)
    # DEVIATION: masked, not dropped and re-batched with padding rows as upstream, and for every algorithm
    # (--drop-zero-adv; docs/deviations.md, 'Zero-advantage samples').
    mask = ~zero_adv if cfg.drop_zero_adv else None  # (n,) rows that count, or None: all
    if mask is not None:
        order = spread_kept(order, mask, cfg.train_batch)
    log = UpdateStats()
    for u, update in enumerate(order.split(n // cfg.updates_per_iter)):  # the rows of one optimizer step
        for mb, rows in enumerate(update.split(cfg.train_batch)):  # its micro-batches, (b,) row ids each
            counted = rows.numel() if mask is None else int(mask[rows].sum())
            row_mask = None if mask is None else mask[rows].to(acc.device)  # (b,)
            for k in range(1, W + 1):
                i = w0 + k - 1  # window step k takes s_{k-1} to s_k at grid index i
                t = run.timesteps[i].expand(rows.numel())  # (b,)
                # accelerate counts the backward passes: DDP syncs (and DeepSpeed steps) on the update's last
                with acc.accumulate(run.ddp_policy):
                    loss, stats, log_weight = run.step_loss(
                        run.ddp_policy, states[rows, k - 1], states[rows, k], t=t, cond=cond.rows(rows.to(acc.device)),
                        sigma=run.sigmas[i], sigma_next=run.sigmas[i + 1], log_weight_old=log_weight_old[rows, k - 1],
                        adv=adv[rows, k - 1], mask=row_mask)
                    acc.backward(loss)
                log.add(stats, loss, counted=counted, first=u == mb == 0, log_weight=log_weight,
                        log_weight_old=log_weight_old[rows, k - 1])
        # The update's one optimizer step: its micro-batches x W backward passes are setup's
        # gradient_accumulation_steps, so the last one synced the gradients (acc.sync_gradients) and the step applies
        log.grad_norm(acc.clip_grad_norm_(run.params, cfg.max_grad_norm))
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        if run.ema is not None:
            run.ema.step()
    return log.summary(acc, zero_adv, run.N)


def spread_kept(order: torch.Tensor, keep: torch.Tensor, batch: int) -> torch.Tensor:
    """`order` (n,) rearranged so that the kept rows are spread evenly over its micro-batches of `batch` rows.

    Flow-GRPO re-batches the kept samples into its fixed number of equal, smaller micro-batches; we keep the layout
    and mask the other rows (update_policy), and without this rearrangement it would be left to chance how many
    counted rows a micro-batch has, i.e. how much each of them weighs. Micro-batch m takes the next floor or
    ceil(K / M) kept rows (K kept, M micro-batches) in `order`'s order, then dropped rows fill it up; with every
    row kept, `order` is unchanged.
    """
    M = order.numel() // batch
    kept, dropped = order[keep[order]], order[~keep[order]]  # (K,), (n - K,) both in `order`'s order
    parts, next_kept, next_dropped = [], 0, 0
    for m in range(M):
        size = kept.numel() // M + (m < kept.numel() % M)
        parts += [kept[next_kept:next_kept + size], dropped[next_dropped:next_dropped + batch - size]]
        next_kept, next_dropped = next_kept + size, next_dropped + batch - size
    return torch.cat(parts)  # (n,)


# ======================================== Logging (evaluation: evaluate.HeldOut; checkpoints: checkpoint.py) =====


def iteration_log(run: Run, R_all: torch.Tensor, kept: torch.Tensor, detected: torch.Tensor, *, finals: dict,
                  train_stats: dict, nfe: int, timer: dict) -> dict[str, float]:
    """Step 5: the iteration's metrics (docs/metrics.md explains each). R_all (N, W+1 or 1), kept /
    detected turning points (N, W), finals: the reward's parts, nfe: all processes' evaluations, timer: seconds."""
    cfg, W = run.cfg, run.cfg.window
    r_sde = R_all[:, -1]  # (N,) in groups of G consecutive rows (assign_credit)
    stats = dict(train_stats)
    log = {"reward/mean": r_sde.mean().item(), "reward/std": r_sde.std(unbiased=False).item(),
           "reward/zero_std_groups": grpo.zero_std_fraction(r_sde, cfg.group_size).item(),
           "train/grad_norm": stats.pop("grad_norm"), "train/lr": cfg.lr,
           "cost/transformer_evals": nfe, "cost/evals_per_trajectory": nfe / run.N,
           **{f"train/{name}": v for name, v in stats.items()},
           **{f"reward/{name}": v for name, v in finals.items()},
           **{f"time/{name}_s": v for name, v in timer.items()}}
    if R_all.shape[1] == W + 1:  # with completions: the step-wise rewards and turning points
        d = tp.incremental_rewards(R_all)  # (N, W)
        log["reward/R0_mean"] = R_all[:, 0].mean().item()
        for k in range(1, W + 1):  # window step k, column k - 1
            log[f"steps/d_mean_{k}"] = d[:, k - 1].mean().item()
            log[f"steps/d_abs_{k}"] = d[:, k - 1].abs().mean().item()
            log[f"steps/tp_rate_{k}"] = detected[:, k - 1].float().mean().item()
            log[f"steps/tp_kept_{k}"] = kept[:, k - 1].float().mean().item()
        log["steps/tp_rate"] = detected.float().mean().item()
        log["steps/tp_kept"] = kept.float().mean().item()
        for rule in tp.RULES:  # both rules' rates, whichever one trains: how often turning points happen
            log[f"steps/tp_rate_{rule}"] = tp.detect_turning_points(R_all, rule).float().mean().item()
    return log


def finish(run: Run, summaries: dict, history_path: str) -> None:
    """The run's reward curve and summary lines (evaluate.final_report, the judge audit's); then every process ends
    its part of the run together (a lone destroy of a gloo/NCCL group can hang or abort)."""
    acc = run.accelerator
    if acc.is_main_process:
        evaluate.final_report(acc, summaries, history_path, run.cfg)
        if run.audit.history:
            acc.print(run.audit.summary())
        acc.print(run.watch.summary())
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main(config.parse_config(description=__doc__.split("Shape legend")[0]))
