"""Benchmark of one training iteration's phases, above all the credit-assignment cost of TP-GRPO's ODE completions.

Phases for a batch of n trajectories, T steps, an SDE window of W steps from w0 = 0 (the real code paths):

  (a) Flow-GRPO rollout: T transformer calls, T evaluations per trajectory, no completion.
  (b) TP-GRPO as the authors' demo code lays it out: the rollout, a separate pure-ODE run for R_0, then one ODE
      completion per window state, one after the other (sampler.complete_naive): 64 evaluations for T=10, W=9.
  (c) TP-GRPO batched (sampler.wavefront_rollout): the wavefront, 55 evaluations in T calls; with --judges,
      (c) again for each other judge of the window states (docs/method.md, 'Cheaper judges', 'The stochastic truth
      as a judge'): ode:K, x0, mc:M.
  (d) decoding n latents with the VAE in float32 (what train.py does, as the demo code), and (d') in bf16 for
      comparison: TP-GRPO decodes W+1 images per trajectory.
  (a*), (c*) with --compile: (a) and (c) with the transformer compiled for calls of a fixed size
      (models.CompiledTransformer, as train.py --compile runs it); the compile warm-up is timed on its own.
  (e) one training micro-batch of the n trajectories: W window steps of forward + backward through the LoRA
      transformer (policy.WindowStepLoss: the policy, the adapter-off reference when beta > 0, grpo_loss), then
      one AdamW step.

An evaluation is one image through the transformer at one step (a CFG pair counts once; FLUX's guidance
embedding needs no pair); calls are forward passes. Wall times are medians over --repeats runs after one warm-up;
FLOPs are counted once per phase by torch.utils.flop_counter.FlopCounterMode (matrix products and convolutions,
forward and backward), and TFLOP/s = counted FLOPs / median seconds; on CUDA the peak memory of each phase is
reported.

  python bench.py                          # the tiny random-weight pipeline on the CPU (a few minutes on 2 cores)
  python bench.py --size random-sd35m --device cuda --dtype bf16 --batches 8
                                           # SD3.5-M's shapes with random weights, 512 px: no download
  python bench.py --size random-sd35m --device cuda --dtype bf16 --batches 16 --compile
                                           # also (a*) and (c*): the transformer compiled (torch.compile)
  python bench.py --size random-sd35m --device cuda --dtype bf16 --batches 8 --compile --phases a,c
                                           # only some phases (gpu_check.py's SD3.5-M compile item)
  python bench.py --size random-sd35m --device meta --batches 8
                                           # the same shapes on no memory at all: FLOPs only (a CPU-safe check)
  python bench.py --size tiny-flux --steps 6 --window 5 --guidance 3.5
  python bench.py --size random-flux-dev --device cuda --dtype bf16 --steps 6 --window 5 --guidance 3.5 --batches 3
                                           # FLUX: the presets' T = 6, W = 5 (--device meta: FLOPs only)

After the phases, one iteration's cost per trajectory for Flow-GRPO and for TP-GRPO with each judge: transformer
evaluations and FLOPs of sampling, the images decoded (1 or W + 1) and the VAE's FLOPs, the reward model's FLOPs
(PickScore's CLIP-H/14 at 224 px, counted on the meta device whatever --size), the training step's FLOPs (e), and
the total against Flow-GRPO's: the predicted TP/Flow cost ratio per iteration (and measured seconds off the meta
device, the reward model excluded: it is not loaded).

  python bench.py --size random-sd35m --device meta --batches 9 --judges ode:3,ode:2,x0,mc:1,mc:4   # SD3.5-M
  python bench.py --size random-flux-dev --device meta --steps 6 --window 5 --guidance 3.5 --batches 3 \
      --judges ode:3,ode:2,x0,mc:1,mc:4                                                      # FLUX.1-dev, T = 6
  python bench.py --size toy --steps 6 --window 5 --guidance 1 --batches 32 --judges x0,mc:1,mc:4   # the toy world

Shape legend: n trajectories per batch, C/h/w latent channels/height/width, L text tokens, D text width, P pooled
width.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
import types

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import CLIPConfig, CLIPModel

import config
import models
import policy
import sampler as S
import toyworld


def build(args):
    """The pipeline with a LoRA on its transformer (sampling runs with it too, as in train.py) and a Config."""
    pipe = models.load_pipeline(config.TOY_MODEL if args.size == "toy" else args.size, args.dtype, args.device)
    targets = {"lora_targets": config.FLUX_LORA_TARGETS} if models.is_flux(pipe) else {}  # the FLUX presets' LoRA
    cfg = config.Config(guidance=args.guidance, noise_level=args.noise_level, window=args.window, steps=args.steps,
                        gradient_checkpointing=args.gradient_checkpointing, **targets)
    policy.add_lora(pipe.transformer, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets.split(","))
    if cfg.gradient_checkpointing:
        pipe.transformer.enable_gradient_checkpointing()
    return pipe, cfg


def measure(fn, args, flops: int | None = None) -> dict:
    """FLOPs of one fn() and, off the meta device, the median wall time of `repeats` runs after one warm-up and
    (CUDA) the peak memory. Returns {flops, seconds, peak_gib, warmup_s, out}.

    `flops` given (a compiled phase: the same arithmetic as its eager twin, counted there, since FlopCounterMode
    sees no operators inside a compiled graph): the warm-up call, where torch.compile compiles, is timed instead.
    """
    cuda = args.device.startswith("cuda")
    start = time.perf_counter()
    if flops is None:
        with FlopCounterMode(display=False) as counter:
            out = fn()
        flops = counter.get_total_flops()
    else:
        out = fn()
        if cuda:
            torch.cuda.synchronize()
    warmup = time.perf_counter() - start
    row = dict(flops=flops, seconds=None, peak_gib=None, warmup_s=warmup, out=out)
    if args.device == "meta":
        return row
    times = []
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    row.update(seconds=statistics.median(times), out=out)
    if cuda:
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def bench_batch(pipe, cfg: config.Config, args, n: int) -> list[dict]:
    shape = models.latent_shape(pipe, args.resolution)
    sigmas, timesteps = models.sigma_grid(pipe.scheduler, args.steps, shape)
    kind = args.device.split(":")[0]
    autocast = (lambda: torch.autocast(kind, dtype=args.dtype)) if args.dtype != torch.float32 and kind != "meta" \
        else contextlib.nullcontext
    with autocast():
        cond = models.encode_prompts(pipe, ["a photo of four books"], args.guidance, args.max_sequence_length).repeat(n)

    def rollout(complete: bool, naive: bool = False, transformer=pipe.transformer, judge: str = "ode"):
        gens = S.make_generators([S.member_seed(0, 0, 0, m) for m in range(n)])
        x_T = S.draw_noise(gens, shape, args.device)  # (n, C, h, w)
        spec = S.parse_completion(judge)
        with autocast():
            ro = S.wavefront_rollout(transformer, cond, x_T, gens, sigmas=sigmas, timesteps=timesteps, w0=0,
                                     window=args.window, noise_level=args.noise_level, kind="cps",
                                     guidance_scale=args.guidance, complete=complete, chunk_size=args.chunk_size,
                                     completion_steps=spec.steps, continuations=spec.continuations,
                                     continuation_generators=S.continuation_generators(
                                         0, 0, [(0, m) for m in range(n)], spec.continuations))
            counter = models.EvalCounter(ro.counter.nfe, ro.counter.calls)
            if naive:
                S.complete_naive(pipe.transformer, ro, cond, args.guidance, counter=counter)
        return counter, ro

    rows, ro = {}, None
    for key, name, complete, naive in [("a", "(a) Flow-GRPO rollout", False, False),
                                       ("b", "(b) TP-GRPO, demo-code layout", False, True),
                                       ("c", "(c) TP-GRPO, batched wavefront", True, False)]:
        if key in args.phases:
            row = measure(lambda: rollout(complete, naive), args)
            counter, ro = row.pop("out")
            rows[key] = dict(row, layout=name, nfe=counter.nfe / n, calls=counter.calls)
    for judge in args.judges if "c" in args.phases else []:
        row = measure(lambda: rollout(True, judge=judge), args)
        counter, _ = row.pop("out")
        rows[f"c:{judge}"] = dict(row, layout=f"(c) wavefront, judge {judge}", nfe=counter.nfe / n, calls=counter.calls)
    if args.compile:
        # the transformer compiled for calls of `rows` images: by default one rollout call (n, x2 with SD3's CFG),
        # so the wavefront's calls of n(1 + live) trajectories split into whole chunks, as in train.py --compile
        fixed = models.CompiledTransformer(pipe.transformer, args.compile_rows or n * _cfg_pair(pipe, args),
                                           args.compile_backend)
        for key, name, complete in [("a*", "(a*) Flow-GRPO rollout, compiled", False),
                                    ("c*", "(c*) TP-GRPO wavefront, compiled", True)]:
            if key[0] in rows:  # the compiled twin of a phase that ran eager, with its FLOPs
                row = measure(lambda: rollout(complete, transformer=fixed), args, flops=rows[key[0]]["flops"])
                counter, _ = row.pop("out")
                rows[key] = dict(row, layout=name, nfe=counter.nfe / n, calls=counter.calls)
    if ro is None:  # decoding and training need a rollout's latents and states: one Flow-GRPO rollout, untimed
        _, ro = rollout(False)

    # the VAE as train.py runs it (float32), and a bf16 copy of it for comparison
    # the transformer rides along for decode's is_flux switch (FLUX latents are unpacked first)
    for key, name in [("d", "(d) decode, VAE float32"), ("d'", "(d') decode, VAE bf16")]:
        if key in args.phases:
            holder = pipe if key == "d" else \
                types.SimpleNamespace(vae=copy.deepcopy(pipe.vae).bfloat16(), transformer=pipe.transformer)
            row = measure(lambda: models.decode(holder, ro.final), args)
            rows[key] = dict(row, layout=name, nfe=None, calls=None, out=None)
    if "e" not in args.phases:
        return [dict(r, batch=n, phase=k) for k, r in rows.items()]

    params = [p for p in pipe.transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr)
    step_loss = policy.WindowStepLoss(lambda: policy.reference_policy(pipe.transformer), sampler=cfg.sampler,
                                      noise_level=cfg.noise_level, guidance=cfg.guidance, clip_range=cfg.clip_range,
                                      beta=cfg.beta, autocast=autocast)

    @torch.enable_grad()
    def train_step():
        pipe.transformer.train()
        for k in range(cfg.window):
            t = timesteps[k].expand(n)  # (n,)
            loss, _, _ = step_loss(pipe.transformer, ro.states[:, k], ro.states[:, k + 1], t=t, cond=cond,
                                   sigma=sigmas[k], sigma_next=sigmas[k + 1], log_weight_old=ro.log_weights[:, k],
                                   adv=torch.randn(n, device=args.device))
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        pipe.transformer.eval()

    row = measure(train_step, args)
    rows["e"] = dict(row, layout=f"(e) training step, {cfg.window} steps", nfe=None, calls=None)
    return [dict(r, batch=n, phase=k) for k, r in rows.items()]


PHASES = ("a", "b", "c", "d", "d'", "e")  # (a*) and (c*) follow (a) and (c) with --compile
RATIOS = [("ratio b/c (batching speed-up)", "b", "c"), ("ratio c/a (cost of TP credit)", "c", "a"),
          ("ratio a/a* (compile speed-up)", "a", "a*"), ("ratio c/c* (compile speed-up)", "c", "c*")]


def _cfg_pair(pipe, args) -> int:
    """Images per trajectory in a transformer call: 2 with SD3's CFG (the negative prompt's half), else 1."""
    return 2 if args.guidance > 1 and not models.is_flux(pipe) else 1


def _cell(value, fmt: str, width: int) -> str:
    return f"{'-' if value is None else format(value, fmt):>{width}}"


def main(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=[*models.TINY, "toy", *models.RANDOM], default="tiny",
                   help="a tiny pipeline (SD3 16 px, FLUX 32 px), the toy world's shipped model (32 px, "
                        "toy_model/) or SD3.5-M's / FLUX.1-dev's shapes with random weights (512 px)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | meta (shapes and FLOPs only, nothing allocated)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32",
                   help="weights and autocast (the VAE decodes in float32 regardless, as in train.py)")
    p.add_argument("--batches", type=int, nargs="+", default=[8, 24], help="trajectories per rollout batch (n)")
    p.add_argument("--steps", type=int, default=10, help="T, sampling steps")
    p.add_argument("--window", type=int, default=9, help="W, SDE window length (w0 = 0)")
    p.add_argument("--guidance", type=float, default=4.5,
                   help="CFG scale w (> 1 turns CFG on); FLUX: the guidance embedding's scale")
    p.add_argument("--noise-level", type=float, default=0.7, help="a, the CPS noise level")
    p.add_argument("--chunk-size", type=int, default=None, help="cap on images per transformer call in (c)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in (e)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per cell (median reported)")
    p.add_argument("--compile", action="store_true",
                   help="also time (a) and (c) with the transformer compiled (torch.compile, inductor) in calls of a "
                        "fixed size; the compile warm-up is reported separately")
    p.add_argument("--compile-rows", type=int, default=0,
                   help="images per compiled call (0: one rollout call, n x2 with SD3's CFG)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (eager: trace only)")
    p.add_argument("--judges", default="", help="other judges to time as (c) too, comma-separated: ode:K, x0, mc:M")
    p.add_argument("--phases", default=",".join(PHASES),
                   help="the phases to run, comma-separated: a, b, c, d, d', e (--compile adds a* / c* to a / c)")
    args = p.parse_args(argv)
    args.phases = args.phases.split(",")
    args.judges = [j for j in args.judges.split(",") if j]
    try:
        [S.parse_completion(j) for j in args.judges]
    except ValueError as e:
        p.error(f"--judges: {e}")
    if not set(args.phases) <= set(PHASES):
        p.error(f"--phases {','.join(args.phases)}: choose from {','.join(PHASES)}")
    args.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    args.resolution = {"tiny": 16, "tiny-flux": 32, "toy": 32}.get(args.size, 512)
    args.max_sequence_length = toyworld.MAX_SEQUENCE_LENGTH if args.size == "toy" else \
        32 if args.size in models.TINY else 128
    if args.compile and args.device == "meta":
        p.error("--compile runs the compiled model on real tensors; use --device cpu or cuda")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no GPU; use --device cpu, or --device meta for FLOPs only")
    with torch.no_grad():  # the training phase turns gradients on for itself
        return run(args)


def run(args) -> list[dict]:
    """Build, then print one table block per batch size; returns every row."""
    pipe, cfg = build(args)

    print(f"size={args.size} device={args.device} dtype={str(args.dtype)[6:]} T={args.steps} W={args.window} w0=0 "
          f"CFG={args.guidance} {args.resolution} px, transformer "
          f"{sum(q.numel() for q in pipe.transformer.parameters()) / 1e9:.3g}B parameters with LoRA")
    print(f"{'batch':>5}  {'phase':<34} {'nfe/traj':>10} {'calls':>6} {'seconds':>9} {'TFLOP':>9} {'TFLOP/s':>8} "
          f"{'peak GiB':>8} {'warm-up s':>9}")
    results = []
    for n in args.batches:
        rows = bench_batch(pipe, cfg, args, n)
        for r in rows:
            rate = r["flops"] / 1e12 / r["seconds"] if r["seconds"] else None
            print(f"{n:>5}  {r['layout']:<34} {_cell(r['nfe'], '.0f', 10)} {_cell(r['calls'], 'd', 6)} "
                  f"{_cell(r['seconds'], '.3f', 9)} {r['flops'] / 1e12:>9.4g} {_cell(rate, '.3g', 8)} "
                  f"{_cell(r['peak_gib'], '.1f', 8)} {_cell(r['warmup_s'], '.1f', 9)}")
        by = {r["phase"]: r for r in rows}
        pairs = [(label, by[x], by[y]) for label, x, y in RATIOS if x in by and y in by]
        for label, x, y in pairs:
            seconds = x["seconds"] / y["seconds"] if x["seconds"] else None
            print(f"{n:>5}  {label:<34} {x['nfe'] / y['nfe']:>10.2f} {x['calls'] / y['calls']:>6.1f} "
                  f"{_cell(seconds, '.2f', 9)} {x['flops'] / y['flops']:>9.2f}")  # FLOP ratio
        if {"a", "c", "d", "e"} <= set(by):
            print(iteration_cost(by, args, n, reward_flops()))
        results += rows
    return results


@torch.no_grad()
def reward_flops() -> int:
    """FLOPs of scoring one image with PickScore (CLIP-H/14: the 224 px image tower and a 77-token text tower),
    counted on the meta device: the reward model's share of an iteration, whatever pipeline is benchmarked."""
    vision = dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                  patch_size=14, image_size=224)
    text = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16)
    with torch.device("meta"):
        clip = CLIPModel(CLIPConfig(vision_config=vision, text_config=text, projection_dim=1024))
        with FlopCounterMode(display=False) as counter:
            clip(input_ids=torch.zeros(1, 77, dtype=torch.long), pixel_values=torch.zeros(1, 3, 224, 224))
    return counter.get_total_flops()


