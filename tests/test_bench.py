"""bench.py end to end: the tiny pipelines (SD3, FLUX) timed on the CPU, and SD3.5-M's shapes (random-sd35m) on
the meta device, where nothing is allocated and only FLOPs are counted (the CPU-safe check of the GPU benchmark)."""

import pytest
import torch

import bench


def _rows(results):
    return {r["layout"].split()[0]: r for r in results}


def test_tiny_bench_times_and_counts_every_phase():
    rows = _rows(bench.main(["--batches", "4", "--repeats", "1"]))
    assert torch.is_grad_enabled()  # the benchmark leaves the global autograd mode as it found it
    assert [rows[k]["nfe"] for k in ("(a)", "(b)", "(c)")] == [10, 64, 55]  # T = 10, W = 9
    assert all(r["seconds"] > 0 and r["flops"] > 0 for r in rows.values())
    # FLOPs grow with evaluations exactly: 55 / 10 for the wavefront's completions
    assert rows["(c)"]["flops"] / rows["(a)"]["flops"] == pytest.approx(5.5, rel=1e-9)
    # a training step: W steps of policy forward + reference forward + backward, vs T forward steps
    assert 2 * 9 / 10 < rows["(e)"]["flops"] / rows["(a)"]["flops"] < 5 * 9 / 10


def test_random_sd35m_on_the_meta_device_counts_flops_without_weights():
    rows = _rows(bench.main(["--size", "random-sd35m", "--device", "meta", "--dtype", "bf16", "--batches", "1",
                             "--steps", "2", "--window", "1"]))
    assert all(r["seconds"] is None and r["flops"] > 0 for r in rows.values())
    # T = 2, W = 1: the demo layout adds a pure-ODE run for R_0 (2); the wavefront one branch step from s_0 (1)
    assert [rows[k]["nfe"] for k in ("(a)", "(b)", "(c)")] == [2, 4, 3]
    # one 512 px image through SD3.5-M's transformer: ~2 x 2.2B weights x (1024 image + 205 text tokens), shared
    # between the two streams, plus attention: about 2.2 TFLOP (a CFG pair is two images)
    per_image = rows["(a)"]["flops"] / (2 * 2)
    assert 2.0e12 < per_image < 2.6e12
    assert rows["(d)"]["flops"] == rows["(d')"]["flops"] > 2e12  # decoding one 512 px image costs as much again


def test_tiny_flux_bench_at_the_flux_presets_schedule():
    """T = 6, W = 5 (pickscore-flux) on the tiny FLUX: one forward pass per image (guidance embedding, no CFG pair)."""
    rows = _rows(bench.main(["--size", "tiny-flux", "--steps", "6", "--window", "5", "--guidance", "3.5",
                             "--batches", "2", "--repeats", "1"]))
    # (b) 6 rollout + 6 pure ODE for R_0 + completions of s_1..s_4 (5 + 4 + 3 + 2); (c) 6 + 5 + 4 + 3 + 2 + 1
    assert [rows[k]["nfe"] for k in ("(a)", "(b)", "(c)")] == [6, 26, 21]
    assert [rows[k]["calls"] for k in ("(a)", "(b)", "(c)")] == [6, 26, 6]
    assert all(r["seconds"] > 0 and r["flops"] > 0 for r in rows.values())
    assert rows["(c)"]["flops"] / rows["(a)"]["flops"] == pytest.approx(21 / 6, rel=1e-9)


def test_compiled_phases_count_the_same_work_and_time_their_warm_up():
    """--compile adds (a*) and (c*): the same evaluations, calls and FLOPs as (a) and (c), a timed warm-up (dynamo's
    "eager" backend here: the tracing and the fixed-size calls without compiling kernels, see test_compile.py)."""
    rows = _rows(bench.main(["--batches", "3", "--repeats", "1", "--compile", "--compile-backend", "eager"]))
    for eager, compiled in [("(a)", "(a*)"), ("(c)", "(c*)")]:
        assert {k: rows[compiled][k] for k in ("nfe", "calls", "flops")} == \
            {k: rows[eager][k] for k in ("nfe", "calls", "flops")}
        assert rows[compiled]["seconds"] > 0 and rows[compiled]["warmup_s"] > 0


@pytest.mark.parametrize("steps,window", [(6, 5), (6, 3), (4, 1)])
def test_counted_evaluations_follow_the_formulas(steps, window):
    """Per trajectory, with the window from step 0: (a) T rollout steps; (b) the demo layout, T + a pure-ODE run for
    R_0 (T) + the completion of each s_k, k = 1..W-1 (T - k steps); (c) the wavefront, T + the completion of each
    s_k, k = 0..W-1, whose first step reuses the rollout's velocity (T - k - 1 steps); a cheaper judge, ode:K, takes
    min(K, T - k) steps there (x0: 1), again all but the first within the rollout's T calls."""
    results = bench.main(["--batches", "2", "--repeats", "1", "--steps", str(steps), "--window", str(window),
                          "--judges", "ode:2,x0"])
    by_phase = {r["phase"]: r for r in results}
    T, W = steps, window
    assert by_phase["a"]["nfe"] == T and by_phase["a"]["calls"] == T
    assert by_phase["b"]["nfe"] == T + T + sum(T - k for k in range(1, W))
    assert by_phase["c"]["nfe"] == T + sum(T - k - 1 for k in range(W)) and by_phase["c"]["calls"] == T
    assert by_phase["c:ode:2"]["nfe"] == T + sum(min(2, T - k) - 1 for k in range(W))
    assert by_phase["c:x0"]["nfe"] == T and by_phase["c:x0"]["calls"] == by_phase["c:ode:2"]["calls"] == T
