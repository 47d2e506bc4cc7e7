"""Benchmark of the credit-assignment cost (SPEC 4): what TP-GRPO's ODE completions cost per trajectory.

Three layouts of the same work for a batch of n trajectories, T steps, an SDE window of W steps from w0 = 0:

  (a) Flow-GRPO rollout: T transformer calls, T evaluations per trajectory, no completion.
  (b) TP-GRPO as the authors' demo code lays it out: the rollout, a separate pure-ODE run for R_0, then one ODE
      completion per window state, one after the other (sampler.complete_naive): 64 evaluations for T=10, W=9.
  (c) TP-GRPO batched (sampler.rollout(complete=True)): the wavefront, 55 evaluations in T calls.

An evaluation is one image through the transformer at one step (a CFG pair counts once); calls are forward
passes. Wall times are medians over --repeats runs after one warm-up.

  python bench.py                          # the tiny random-weight pipeline on the CPU (< 2 minutes on 2 cores)
  python bench.py --size sd35m --device cuda --dtype bf16 --batches 8 24
                                           # SD3.5-M-sized transformer with random weights, 512 px, no download

Shape legend: n trajectories per batch, C/H/W latent, L text tokens, D text width, P pooled width.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

import sampler as S

# SD3.5-Medium's published transformer config (stabilityai/stable-diffusion-3.5-medium, transformer/config.json):
# MMDiT-X, 24 blocks of width 1536, dual attention in blocks 0-12, RMS QK-norm; 16 latent channels; 512 px ->
# 64x64 latents. Text: 77 CLIP + 256 T5 tokens of width 4096, pooled CLIP-L + CLIP-G of width 2048.
SD35M_TRANSFORMER = dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24,
                         attention_head_dim=64, num_attention_heads=24, joint_attention_dim=4096,
                         caption_projection_dim=1536, pooled_projection_dim=2048, pos_embed_max_size=384,
                         dual_attention_layers=tuple(range(13)), qk_norm="rms_norm")


def build(size: str, device: str, dtype: torch.dtype, n: int, guidance: float):
    """The transformer, the scheduler config source and a Cond for n images, plus the latent shape."""
    if size == "tiny":
        pipe = S.load_pipeline("tiny", device=device)
        cond = S.encode_prompts(pipe, ["a photo of four books"], guidance, max_sequence_length=32).repeat(n)
        return pipe.transformer, pipe.scheduler, cond, S.latent_shape(pipe, 16)
    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(**SD35M_TRANSFORMER).to(device, dtype).eval().requires_grad_(False)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)  # SD3.5-M's scheduler config
    g = torch.Generator("cpu").manual_seed(0)
    text = lambda *shape: torch.randn(*shape, generator=g).to(device, dtype)  # noqa: E731
    cond = S.Cond(text(n, 333, 4096), text(n, 2048), text(n, 333, 4096), text(n, 2048))  # (n, L, D), (n, P)
    return transformer, scheduler, cond, (16, 64, 64)


def timed(fn, repeats: int, device: str):
    """Median wall time of fn() over `repeats` runs after one warm-up, and fn()'s last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def bench_batch(args, n: int) -> list[dict]:
    transformer, scheduler, cond, shape = build(args.size, args.device, args.dtype, n, args.guidance)
    sigmas, timesteps = S.sigma_grid(scheduler, args.steps)

    def run(complete: bool, naive: bool):
        gens = S.make_generators([S.member_seed(0, 0, 0, m) for m in range(n)])
        x_T = S.draw_noise(gens, shape, args.device)  # (n, C, H, W)
        ro = S.rollout(transformer, cond, x_T, gens, sigmas, timesteps, 0, args.window, args.noise_level, "cps",
                       args.guidance, complete=complete, chunk_size=args.chunk_size)
        counter = S.EvalCounter(ro.counter.evals, ro.counter.calls)
        if naive:
            S.complete_naive(transformer, ro, cond, args.guidance, counter)
        return counter

    rows = []
    for name, complete, naive in [("(a) Flow-GRPO rollout", False, False),
                                  ("(b) TP-GRPO, demo-code layout", False, True),
                                  ("(c) TP-GRPO, batched wavefront", True, False)]:
        seconds, counter = timed(lambda: run(complete, naive), args.repeats, args.device)
        rows.append(dict(batch=n, layout=name, evals=counter.evals / n, calls=counter.calls, seconds=seconds))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["tiny", "sd35m"], default="tiny", help="tiny pipeline or SD3.5-M-sized")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="transformer precision")
    p.add_argument("--batches", type=int, nargs="+", default=[8, 24], help="trajectories per rollout batch (n)")
    p.add_argument("--steps", type=int, default=10, help="T, sampling steps")
    p.add_argument("--window", type=int, default=9, help="W, SDE window length (w0 = 0)")
    p.add_argument("--guidance", type=float, default=4.5, help="CFG scale w (> 1 turns CFG on)")
    p.add_argument("--noise-level", type=float, default=0.7, help="a, the CPS noise level")
    p.add_argument("--chunk-size", type=int, default=None, help="cap on images per transformer call in (c)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per cell (median reported)")
    args = p.parse_args()
    args.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.set_grad_enabled(False)

    print(f"size={args.size} device={args.device} T={args.steps} W={args.window} w0=0 CFG={args.guidance}")
    print(f"{'batch':>5}  {'layout':<32} {'evals/traj':>10} {'calls':>6} {'seconds':>9}")
    for n in args.batches:
        rows = bench_batch(args, n)
        for r in rows:
            print(f"{r['batch']:>5}  {r['layout']:<32} {r['evals']:>10.0f} {r['calls']:>6} {r['seconds']:>9.3f}")
        a, b, c = (r["seconds"] for r in rows)
        print(f"{n:>5}  {'ratio b/c (batching speed-up)':<32} {rows[1]['evals'] / rows[2]['evals']:>10.2f} "
              f"{rows[1]['calls'] / rows[2]['calls']:>6.1f} {b / c:>9.2f}")
        print(f"{n:>5}  {'ratio c/a (cost of TP credit)':<32} {rows[2]['evals'] / rows[0]['evals']:>10.2f} "
              f"{rows[2]['calls'] / rows[0]['calls']:>6.1f} {c / a:>9.2f}")


if __name__ == "__main__":
    main()
