"""Flow-matching sampling for TP-GRPO: SDE/ODE steps with log-probs, windowed rollouts, ODE completions.

Implements paper Sec. 3 "Preliminaries" and Sec. 4.1 "step-wise incremental rewards" (docs/method.md, from
'Flow matching and the Euler ODE step' to 'The batched wavefront'), written once for both of the paper's models
(models.py holds what differs between SD3.5-Medium and FLUX.1-dev: loading, the grid, the velocity, decoding):

  1. the Euler ODE step and the two stochastic steps (`sde_step`: Flow-GRPO's reverse SDE; `cps_step`:
     coefficients-preserving sampling) with what the PPO ratio is formed from and the std used by the KL term,
  2. per-trajectory seeds: every trajectory is replayable from (seed, iteration, prompt, member); an iteration's
     other random streams (prompts, shuffling, the window's start) are named once (STREAMS),
  3. the paper's version: `rollout`, B prompts x G members whose steps w0 .. w0+W-1 are stochastic (the "SDE
     window"), and `complete_naive`, the ODE completions R(s_k) needs: every window state s_k finished with the
     Euler ODE on the rest of the same grid, one state at a time,
  4. the fast path train.py runs: `wavefront_rollout` computes the same rollout and completions as a "wavefront":
     one transformer call per grid index for the rollout state and every live completion branch, reusing the
     rollout's velocity at each branch's first step (55 instead of 64 network evaluations per trajectory for
     T = 10, W = 9, in T calls instead of 64); tests/test_sampler.py checks it against section 3,
  5. plain ODE sampling of images for evaluation (`generate`).

Run `python bench.py` to count and time it; `python -m pytest tests/test_sampler.py` to check it.

Shape legend: B prompts, G group size, N = B*G trajectories (or any batch of them), T steps, W window length,
C/h/w latent channels/height/width (docs/method.md, 'Notation'), H'/W' decoded pixels. A latent is (C, h, w) for
SD3 and FLUX's packed tokens (h/2 * w/2, 4C) for FLUX: the code below is written once for both and its comments
use the SD3 form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from models import Cond, EvalCounter, decode, encode_prompts, latent_shape, sigma_grid, velocity

SAMPLERS = ("sde", "cps")

# ----------------------------------------------------------------------------------------------------------------
# 1. One step: ODE, and the two stochastic samplers with log-probabilities (docs/method.md, 'The sde step',
#    'The cps step'). Pure functions, float32.
# ----------------------------------------------------------------------------------------------------------------


def _per_sample(sigma, like: torch.Tensor) -> torch.Tensor:
    """A scalar or (n,) sigma as (n, 1, 1, 1) float32 on the device of `like`, ready to broadcast."""
    sigma = torch.as_tensor(sigma, dtype=torch.float32, device=like.device)
    return sigma.reshape(-1, *([1] * (like.dim() - 1))).expand(like.shape[0], *([1] * (like.dim() - 1)))


def ode_step(x: torch.Tensor, v: torch.Tensor, sigma, sigma_next) -> torch.Tensor:
    """Euler ODE step, Sec. 3: x_{i+1} = x_i + (sigma_{i+1} - sigma_i) v(x_i, sigma_i)."""
    x, v = x.float(), v.float()
    return x + (_per_sample(sigma_next, x) - _per_sample(sigma, x)) * v  # (n, C, h, w)


@dataclass
class StepOut:
    next: torch.Tensor  # (n, C, h, w) x' (the given one when evaluating a stored sample)
    # (n,) the step's log-weight, what the PPO ratio is formed from: rho = exp(log_weight - log_weight_old). For "sde"
    # the log-probability log p(x' | x), mean over non-batch dims; for "cps" the demo code's unnormalised stand-in
    # for it, -mean((x' - mean)^2), not a log-probability (cps_step)
    log_weight: torch.Tensor
    mean: torch.Tensor  # (n, C, h, w) mean of p(. | x)
    std_kl: torch.Tensor  # (n,) what the KL term divides by (docs/method.md, 'The KL to the reference policy')


def stochastic_step(x: torch.Tensor, v: torch.Tensor, sigma, sigma_next, noise_level: float, *, kind: str = "cps",
                    noise: torch.Tensor | None = None, next_sample: torch.Tensor | None = None) -> StepOut:
    """The SDE window's step from sigma to sigma' < sigma: `kind` "sde" (sde_step) or "cps" (cps_step). Samples x'
    with `noise` (eps ~ N(0, I), (n, C, h, w)), or scores a stored `next_sample` x' (training): exactly one of the
    two. With noise_level a = 0 both are the Euler ODE step. Everything is float32: bf16/fp16 overflow in the mean.
    """
    if kind not in SAMPLERS:
        raise ValueError(f"unknown sampler '{kind}'; use one of {SAMPLERS}")
    if (noise is None) == (next_sample is None):
        raise ValueError("pass exactly one of noise= (to sample) and next_sample= (to score a stored sample)")
    x, v = x.float(), v.float()
    step = sde_step if kind == "sde" else cps_step
    return step(x, v, _per_sample(sigma, x), _per_sample(sigma_next, x), noise_level, noise=noise,
                next_sample=next_sample)


def sde_step(x, v, sigma, sigma_next, noise_level, *, noise, next_sample) -> StepOut:
    """Flow-GRPO's step, Euler-Maruyama on the reverse SDE (docs/method.md, 'The sde step'). x, v (n, C, h, w)
    float32; sigma, sigma_next: sigma and sigma' as (n, 1, 1, 1); `noise` or `next_sample` as in stochastic_step."""
    # dt = sigma' - sigma < 0
    dt = sigma_next - sigma
    # std = a sqrt(sigma / (1 - sigma)); at sigma = 1 the denominator uses 1 - sigma_1 (= 1 - sigma' there)
    std = noise_level * torch.sqrt(sigma / torch.where(sigma == 1, 1 - sigma_next, 1 - sigma))  # (n, 1, 1, 1)
    # mean = x (1 + std^2 dt / (2 sigma)) + v (1 + std^2 (1 - sigma) / (2 sigma)) dt
    mean = x * (1 + std**2 * dt / (2 * sigma)) + v * (1 + std**2 * (1 - sigma) / (2 * sigma)) * dt  # (n, C, h, w)
    # x' = mean + std sqrt(-dt) eps: the transition's actual standard deviation
    scale = std * torch.sqrt(-dt)  # (n, 1, 1, 1)
    x_next = mean + scale * noise if next_sample is None else next_sample.float()  # (n, C, h, w)
    # log N(x'; mean, scale^2) = -(x' - mean)^2 / (2 scale^2) - log scale - log sqrt(2 pi), mean over dims.
    # A deterministic step (scale = 0) gets log-prob 0: ratio 1, no gradient, never NaN.
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    log_density = -((x_next - mean) ** 2) / (2 * safe**2) - torch.log(safe) - 0.5 * math.log(2 * math.pi)
    log_prob = torch.where(scale > 0, log_density, torch.zeros_like(log_density)).mean(tuple(range(1, x.dim())))
    # the KL divides by std, not scale = std sqrt(-dt), as the demo code (docs/method.md, 'The KL to the reference
    # policy')
    return StepOut(x_next, log_prob, mean, std.flatten())  # log_weight = log_prob, std_kl (n,)