def iteration_cost(by: dict, args, n: int, per_reward: int) -> str:
    """One iteration's cost per trajectory (the module docstring): Flow-GRPO, then TP-GRPO with each judge."""
    W, per_decode, train = args.window, by["d"]["flops"] / n, by["e"]["flops"] / n
    lines = [f"{'':>5}  one iteration per trajectory: {'evals':>6} {'sampling':>9} {'decodes':>7} {'VAE':>8} "
             f"{'reward':>8} {'training':>8} {'total':>8} {'vs Flow':>7} (TFLOP; seconds without the reward model)"]
    base = None
    # images decoded and scored per trajectory: W M + 1 (the final one and M completions of each other window state;
    # M = 1 but for mc:M)
    for name, phase, images in [("Flow-GRPO", "a", 1), ("TP-GRPO, judge ode", "c", W + 1)] + \
            [(f"TP-GRPO, judge {j}", f"c:{j}", W * max(S.parse_completion(j).continuations, 1) + 1)
             for j in args.judges]:
        sampling = by[phase]["flops"] / n
        total = sampling + images * (per_decode + per_reward) + train
        base = base or total
        seconds = None if by[phase]["seconds"] is None else \
            (by[phase]["seconds"] + images * by["d"]["seconds"] + by["e"]["seconds"]) / n
        lines.append(f"{n:>5}  {name:<30} {by[phase]['nfe']:>6.0f} {sampling / 1e12:>9.3g} {images:>7} "
                     f"{images * per_decode / 1e12:>8.3g} {images * per_reward / 1e12:>8.3g} {train / 1e12:>8.3g} "
                     f"{total / 1e12:>8.3g} {total / base:>7.2f}" + (f" ({seconds:.3g} s)" if seconds else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
