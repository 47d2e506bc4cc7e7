"""The judge audit: is the judge of window states telling the run anything? (docs/method.md, 'The judge audit')

Every step-wise credit method judges a window state s_k by a cheap stand-in (TP-GRPO: the ODE completion; `x0`: the
one-step prediction) for the quantity they all approximate, the stochastic truth: the expected final reward of s_k
under the sampler training uses (docs/method.md, 'The stochastic truth as a judge'). The audit estimates that truth on
one prompt group of an iteration, M continuations of each window state with seeds of its own (sampler.STREAMS
"audit"), and sets the run's judge beside it:

  judge/corr_k         k = 0..W-1: the within-group correlation of the judge's R_k with the truth's, over the G members
  judge/sign_agree_k   k = 1..W: among the members whose true d_k = R_k - R_{k-1} is resolved (beyond 2 Monte-Carlo
                       SE), the share whose judged d_k has its sign; judge/sign_agree, judge/resolved over all steps
  judge/tp_confirmed   the share of the judge's turning points (the run's rule) that the truth's R also makes ones
  judge/evals          the audit's own transformer evaluations, all processes (never in cost/*); time/audit_s

It changes nothing else in the run: it samples nothing the run uses, draws from no generator of the run, runs
after the iteration's sampling and scoring on the policy that sampled, and leaves the weights alone. For Flow-GRPO,
which has no judge, it judges the group with the ODE itself: what a step-wise judge would have seen.

  python train.py --task tiny                         # the tiny preset audits every 10 iterations (--judge-audit)
  python audit.py --task tiny --checkpoint none       # a model before training: its judge against the truth
  python audit.py --task pickscore --checkpoint runs/pickscore/checkpoints/iter-000100 --groups 4 --completion x0

Shape legend: G group size, g this process's members of the audited group, W window steps, M continuations,
C/h/w latent channels/height/width.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

import torch
from accelerate import Accelerator

import collectives
import config
import evaluate
import models
import rewards
import sampler as S
import turning_points as tp
from config import Config


def audit_metrics(R_judge: torch.Tensor, R_truth: torch.Tensor, se: torch.Tensor, rule: str) -> dict[str, float]:
    """The audit's numbers for one group: R_judge, R_truth (G, W+1) the judge's and the truth's R_0 .. R_W (R_W the
    trajectory's own reward in both), se (G, W+1) the truth's Monte-Carlo standard error (0 at W). A statistic with
    nothing to count (no variation, nothing resolved, no turning point) is left out rather than given a number."""
    W, out = R_judge.shape[1] - 1, {}
    for k in range(W):  # within-group correlation over the G members at each window state
        corr = torch.corrcoef(torch.stack([R_judge[:, k], R_truth[:, k]]))[0, 1]
        if corr.isfinite():
            out[f"judge/corr_{k}"] = corr.item()
    d_judge, d_truth = tp.incremental_rewards(R_judge), tp.incremental_rewards(R_truth)  # (G, W) each
    # the truth's d_k = R_k - R_{k-1} from independent continuations: SE = sqrt(se_k^2 + se_{k-1}^2)
    resolved = d_truth.abs() > 2 * (se[:, 1:].square() + se[:, :-1].square()).sqrt()  # (G, W)
    agree = torch.sign(d_judge) == torch.sign(d_truth)  # (G, W)
    for k in range(1, W + 1):  # window step k, column k - 1
        if resolved[:, k - 1].any():
            out[f"judge/sign_agree_{k}"] = agree[:, k - 1][resolved[:, k - 1]].float().mean().item()
    out["judge/resolved"] = resolved.float().mean().item()
    if resolved.any():
        out["judge/sign_agree"] = agree[resolved].float().mean().item()
    found, real = tp.detect_turning_points(R_judge, rule), tp.detect_turning_points(R_truth, rule)  # (G, W) each
    if found.any():
        out["judge/tp_confirmed"] = (found & real).sum().item() / found.sum().item()
    return out


@torch.no_grad()
def truth_and_judge(transformer, pipe, reward_fn, cfg: Config, *, states: torch.Tensor, cond: models.Cond,
                    prompts: list[str], metadata: list[dict], w0: int, generators, ode_judge: bool,
                    counter: models.EvalCounter) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """For g trajectories' window states (g, W+1, C, h, w): the truth of s_0 .. s_{W-1}, the mean reward of M =
    cfg.audit_continuations continuations (sampler.continue_naive with `generators`), its SE (g, W) each, and, when
    `ode_judge`, the ODE judge's R_0 .. R_{W-1} (g, W) (Flow-GRPO's audit); else None."""
    g, W, M = states.shape[0], states.shape[1] - 1, cfg.audit_continuations
    sigmas, timesteps = models.sigma_grid(pipe.scheduler, cfg.steps, states.shape[2:])
    finals = S.continue_naive(transformer, states, cond, generators, w0=w0, sigmas=sigmas, timesteps=timesteps,
                              guidance_scale=cfg.guidance, noise_level=cfg.noise_level, kind=cfg.sampler,
                              continuations=M, counter=counter)  # (g, W*M, C, h, w)
    scores = evaluate.decode_and_score(pipe, reward_fn, finals.flatten(0, 1),
                                       [p for p in prompts for _ in range(W * M)],
                                       [d for d in metadata for _ in range(W * M)], cfg.reward_batch)[0]  # (g*W*M,)
    scores = scores.reshape(g, W, M)
    judged = None
    if ode_judge:
        done = torch.stack([S.ode_complete(transformer, states[:, k], w0 + k, cond, sigmas=sigmas,
                                           timesteps=timesteps, guidance_scale=cfg.guidance, counter=counter)
                            for k in range(W)], 1)  # (g, W, C, h, w)
        judged = evaluate.decode_and_score(pipe, reward_fn, done.flatten(0, 1), [p for p in prompts for _ in range(W)],
                                           [d for d in metadata for _ in range(W)], cfg.reward_batch)[0].reshape(g, W)
    return scores.mean(2), scores.std(2) / math.sqrt(M), judged


@dataclass
class JudgeAudit:
    """train.py's audit, called once per iteration (after scoring, before the update) as audit(it, samples, R_all):
    every cfg.judge_audit iterations it audits the iteration's first prompt group and returns the judge/* metrics
    (else {}). The group's members sit on several processes: each continues its own, and every process computes the
    same numbers from the gathered values, so all take the same path."""

    cfg: Config
    accelerator: Accelerator
    pipe: object
    reward_fn: object
    transformer: object  # what sampling calls: the policy, or its compiled form
    mine: torch.Tensor  # (n,) this process's trajectory ids
    history: list = field(default_factory=list)  # (iteration, metrics) of every audit

    def __call__(self, it: int, samples, R_all: torch.Tensor) -> dict[str, float]:
        cfg, acc = self.cfg, self.accelerator
        if not cfg.judge_audit or (it + 1) % cfg.judge_audit:
            return {}
        start, G, W = time.perf_counter(), cfg.group_size, cfg.window
        rows = (self.mine < G).nonzero().flatten()  # (g,) this process's members of group 0 (trajectory j < G)
        slots = math.ceil(G / acc.num_processes)  # every process gathers this many rows, padded
        counter = models.EvalCounter()
        truth, se, judged = (torch.zeros(slots, W) for _ in range(3))  # (slots, W) each, padded
        if len(rows):
            cond = models.Cond.cat([c for _, c in samples.batches]).rows(rows.to(acc.device))
            generators = S.continuation_generators(cfg.seed, it, [(S.STREAMS["audit"], j) for j in
                                                                  self.mine[rows].tolist()], cfg.audit_continuations)
            with acc.autocast():
                t, s, j = truth_and_judge(
                    self.transformer, self.pipe, self.reward_fn, cfg,
                    states=torch.cat([ro.states for ro, _ in samples.batches])[rows], cond=cond,
                    prompts=[samples.prompts[r] for r in rows.tolist()],
                    metadata=[samples.metadata[r] for r in rows.tolist()], w0=samples.w0, generators=generators,
                    ode_judge=not cfg.completes, counter=counter)
            truth[:len(rows)], se[:len(rows)] = t, s
            judged[:len(rows)] = j if j is not None else 0
        ids = torch.full((slots,), -1)
        ids[:len(rows)] = self.mine[rows]
        gathered = [collectives.gather(acc, x).cpu() for x in (ids, truth, se, judged)]
        evals = int(collectives.reduce_sum(acc, torch.tensor(counter.nfe)))
        keep = gathered[0] >= 0
        order = gathered[0][keep].argsort()  # (G,) member order
        truth, se, judged = (x[keep][order] for x in gathered[1:])  # (G, W) each
        R_W = R_all[:G, -1:].cpu()  # (G, 1) the trajectories' own rewards
        R_judge = torch.cat([judged if not cfg.completes else R_all[:G, :W].cpu(), R_W], 1)  # (G, W+1)
        out = audit_metrics(R_judge, torch.cat([truth, R_W], 1), torch.cat([se, torch.zeros(G, 1)], 1), cfg.tp_rule)
        out |= {"judge/evals": evals, "time/audit_s": time.perf_counter() - start}
        self.history.append((it + 1, out))
        return out

    def summary(self) -> str:
        """One line for the end of the run: the judge's correlation with the truth at s_0 at every audit."""
        if not self.history:
            return ""
        cells = ", ".join(f"{m['judge/corr_0']:+.2f} (iteration {i})" if "judge/corr_0" in m else f"- (iteration {i})"
                          for i, m in self.history)
        return (f"judge audit ({self.cfg.completion if self.cfg.completes else 'ode, for Flow-GRPO'}, "
                f"{self.cfg.audit_continuations} continuations, one group of {self.cfg.group_size}): within-group "
                f"correlation with the stochastic truth at s_0: {cells}")