def cps_step(x, v, sigma, sigma_next, noise_level, *, noise, next_sample) -> StepOut:
    """Coefficients-preserving sampling (docs/method.md, 'The cps step'). Arguments as sde_step."""
    # predicted clean image and noise: x0_hat = x - sigma v, x1_hat = x + (1 - sigma) v
    x0_hat = x - sigma * v  # (n, C, h, w)
    x1_hat = x + (1 - sigma) * v  # (n, C, h, w)
    # scale = sigma' sin(a pi / 2): the injected noise's std, the transition's; the predicted noise keeps the rest of
    # sigma'^2
    scale = sigma_next * math.sin(noise_level * math.pi / 2)  # (n, 1, 1, 1)
    # mean = (1 - sigma') x0_hat + sqrt(sigma'^2 - scale^2) x1_hat
    mean = (1 - sigma_next) * x0_hat + torch.sqrt((sigma_next**2 - scale**2).clamp_min(0)) * x1_hat  # (n, C, h, w)
    # x' = mean + scale eps
    x_next = mean + scale * noise if next_sample is None else next_sample.float()  # (n, C, h, w)
    # The demo code's stand-in for log p: -mean((x' - mean)^2) = 2 scale^2 (log N(x'; mean, scale^2) + const), mean
    # over dims; its ratio exp(difference) is the true ratio to the power 2 scale^2, and the demo's ratio clip (1e-5)
    # was tuned to it, so we keep it (docs/method.md, 'The cps step')
    neg_sq_dist = -((x_next - mean) ** 2).mean(tuple(range(1, x.dim())))  # (n,)
    # the KL divides by the exact per-step noise std, scale (0 on the last step, sigma' = 0)
    return StepOut(x_next, neg_sq_dist, mean, scale.flatten())  # log_weight, std_kl (n,)


# ----------------------------------------------------------------------------------------------------------------
# 2. Seeds: every trajectory is replayable from (seed, iteration, prompt, member), whatever the batch layout;
#    the iteration's other random streams by name
# ----------------------------------------------------------------------------------------------------------------


def member_seed(seed: int, iteration: int, prompt: int, member: int) -> int:
    """A 63-bit seed mixed from the four integers (numpy's SeedSequence: well-spread, no collisions in practice).
    A prompt slot below 0 is one of the iteration's other random streams (STREAMS, stream_seed)."""
    return _mix(seed, iteration, prompt, member)


def continuation_seed(seed: int, iteration: int, prompt: int, member: int, k: int, m: int) -> int:
    """The seed of continuation m of trajectory (prompt, member)'s window state s_k (the mc:M judge, the judge
    audit): every continuation replayable alone, as every trajectory is."""
    return _mix(seed, iteration, prompt, member, k, m)


def _mix(*values: int) -> int:
    words = [v % 2**32 for v in values]  # SeedSequence takes non-negative words
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> 1)


# An iteration's random streams besides its trajectories' noise, in member_seed's prompt slot (never a prompt index):
# which prompts are drawn, how the rows are shuffled into updates, where a random window starts, the judge audit's
# continuations (continuation_seed's prompt slot)
STREAMS = {"prompts": -1, "shuffle": -2, "window": -3, "audit": -4}


def stream_seed(seed: int, iteration: int, stream: str, rank: int = 0) -> int:
    """The seed of one of an iteration's STREAMS (`rank`: a process's own stream, for what each process draws)."""
    return member_seed(seed, iteration, STREAMS[stream], rank)


def draw_prompts(num_prompts: int, B: int, seed: int, iteration: int) -> torch.Tensor:
    """B prompt indices for this iteration from its "prompts" stream, the same on every process (without replacement
    when possible)."""
    g = torch.Generator().manual_seed(stream_seed(seed, iteration, "prompts"))
    if B <= num_prompts:
        return torch.randperm(num_prompts, generator=g)[:B]  # (B,)
    return torch.randint(num_prompts, (B,), generator=g)  # (B,)


def make_generators(seeds: list[int]) -> list[torch.Generator]:
    """One CPU generator per trajectory: noise is drawn on the CPU, so it is the same on every device."""
    return [torch.Generator("cpu").manual_seed(s) for s in seeds]


def continuation_generators(seed: int, iteration: int, trajectories: list[tuple[int, int]], M: int):
    """k -> the M x n generators of the continuations of the n `trajectories`' window state s_k (each trajectory a
    (prompt, member) pair; the judge audit's are (STREAMS["audit"], trajectory id): another stream), m-major: block m
    holds every trajectory's continuation m, the rows of `continue_naive` and of wavefront_rollout's continuations."""
    def of(k: int) -> list[torch.Generator]:
        return make_generators([continuation_seed(seed, iteration, p, q, k, m) for m in range(M)
                                for p, q in trajectories])
    return of