def main(argv: list[str] | None = None) -> dict:
    """The audit of a checkpoint or the base model, before paying for a judge: `--groups` prompt groups of the
    task's training prompts, sampled as training samples them (its T, W, a, sampler, G, CFG) with the judge of
    --completion, each judged against the truth; the judge/* metrics averaged over the groups, printed and written
    to audit.json."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="tiny", help=f"preset: {', '.join(config.PRESETS)}")
    p.add_argument("--checkpoint", required=True, help="train.py checkpoint folder, a LoRA folder, or 'none'")
    p.add_argument("--model", help="override the preset's base model")
    p.add_argument("--completion", help="the judge audited (default: the preset's): ode, ode:K, x0, mc:M")
    p.add_argument("--groups", type=int, default=2, help="prompt groups audited (G trajectories each)")
    p.add_argument("--continuations", type=int, default=16, help="M, continuations per window state for the truth")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts, trajectories and continuations")
    p.add_argument("--output-dir", help="folder for audit.json (default: next to the checkpoint)")
    args = p.parse_args(argv)
    if args.task not in config.PRESETS:
        p.error(f"unknown task '{args.task}'; choose one of {', '.join(config.PRESETS)}")
    if args.groups < 1 or args.continuations < 2:
        p.error("--groups must be >= 1 and --continuations >= 2 (the truth's standard error needs two)")
    overrides = {k: v for k, v in (("model", args.model), ("completion", args.completion)) if v}
    cfg = Config(**dict(config.PRESETS[args.task], task=args.task, **overrides, audit_continuations=args.continuations,
                        seed=args.seed, algo="tp-grpo"))
    try:
        S.parse_completion(cfg.completion)
        accelerator = Accelerator()
        pipe = models.load_pipeline(cfg.model, torch.float32 if accelerator.device.type == "cpu" else torch.bfloat16,
                                    accelerator.device)
        if args.checkpoint != "none":
            evaluate.load_checkpoint_weights(pipe, args.checkpoint, ema=False)
        reward_fn = rewards.load_rewards(config.parse_weights(cfg.rewards), accelerator.device)
        prompts, metadata = config.load_prompt_set(cfg.prompts)
    except (models.ModelLoadError, rewards.RewardLoadError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    results = [audit_fresh_group(pipe, reward_fn, cfg, prompts, metadata, group=i, accelerator=accelerator)
               for i in range(args.groups)]
    summary = {k: sum(r[k] for r in results if k in r) / sum(k in r for r in results)
               for k in sorted({k for r in results for k in r})}
    out = args.output_dir or (os.path.join(args.checkpoint, "audit") if args.checkpoint != "none"
                              else os.path.join(cfg.output_dir, "audit_base"))
    if accelerator.is_main_process:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "audit.json"), "w") as f:
            json.dump({"checkpoint": args.checkpoint, "completion": cfg.completion, "groups": args.groups,
                       "continuations": args.continuations, "mean": summary, "per_group": results}, f, indent=1)
        print(f"judge {cfg.completion} against the stochastic truth ({args.continuations} continuations), mean over "
              f"{args.groups} group(s) of {cfg.group_size}:")
        for k, v in summary.items():
            print(f"  {k:<24} {v:.3f}")
    return summary


@torch.no_grad()
def audit_fresh_group(pipe, reward_fn, cfg: Config, prompts: list[str], metadata: list[dict], *, group: int,
                      accelerator) -> dict[str, float]:
    """One prompt group (prompt `group` of the drawn order), sampled as train.sample samples it, its judge's R from
    the same wavefront, and the audit's metrics against the truth. Every process computes the whole group."""
    G, W = cfg.group_size, cfg.window
    prompt = int(S.draw_prompts(len(prompts), group + 1, cfg.seed, 0)[group])
    judge, shape = S.parse_completion(cfg.completion), models.latent_shape(pipe, cfg.resolution)
    sigmas, timesteps = models.sigma_grid(pipe.scheduler, cfg.steps, shape)
    cond = models.encode_prompts(pipe, [prompts[prompt]], cfg.guidance, cfg.max_sequence_length).repeat(G)
    gens = S.make_generators([S.member_seed(cfg.seed, 0, group, q) for q in range(G)])
    x_T = S.draw_noise(gens, shape, accelerator.device)  # (G, C, h, w)
    counter = models.EvalCounter()
    with accelerator.autocast():
        ro = S.wavefront_rollout(pipe.transformer, cond, x_T, gens, sigmas=sigmas, timesteps=timesteps,
                                 w0=max(cfg.window_start, 0), window=W, noise_level=cfg.noise_level, kind=cfg.sampler,
                                 guidance_scale=cfg.guidance, completion_steps=judge.steps,
                                 continuations=judge.continuations, continuation_generators=S.continuation_generators(
                                     cfg.seed, 0, [(group, q) for q in range(G)], judge.continuations))
        truth, se, _ = truth_and_judge(pipe.transformer, pipe, reward_fn, cfg, states=ro.states, cond=cond,
                                       prompts=[prompts[prompt]] * G, metadata=[metadata[prompt]] * G, w0=ro.w0,
                                       generators=S.continuation_generators(
                                           cfg.seed, 0, [(S.STREAMS["audit"], group * G + q) for q in range(G)],
                                           cfg.audit_continuations), ode_judge=False, counter=counter)
    reps = ro.completions.shape[1]
    scores = evaluate.decode_and_score(pipe, reward_fn, ro.completions.flatten(0, 1), [prompts[prompt]] * G * reps,
                                       [metadata[prompt]] * G * reps, cfg.reward_batch)[0].reshape(G, reps)
    R_judge = S.judge_rewards(scores, ro.continuations)  # (G, W+1)
    R_truth = torch.cat([truth, R_judge[:, -1:]], 1)  # (G, W+1)
    return audit_metrics(R_judge, R_truth, torch.cat([se, torch.zeros(G, 1)], 1), cfg.tp_rule) | {
        "judge/evals": ro.counter.nfe + counter.nfe}


if __name__ == "__main__":
    main()