def draw_noise(generators: list[torch.Generator], shape: tuple[int, ...], device) -> torch.Tensor:
    """eps ~ N(0, I) for each trajectory from its own generator: (n, *shape)."""
    return torch.stack([torch.randn(shape, generator=g) for g in generators]).to(device)  # (n, C, h, w)


# ----------------------------------------------------------------------------------------------------------------
# 3. The paper's version: a rollout with an SDE window (Algorithm 1), then every window state finished by the ODE
#    (Sec. 4.1; docs/method.md, 'Rollout with an SDE window', 'Incremental rewards via ODE completions')
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """What training needs from a batch of n trajectories. Window step k (1..W) takes s_{k-1} to s_k at grid
    index w0 + k - 1, i.e. from sigmas[w0 + k - 1] to sigmas[w0 + k]."""

    sigmas: torch.Tensor  # (T+1,)
    timesteps: torch.Tensor  # (T,)
    w0: int
    window: int  # W
    x_T: torch.Tensor  # (n, C, h, w) the initial noise
    states: torch.Tensor  # (n, W+1, C, h, w) s_0 .. s_W
    log_weights: torch.Tensor  # (n, W) step k's log-weight (StepOut) at sampling time, column k - 1: log_weight_old
    final: torch.Tensor  # (n, C, h, w) x_0, the trajectory's image latent
    # (n, W*M+1, C, h, w) the completions of s_0 .. s_{W-1}, M of each (mc:M; M = 1 for the ODE judges), then `final`
    # (s_W's); `judge_rewards` turns their rewards into R_0 .. R_W
    completions: torch.Tensor | None = None
    continuations: int = 1  # M
    counter: EvalCounter = field(default_factory=EvalCounter)


def check_window(steps: int, w0: int, window: int) -> None:
    if not (window >= 1 and 0 <= w0 and w0 + window <= steps):
        raise ValueError(f"SDE window [w0={w0}, w0+W={w0 + window}) must lie inside the {steps} steps; "
                         f"choose 0 <= w0 and 1 <= W <= T - w0")


def grid_step(x: torch.Tensor, v: torch.Tensor, i: int, generators: list[torch.Generator], *, sigmas: torch.Tensor,
              w0: int, window: int, noise_level: float, kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Algorithm 1's step at grid index i from the velocity v (n, C, h, w). Inside the window, window step
    k = i - w0 + 1 draws s_k ~ p(. | s_{k-1}) (Sec. 3) with each trajectory's own generator: returns s_k and the
    step's log-weight (n,) for the PPO ratio. Outside it the Euler ODE step: returns x_{i+1} and None."""
    if w0 <= i < w0 + window:
        out = stochastic_step(x, v, sigmas[i], sigmas[i + 1], noise_level, kind=kind,
                              noise=draw_noise(generators, x.shape[1:], x.device))
        return out.next, out.log_weight  # (n, C, h, w), (n,)
    return ode_step(x, v, sigmas[i], sigmas[i + 1]), None  # (n, C, h, w)


@torch.no_grad()
def rollout(transformer, cond: Cond, x_T: torch.Tensor, generators: list[torch.Generator], *, sigmas: torch.Tensor,
            timesteps: torch.Tensor, w0: int, window: int, noise_level: float, kind: str,
            guidance_scale: float) -> Rollout:
    """Sample n trajectories over the T-step grid: grid indices w0 .. w0+W-1 take the stochastic step (`kind`,
    noise level a), every other index the Euler ODE step; keep the window states s_0 .. s_W and the log-probs of
    the W stochastic steps. `complete_naive` then finishes every window state; `wavefront_rollout` is the same
    computation in fewer, larger calls (what train.py runs)."""
    steps, n = len(timesteps), x_T.shape[0]
    check_window(steps, w0, window)
    counter = EvalCounter()
    x = x_T.float()  # (n, C, h, w)
    states, log_weights = [], []  # s_0 .. s_W; the W steps' log-weights
    for i in range(steps):  # Algorithm 1: from sigma_0 = 1 down to sigma_T = 0
        v = velocity(transformer, x, timesteps[i].expand(n), cond, guidance_scale, counter=counter)  # (n, C, h, w)
        states += [x] if i == w0 else []  # s_0, where the window starts
        x, log_weight = grid_step(x, v, i, generators, sigmas=sigmas, w0=w0, window=window, noise_level=noise_level,
                                  kind=kind)  # (n, C, h, w)
        if log_weight is not None:  # window step k = i - w0 + 1 took s_{k-1} to s_k
            states.append(x)
            log_weights.append(log_weight)
    return Rollout(sigmas, timesteps, w0, window, x_T.float(), states=torch.stack(states, 1),
                   log_weights=torch.stack(log_weights, 1), final=x, counter=counter)  # (n, W+1, C, h, w), (n, W)


@torch.no_grad()
def ode_complete(transformer, x: torch.Tensor, start: int, cond: Cond, *, sigmas: torch.Tensor,
                 timesteps: torch.Tensor, guidance_scale: float, counter: EvalCounter | None = None,
                 completion_steps: int | None = None) -> torch.Tensor:
    """Euler ODE from a state at grid index `start` down to sigma_T = 0 on the same grid, or on its sub-grid of at
    most completion_steps steps (`completion_grid`): (n, C, h, w)."""
    x = x.float()
    grid = completion_grid(start, len(timesteps), completion_steps)
    for i, i_next in zip(grid[:-1], grid[1:]):
        v = velocity(transformer, x, timesteps[i].expand(x.shape[0]), cond, guidance_scale,
                     counter=counter)  # (n, C, h, w)
        x = ode_step(x, v, sigmas[i], sigmas[i_next])  # (n, C, h, w)
    return x


@torch.no_grad()
def complete_naive(transformer, ro: Rollout, cond: Cond, guidance_scale: float, *, counter: EvalCounter | None = None,
                   completion_steps: int | None = None) -> torch.Tensor:
    """ODE-complete(s_k) for k = 0..W, one window state at a time (the demo code's layout, with R_0 from the
    trajectory's own x_T): (n, W+1, C, h, w); index W is the rollout's own final latent."""
    # DEVIATION: R_0 completes s_0, reached from this trajectory's own x_T; the demo code draws fresh noise for it
    # (docs/deviations.md, 'R_0 from the trajectory's own noise').
    finished = [ode_complete(transformer, ro.states[:, k], ro.w0 + k, cond, sigmas=ro.sigmas, timesteps=ro.timesteps,
                             guidance_scale=guidance_scale, counter=counter, completion_steps=completion_steps)
                for k in range(ro.window)]  # W x (n, C, h, w)
    return torch.stack(finished + [ro.final], 1)  # (n, W+1, C, h, w)


@torch.no_grad()
def continue_naive(transformer, states: torch.Tensor, cond: Cond, generators, *, w0: int, sigmas: torch.Tensor,
                   timesteps: torch.Tensor, guidance_scale: float, noise_level: float, kind: str, continuations: int,
                   counter: EvalCounter | None = None) -> torch.Tensor:
    """The mc:M judge's completions, one window state at a time: each s_k (k < W) of `states` (n, W+1, C, h, w)
    continued M times by the training sampler itself (`grid_step`: the stochastic step (`kind`, noise level a)
    through the window's last grid index, the Euler ODE after it), continuation m's noise from its own generator
    (`generators(k)`: M x n, m-major, `continuation_generators`). The M continuations of s_k share their first
    velocity, v(s_k). Returns (n, W*M, C, h, w), s_k's M finals at columns k*M .. k*M + M - 1 (the layout of
    Rollout.completions)."""
    n, W, M = states.shape[0], states.shape[1] - 1, continuations
    rows = torch.arange(n, device=cond.embeds.device).repeat(M)  # (M*n,) each copy's prompt row
    finals = []
    for k in range(W):
        gens = generators(k)
        x = states[:, k].float()  # (n, C, h, w) s_k, at grid index w0 + k
        for i in range(w0 + k, len(timesteps)):
            v = velocity(transformer, x, timesteps[i].expand(x.shape[0]), cond if i == w0 + k else cond.rows(rows),
                         guidance_scale, counter=counter)  # (n or M*n, C, h, w)
            if i == w0 + k:  # the M copies of s_k start from its one velocity
                x, v = (y.repeat(M, *[1] * (y.dim() - 1)) for y in (x, v))  # (M*n, C, h, w) each
            x, _ = grid_step(x, v, i, gens, sigmas=sigmas, w0=w0, window=W, noise_level=noise_level,
                             kind=kind)  # (M*n, C, h, w)
        finals.append(x.unflatten(0, (M, n)).transpose(0, 1))  # (n, M, C, h, w)
    return torch.cat(finals, 1)  # (n, W*M, C, h, w)


@dataclass(frozen=True)
class Judge:
    """How R_k judges a window state s_k (--completion; docs/method.md, 'Cheaper judges', 'The stochastic truth as a
    judge'): the Euler ODE over `steps` steps (None: the whole remaining grid), or with continuations M > 0 the mean
    reward of M continuations by the training sampler itself."""

    steps: int | None = None
    continuations: int = 0  # M (0: an ODE judge)


def parse_completion(spec: str) -> Judge:
    """The --completion judge: "ode" (the paper's: the whole remaining grid), "ode:K" (K >= 1 Euler steps), "x0"
    (x0_hat = s_k - sigma_k v(s_k): the one-step completion with the rollout's own velocity, the same as "ode:1") or
    "mc:M" (M >= 1 continuations by the training sampler). Anything else raises a one-line ValueError."""
    if spec in ("ode", "x0"):
        return Judge(steps=None if spec == "ode" else 1)
    name, _, k = spec.partition(":")
    if name in ("ode", "mc") and k.isdigit() and int(k) >= 1:
        return Judge(steps=int(k)) if name == "ode" else Judge(continuations=int(k))
    raise ValueError(f"unknown completion '{spec}'; use ode, ode:K with K >= 1 Euler steps, x0, or mc:M with M >= 1 "
                     f"continuations")


def judge_rewards(scores: torch.Tensor, M: int) -> torch.Tensor:
    """The rewards of a rollout's completions (n, W*M+1), laid out as Rollout.completions, -> R (n, W+1): R_k the
    mean over s_k's M completions (one for the ODE judges: R_k itself), R_W the final image's."""
    # R_k = (1/M) sum_m R(x_0^(k, m)), k < W; R_W = R(x_0), the trajectory's own image
    return torch.cat([scores[:, :-1].unflatten(1, (-1, M)).mean(2), scores[:, -1:]], 1)  # (n, W+1)


def completion_grid(start: int, steps: int, completion_steps: int | None) -> list[int]:
    """The grid indices a completion from grid index `start` visits down to sigma_T = 0: all of them (None), or
    K + 1 evenly spaced ones, rounded down, when K = completion_steps < T - start: start + floor(m (T - start) / K),
    m = 0..K (docs/method.md, 'Cheaper judges'). The first and last are always start and T."""
    K = steps - start if completion_steps is None else min(completion_steps, steps - start)
    return [start + m * (steps - start) // K for m in range(K + 1)]


# ----------------------------------------------------------------------------------------------------------------
# 4. The fast path: the rollout and its completions as one batched wavefront (docs/method.md, 'The batched
#    wavefront'), equal to section 3 up to float rounding (tests/test_sampler.py)
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Branch:
    """One completion in flight: ODE-complete(s_k) of n trajectories, walking down its grid indices."""

    state: torch.Tensor  # (n, C, h, w) where the completion has got to
    grid: list[int]  # the grid indices it visits (completion_grid): w0 + k, ..., T
    at: int = 0  # its position in `grid`: the state sits at grid index grid[at]

    @property
    def index(self) -> int:
        return self.grid[self.at]

    def advance(self, v: torch.Tensor, sigmas: torch.Tensor) -> None:
        """One Euler step with the velocity v (n, C, h, w) at its grid index, to its next one."""
        self.state = ode_step(self.state, v, sigmas[self.index], sigmas[self.grid[self.at + 1]])  # (n, C, h, w)
        self.at += 1


@dataclass
class Continuation(Branch):
    """mc:M's completions of s_k in flight (M blocks of the n trajectories, M*n rows): the training sampler's own
    step (`grid_step`) at every grid index, stochastic with each row's generator inside the window, the ODE after."""

    generators: list = field(default_factory=list)  # M*n, m-major (continuation_generators)
    w0: int = 0
    window: int = 0
    noise_level: float = 0.0
    kind: str = "cps"

    def advance(self, v: torch.Tensor, sigmas: torch.Tensor) -> None:
        self.state, _ = grid_step(self.state, v, self.index, self.generators, sigmas=sigmas, w0=self.w0,
                                  window=self.window, noise_level=self.noise_level, kind=self.kind)  # (M*n, C, h, w)
        self.at += 1


@torch.no_grad()
def wavefront_rollout(transformer, cond: Cond, x_T: torch.Tensor, generators: list[torch.Generator], *,
                      sigmas: torch.Tensor, timesteps: torch.Tensor, w0: int, window: int, noise_level: float,
                      kind: str, guidance_scale: float, complete: bool = True, completion_steps: int | None = None,
                      continuations: int = 0, continuation_generators=None, chunk_size: int | None = None) -> Rollout:
    """`rollout` (same arguments, same trajectories) and, with complete=True, ODE-complete(s_k) for k = 0..W as
    `complete_naive` computes them, in T transformer calls: the branch started at s_k takes its first Euler step
    with the velocity the rollout just computed at s_k (an exact reuse), and every later step of a branch is taken
    at a grid index the rollout visits, so one call per grid index evaluates the rollout state and every branch
    sitting there. completion_steps K (None: the whole remaining grid, the paper's) finishes each state in at most
    K Euler steps on `completion_grid`'s sub-grid; K = 1 (x0_hat) costs no call at all. continuations M > 0 (mc:M)
    finishes each state as `continue_naive` does instead, M continuations by the training sampler
    (continuation_generators(k): their M x n generators), M blocks of rows in the same calls, the first step again
    the rollout's v(s_k). chunk_size caps the images per call (peak memory) without changing any result;
    complete=False: the plain rollout in such chunks.
    """
    steps, n = len(timesteps), x_T.shape[0]
    check_window(steps, w0, window)
    counter = EvalCounter()
    x = x_T.float()  # (n, C, h, w)
    states, log_weights, branches = [], [], []  # as in `rollout`; the completion branches in flight
    # Which states share each call, for T = 4, W = 2 (b_k: the n completion branches of s_k; K = 2: b_0 takes the
    # grid indices 0 -> 2 -> 4, b_1 takes 1 -> 2 -> 4):
    #   grid index i        0      1          2              3
    #   full ODE            x      x, b_0     x, b_0, b_1    x, b_0, b_1     9 evaluations per trajectory
    #   K = 2               x      x          x, b_0, b_1    x               6
    # b_k's first step (at i = k) uses the rollout's v(s_k) and needs no call of its own.
    M = max(continuations, 1)  # completions of each state
    for i in range(steps):
        here = [b for b in branches if b.index == i]  # the branches sitting at grid index i
        stacked = torch.cat([x] + [b.state for b in here])  # (n + rows of the branches here, C, h, w)
        v_all = _chunked_velocity(transformer, stacked, timesteps[i], cond, guidance_scale, counter=counter,
                                  chunk_size=chunk_size)  # (n + rows of the branches here, C, h, w)
        v = v_all[:n]  # (n, C, h, w) the rollout state's
        for b, v_b in zip(here, v_all[n:].split([b.state.shape[0] for b in here])):
            b.advance(v_b, sigmas)
        if complete and w0 <= i < w0 + window:  # a new branch from s_k; its first step reuses v(s_k, sigma_{w0+k})
            if continuations:  # mc:M: M copies of s_k, each continued with its own noise
                branches.append(Continuation(x.repeat(M, *[1] * (x.dim() - 1)), completion_grid(i, steps, None),
                                             generators=continuation_generators(i - w0), w0=w0, window=window,
                                             noise_level=noise_level, kind=kind))
            else:
                branches.append(Branch(x, completion_grid(i, steps, completion_steps)))
            branches[-1].advance(v.repeat(M, *[1] * (v.dim() - 1)), sigmas)
        states += [x] if i == w0 else []  # s_0
        x, log_weight = grid_step(x, v, i, generators, sigmas=sigmas, w0=w0, window=window, noise_level=noise_level,
                                  kind=kind)  # (n, C, h, w)
        if log_weight is not None:  # s_k after window step k
            states.append(x)
            log_weights.append(log_weight)
    completions = None
    if complete:  # the M completions of s_0 .. s_{W-1} (rows m*n + j: trajectory j's m-th), then s_W's: the rollout
        done = torch.stack([b.state.unflatten(0, (M, n)).transpose(0, 1) for b in branches], 1)  # (n, W, M, C, h, w)
        completions = torch.cat([done.flatten(1, 2), x[:, None]], 1)  # (n, W*M+1, C, h, w)
    return Rollout(sigmas, timesteps, w0, window, x_T.float(), states=torch.stack(states, 1),
                   log_weights=torch.stack(log_weights, 1), final=x, completions=completions, continuations=M,
                   counter=counter)


def _chunked_velocity(transformer, x: torch.Tensor, timestep: torch.Tensor, cond: Cond, guidance_scale: float, *,
                      counter: EvalCounter, chunk_size: int | None) -> torch.Tensor:
    """velocity() on x (n*copies, C, h, w): `copies` stacked blocks of the n rows of `cond`, in chunks of at most
    chunk_size images."""
    n = cond.embeds.shape[0]
    rows = torch.arange(n, device=cond.embeds.device).repeat(x.shape[0] // n)  # (n*copies,) each image's prompt row
    size = x.shape[0] if chunk_size is None else chunk_size
    out = []
    for start in range(0, x.shape[0], size):
        part = slice(start, start + size)
        t = timestep.expand(x[part].shape[0])  # (m,)
        out.append(velocity(transformer, x[part], t, cond.rows(rows[part]), guidance_scale, counter=counter))
    return torch.cat(out)  # (n*copies, C, h, w)


# ----------------------------------------------------------------------------------------------------------------
# 5. Evaluation's sampler: the plain ODE from x_T
# ----------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def generate(pipe, prompts: list[str], seeds: list[int], *, steps: int, guidance_scale: float, resolution: int,
             max_sequence_length: int = 128, batch_size: int = 16, transformer=None) -> torch.Tensor:
    """Plain ODE sampling (evaluation): one image per (prompt, seed), in [0, 1], (N, 3, H', W') on the CPU.

    Seeds make each image independent of batch size and process count, as in training. `transformer`: what to
    call instead of pipe.transformer (its compiled form, models.CompiledTransformer).
    """
    transformer = transformer or pipe.transformer
    shape = latent_shape(pipe, resolution)
    sigmas, timesteps = sigma_grid(pipe.scheduler, steps, shape)
    images = []
    for start in range(0, len(prompts), batch_size):
        part = prompts[start:start + batch_size]
        cond = encode_prompts(pipe, part, guidance_scale, max_sequence_length)
        x_T = draw_noise(make_generators(seeds[start:start + batch_size]), shape, pipe.transformer.device)
        x_0 = ode_complete(transformer, x_T, 0, cond, sigmas=sigmas, timesteps=timesteps,
                           guidance_scale=guidance_scale)  # (b, C, h, w)
        images.append(decode(pipe, x_0).cpu())  # (b, 3, H', W')
    return torch.cat(images)  # (N, 3, H', W')
