"""lab/report.py's statistics of differences between methods against independent oracles: Student's t against its
closed forms and the numerically integrated density of torch.distributions.StudentT; the seed-paired difference
against hand computation on a synthetic paired design, and beside it what treating the runs as unpaired would
say; the contrast table and the reach table's joint bootstrap on synthetic runs, with its crossing interpolated
between evaluation points and its cost ratios to Flow-GRPO with their 95% intervals, by hand."""

import dataclasses
import gzip
import json
import math

import pytest
import torch

from lab import compare as C
from lab import figures, report, stats, sweep
from test_compare import write_result


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_matches_the_closed_forms_of_one_and_two_degrees_of_freedom(p):
    assert stats.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-8)
    assert stats.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-8)


@pytest.mark.parametrize("df", [3, 4, 5, 9])
def test_t_cdf_matches_the_integrated_density(df):
    x = torch.linspace(0, 6, 60_001, dtype=torch.float64)  # (X,)
    density = torch.distributions.StudentT(df).log_prob(x).exp()  # (X,)
    cdf = 0.5 + torch.cat([torch.zeros(1, dtype=torch.float64),
                           torch.cumsum((density[1:] + density[:-1]) / 2 * (x[1] - x[0]), 0)])  # trapezoids
    for value in (0.3, 1.0, 2.5, 5.0):
        i = int(round(value * 10_000))
        assert stats.t_cdf(value, df) == pytest.approx(cdf[i].item(), abs=1e-7)
        assert stats.t_cdf(-value, df) == pytest.approx(1 - cdf[i].item(), abs=1e-7)  # symmetry


def test_t_quantiles_of_the_laboratory_and_the_normal_limit():
    assert [round(stats.t_quantile(0.975, df), 3) for df in (1, 2, 5)] == [12.706, 4.303, 2.571]  # printed tables
    # many degrees of freedom: the normal quantile z plus Cornish-Fisher's first correction (z^3 + z) / (4 df)
    z = torch.distributions.Normal(0, 1).icdf(torch.tensor(0.975, dtype=torch.float64)).item()
    assert stats.t_quantile(0.975, 2000) == pytest.approx(z + (z ** 3 + z) / 8000, abs=1e-5)


def test_a_paired_difference_against_hand_computation_and_what_unpaired_would_say():
    # seeds are blocks: a strong seed effect (0.1 .. 0.4) shared by both methods, A ahead by about 0.05 everywhere
    b = {10: 0.10, 11: 0.40, 12: 0.25, 13: 0.30}
    a = {10: 0.16, 11: 0.44, 12: 0.31, 13: 0.34}
    d = [0.06, 0.04, 0.06, 0.04]  # by hand
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    t = 3.182446305284263  # t(0.975, 3)
    c = stats.paired_difference(a, b)
    assert c["n"] == 4 and c["df"] == 3
    assert c["mean"] == pytest.approx(mean) and c["se"] == pytest.approx(sd / 2)
    assert (c["lo"], c["hi"]) == (pytest.approx(mean - t * sd / 2), pytest.approx(mean + t * sd / 2))
    assert c["resolved"]  # 0.05 +- 0.0092: the interval excludes 0
    # the same numbers as if the runs were independent: SE = sqrt(SE_a^2 + SE_b^2), dominated by the seed effect
    se = lambda v: math.sqrt(sum((x - sum(v) / 4) ** 2 for x in v) / 3) / 2  # noqa: E731
    unpaired = math.hypot(se(list(a.values())), se(list(b.values())))
    assert unpaired > 8 * c["se"] and mean - t * unpaired < 0  # unpaired, the same gap would look unresolved


def test_a_paired_difference_pairs_by_seed_and_uses_only_common_seeds():
    a = {1: 0.5, 2: 0.7, 3: 0.9}
    b = {3: 0.8, 1: 0.3}  # another order, seed 2 missing
    c = stats.paired_difference(a, b)
    assert c["n"] == 2 and c["mean"] == pytest.approx((0.2 + 0.1) / 2)
    assert not stats.paired_difference({1: 0.5}, {1: 0.1})["resolved"]  # one seed: no spread, never resolved
    assert stats.format_difference(stats.paired_difference({1: 0.5}, {2: 0.1})) == "-"


def test_the_contrast_table_is_seed_paired_and_reports_fresh_seeds_alone(tmp_path, monkeypatch):
    results = str(tmp_path / "results")
    flow, tp = C.Variant("flow-grpo"), C.Variant("tp-grpo")
    # per-seed changes: Flow-GRPO (0.1, 0.3, 0.2, 0.4), TP-GRPO the same + 0.05 + (0, 0.01, -0.01, 0)
    for s, (cf, ct) in enumerate([(0.1, 0.15), (0.3, 0.36), (0.2, 0.24), (0.4, 0.45)]):
        write_result(results, "heldout", flow, s, [0.2, 0.2], [0.2 + cf, 0.2 + cf])
        write_result(results, "heldout", tp, s, [0.2, 0.2], [0.2 + ct, 0.2 + ct])
    monkeypatch.setitem(C.EXPERIMENTS, "t", C.Experiment("t", "test", "heldout", (0, 1, 2, 3),
                                                         lambda r: {"tp-grpo": tp, "flow-grpo": flow},
                                                         contrasts=(("tp-grpo", "flow-grpo"),), fresh=(2, 3)))
    text = C.write_reports(["t"], results, str(tmp_path / "reports"))
    row = [line for line in text.splitlines() if line.startswith("| tp-grpo - flow-grpo |")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    c = stats.paired_difference({0: 0.05, 1: 0.06, 2: 0.04, 3: 0.05}, {s: 0.0 for s in range(4)})
    assert cells[1] == "4" and cells[2] == stats.format_difference(c) and cells[3] == "yes"
    assert cells[4] == stats.format_difference(stats.paired_difference({2: 0.04, 3: 0.05}, {2: 0.0, 3: 0.0}))


def test_the_reach_bootstrap_draws_the_same_seeds_for_every_method(tmp_path):
    results = str(tmp_path)
    flow, tp = C.Variant("flow-grpo", iterations=4), C.Variant("tp-grpo", iterations=4)
    # Flow-GRPO's best is at iteration 4 and differs a lot between seeds (0.4 / 0.8); TP-GRPO is exactly Flow-GRPO
    # shifted one evaluation earlier on every seed. Drawn jointly, TP-GRPO reaches the target in every draw at
    # iteration 2 and Flow-GRPO reaches its own best in every draw; drawn apart, either could miss.
    for s, top in enumerate((0.4, 0.8)):
        write_result(results, "heldout", flow, s, [0.1], [top], evals_at=(2,), rewards=(0.5,) * 4)
        write_result(results, "heldout", tp, s, [0.1], [top], evals_at=(2,), rewards=(0.5,) * 4)
        r = sweep.load_result(results, "heldout", flow, s)
        r["evals"]["iter000002"]["eval/reward"] = top / 2
        with gzip.open(sweep.result_path(results, "heldout", flow, s), "wt") as f:
            json.dump(r, f)
    runs = {"flow-grpo": (flow, [sweep.load_result(results, "heldout", flow, s) for s in (0, 1)]),
            "tp-grpo": (tp, [sweep.load_result(results, "heldout", tp, s) for s in (1, 0)])}  # another order: paired by seed
    rows = {line.split(" | ")[0].strip("| "): line.strip(" |").split(" | ")[1:] for line in
            report.reach_table(runs, "eval", samples=200).splitlines()[4:]}
    assert rows["flow-grpo"][0] == "4 (grid 4; 10-90% 4-4; never 0%)"
    assert rows["tp-grpo"][0] == "2 (grid 2; 10-90% 2-2; never 0%)"
    # and so the ratio of every draw is the same: 2 / 4 iterations at the same cost per iteration
    assert rows["tp-grpo"][2] == rows["tp-grpo"][4] == "0.50 (0.50-0.50, resolved cheaper)"


def test_calibrated_seconds_are_the_iterations_reached_times_the_seconds_per_iteration_alone(tmp_path):
    results = str(tmp_path)
    flow, tp = C.Variant("flow-grpo", iterations=4), C.Variant("tp-grpo", iterations=4)
    for s in (0, 1):
        write_result(results, "heldout", flow, s, [0.1], [0.6], evals_at=(2,), rewards=(0.5,) * 4)
        write_result(results, "heldout", tp, s, [0.1], [0.6], evals_at=(2,), rewards=(0.5,) * 4)
        r = sweep.load_result(results, "heldout", flow, s)
        r["evals"]["iter000002"]["eval/reward"] = 0.3  # Flow-GRPO reaches its best (0.6) at 4, TP-GRPO at 2
        with gzip.open(sweep.result_path(results, "heldout", flow, s), "wt") as f:
            json.dump(r, f)
    runs = {label: (v, [sweep.load_result(results, "heldout", v, s) for s in (0, 1)])
            for label, v in (("flow-grpo", flow), ("tp-grpo", tp))}
    cells = {line.split(" | ")[0].strip("| "): line.strip(" |").split(" | ")[1:] for line in
             report.reach_table(runs, "eval", samples=50, alone={"flow-grpo": 2.5}).splitlines()[4:]}
    # as measured: write_result's rows take 2.0 + 0.5 + 1.5 = 4 s per iteration; alone: 4 x 2.5 for Flow-GRPO
    assert cells["flow-grpo"] == ["4 (grid 4; 10-90% 4-4; never 0%)", "1,280", "-", "16", "-", "10", "-"]
    assert cells["tp-grpo"] == ["2 (grid 2; 10-90% 2-2; never 0%)", "640", "0.50 (0.50-0.50, resolved cheaper)", "8",
                                "0.50 (0.50-0.50, resolved cheaper)", "not measured", "-"]
    assert "seconds alone" not in report.reach_table(runs, "eval", samples=50)


def test_the_crossing_is_interpolated_linearly_between_evaluation_points():
    its = torch.tensor([0, 20, 40, 60, 80])  # (X,)
    curves = torch.tensor([[0.38, 0.49, 0.625, 0.719, 0.741],  # misses at 60 by 0.001, crosses just after
                           [0.80, 0.81, 0.820, 0.830, 0.840],  # at or above from the first point
                           [0.10, 0.20, 0.300, 0.400, 0.500],  # never
                           [0.10, 0.60, 0.400, 0.800, 0.900],  # up, down, up: the first point at or above counts
                           [0.10, 0.50, 0.300, 0.500, 0.900]], dtype=torch.float64)  # (K, X): exactly on a point
    target = torch.tensor([0.72, 0.7, 0.9, 0.7, 0.5], dtype=torch.float64)  # (K,)
    x, e = stats.crossing(its, curves, target)
    # by hand: 60 + (0.72 - 0.719) / (0.741 - 0.719) 20 = 60 + 20 / 22; 0 (no point before the first); never;
    # 40 + (0.7 - 0.4) / (0.8 - 0.4) 20 = 55 (from the point before, not from 0.6 at 20); 0 + 0.4 / 0.4 20 = 20
    assert x[0].item() == pytest.approx(60 + 20 / 22, rel=1e-9) and math.isnan(x[2])
    assert [x[1].item(), x[3].item(), x[4].item()] == [0.0, pytest.approx(55.0), pytest.approx(20.0)]
    assert e.tolist() == [4, 0, -1, 3, 1]  # the grid values: iterations 80, 0, never, 60, 20


def test_the_ratio_interval_takes_nearest_ranks_and_counts_a_draw_that_never_reaches_as_infinite():
    flow = torch.full((40,), 10.0, dtype=torch.float64)  # (K,) Flow-GRPO's cost in 40 draws
    # 40 draws: the 2.5% end is the ceil(1.0) = 1st smallest ratio, the 97.5% end the ceil(39.0) = 39th
    iv = stats.ratio_interval(torch.arange(40, dtype=torch.float64) + 5, flow)  # ratios 0.5, 0.6, ..., 4.4
    assert (iv["lo"], iv["hi"], iv["resolved"]) == (pytest.approx(0.5), pytest.approx(4.3), "")
    cheap = torch.arange(40, dtype=torch.float64) / 10 + 2  # (K,) ratios 0.20, 0.21, ..., 0.59
    iv = stats.ratio_interval(cheap, flow)
    assert (iv["lo"], iv["hi"], iv["resolved"]) == (pytest.approx(0.20), pytest.approx(0.58), "cheaper")
    # the cheapest draw never reaches: ratios 0.21 ... 0.59, inf; the 39th smallest is still finite
    iv = stats.ratio_interval(torch.cat([torch.tensor([math.nan], dtype=torch.float64), cheap[1:]]), flow)
    assert (iv["lo"], iv["hi"], iv["resolved"]) == (pytest.approx(0.21), pytest.approx(0.59), "cheaper")
    # two of 40 draws never reach (5%, more than the 2.5% tail): the upper end is inf, no longer resolved
    iv = stats.ratio_interval(torch.cat([torch.full((2,), math.nan, dtype=torch.float64), cheap[2:]]), flow)
    assert (iv["lo"], iv["hi"], iv["resolved"]) == (pytest.approx(0.22), math.inf, "")
    # every draw dearer: ratios 2.1 ... 5.9 and one never reaching (inf, the 40th): the ends are 2.1 and 5.9
    iv = stats.ratio_interval(torch.cat([torch.tensor([math.nan], dtype=torch.float64), cheap[1:] * 10]), flow)
    assert (iv["lo"], iv["hi"], iv["resolved"]) == (pytest.approx(2.1), pytest.approx(5.9), "dearer")


def test_the_reach_table_interpolates_the_crossing_and_its_costs_and_draws_the_ratio_jointly(tmp_path):
    flow, tp = C.Variant("flow-grpo", iterations=4), C.Variant("tp-grpo", iterations=4)
    # held-out means at iterations 0, 2, 4 of seed s: Flow-GRPO 0.2, 0.4, 0.6 + c_s, TP-GRPO 0.2, 0.5, 0.75 + c_s,
    # with a seed effect c_s = 0, 0.1, 0.05 shared by both methods. In any draw of seeds both curves and the target
    # (Flow-GRPO's best, 0.6 + m, m the drawn seeds' mean c) move by the same m, so the crossings do not depend on
    # the draw: Flow-GRPO at 4 (grid 4), TP-GRPO at 2 + (0.6 - 0.5) / (0.75 - 0.5) 2 = 2.8 (grid 4). Drawn apart
    # they would: TP-GRPO on seed 0 against Flow-GRPO's target on seed 1 (0.7) crosses at 2 + 0.2 / 0.25 2 = 3.6.
    runs = {"flow-grpo": (flow, []), "tp-grpo": (tp, [])}
    for s, c in enumerate((0.0, 0.1, 0.05)):
        for v, mid, top in ((flow, 0.4, 0.6), (tp, 0.5, 0.75)):
            write_result(str(tmp_path), "heldout", v, s, [0.2 + c], [top + c], evals_at=(2,), rewards=(0.5,) * 4)
            r = sweep.load_result(str(tmp_path), "heldout", v, s)
            r["evals"]["iter000002"]["eval/reward"] = mid + c
            if v is tp:  # 3x Flow-GRPO's 320 evaluations; 4.5 s per iteration, but 6.5 s in the third
                for row in r["rows"]:
                    row.update({"cost/transformer_evals": 960, "time/sample_s": 4.5 if row["iteration"] == 3 else 2.5})
            runs[v.method][1].append(r)
    cells = {line.split(" | ")[0].strip("| "): line.strip(" |").split(" | ")[1:] for line in
             report.reach_table(runs, "eval", samples=100, alone={"flow-grpo": 2.5, "tp-grpo": 2.0}).splitlines()[4:]}
    # Flow-GRPO: 4 x 320 = 1,280 evaluations, 4 x (2 + 0.5 + 1.5) = 16 s, 4 x 2.5 = 10 s alone
    assert cells["flow-grpo"] == ["4 (grid 4; 10-90% 4-4; never 0%)", "1,280", "-", "16", "-", "10", "-"]
    # TP-GRPO at 2.8: 2.8 x 960 = 2,688 evaluations (ratio 2.1); seconds 4.5 + 4.5 = 9 by iteration 2, 15.5 by 3,
    # so 9 + 0.8 x 6.5 = 14.2 at 2.8 (ratio 0.8875); alone 2.8 x 2.0 = 5.6 (ratio 0.56). Every draw gives the same
    # ratio, so each interval is a point: resolved dearer above 1, cheaper below
    assert cells["tp-grpo"] == ["3 (grid 4; 10-90% 3-3; never 0%)", "2,688", "2.10 (2.10-2.10, resolved dearer)",
                                "14", "0.89 (0.89-0.89, resolved cheaper)", "6", "0.56 (0.56-0.56, resolved cheaper)"]


def test_the_figure_puts_calibrated_seconds_on_its_third_axis_only_when_every_variant_has_them(tmp_path, monkeypatch):
    results = str(tmp_path)
    runs = {}
    for label in ("flow-grpo", "tp-grpo"):
        v = C.Variant(label, iterations=4)
        write_result(results, "heldout", v, 0, [0.1], [0.6], rewards=(0.5,) * 4)
        runs[label] = (v, [sweep.load_result(results, "heldout", v, 0)])
    saved = []
    monkeypatch.setattr(figures.Figure, "savefig", lambda fig, path: saved.append(fig))

    def seconds_of_the_training_curves(alone):  # the x of each variant's training-reward line on the third axis
        figures.figure(runs, str(tmp_path / "f.png"), "test", alone=alone)
        third = saved.pop().axes[2]
        return third.get_xlabel(), [list(line.get_xdata()) for line in third.lines
                                       if not line.get_label().startswith("_")]  # the errorbars' lines are unlabelled

    label, xs = seconds_of_the_training_curves({"flow-grpo": 2.5, "tp-grpo": 1.0})
    assert label.startswith("seconds alone") and xs[0] == [2.5, 5.0, 7.5, 10.0] and xs[1] == [1.0, 2.0, 3.0, 4.0]
    label, xs = seconds_of_the_training_curves({"flow-grpo": 2.5})  # one variant not measured: as the runs measured
    assert label.startswith("seconds (") and xs[0] == xs[1] == [4.0, 8.0, 12.0, 16.0]


def test_seconds_per_iteration_leave_out_the_warm_up_and_take_the_median(tmp_path):
    v = C.Variant("tp-grpo", iterations=4)
    write_result(str(tmp_path), "validation", v, 0, [0.1], [0.2], rewards=(0.5,) * 4)
    r = sweep.load_result(str(tmp_path), "validation", v, 0)
    for row, sample in zip(r["rows"], (30.0, 2.0, 3.0, 9.0)):  # per iteration 30 + 2, 2 + 2, 3 + 2, 9 + 2
        row["time/sample_s"] = sample
    assert report.seconds_per_iteration([r]) == 5.0  # the median of 4, 5, 11 (the first, warm-up, left out)
    assert report.seconds_per_iteration([r], warm_up=0) == 5.0  # torch's median of an even count: the lower middle


def test_the_headline_seconds_run_alone_at_the_headline_settings(tmp_path, monkeypatch):
    waves = []
    monkeypatch.setattr(sweep, "_run_wave", lambda todo, split, results, runs, jobs: waves.append((todo, split, jobs)) or
                        [write_result(results, split, v, s, [0.1], [0.2]) for v, s in todo])
    monkeypatch.setattr(C, "chosen", lambda results, method: C.Variant(method, lr=3e-3, clip_range=1e-5))
    C.run(["headline-seconds"], str(tmp_path), str(tmp_path / "runs"), jobs=2)
    (todo, split, jobs), = waves
    headline = C.EXPERIMENTS["headline"].variants(str(tmp_path))
    truer = [C.Variant("tp-grpo", lr=3e-3, clip_range=1e-5, completion=c) for c in ("mc:1", "mc:4")]
    timed = [dataclasses.replace(v, iterations=10, eval_every=0) for v in [*headline.values(), *truer]]
    # three alone-runs of each, one at a time, seed-major (a sweep cut short still times every variant)
    assert jobs == 1 and split == "validation" and todo == [(v, s) for s in (0, 1, 2) for v in timed]
    alone = C.seconds_alone(str(tmp_path))
    assert set(alone) == {(v.method, v.completion) for v in timed} and all(len(a["per_run"]) == 3 for a in alone.values())


def test_the_drift_table_flags_a_proxy_that_rises_while_the_gold_falls(tmp_path):
    def run(seed, proxy, gold):  # held-out means at iterations 0, 20, 40
        evals = {tag: {"iteration": it, "eval/reward": p, "eval/toy": g} for tag, it, p, g in
                 zip(("before", "iter000020", "after"), (0, 20, 40), proxy, gold)}
        return {"argv": ["--seed", str(seed)], "evals": evals}
    # "hacks": proxy up in both stretches; gold up, then down by 0.10 / 0.12 / 0.11 (seeds 0, 1, 2)
    hacks = [run(s, (0.2, 0.4 + d, 0.6 + d), (0.3, 0.5, 0.4 - d)) for s, d in enumerate((0.0, 0.02, 0.01))]
    # "honest": the gold follows the proxy up
    honest = [run(s, (0.2, 0.3 + d, 0.4 + d), (0.3, 0.35 + d, 0.45)) for s, d in enumerate((0.0, 0.02, 0.01))]
    # "plateau": both fall by 0.10-0.12 (a collapse), then the proxy rises while the gold moves -0.01, +0.03, +0.01
    plateau = [run(s, (0.2, 0.1 - d, 0.3 + d), (0.3, 0.2 - d, 0.19 + d)) for s, d in enumerate((0.0, 0.02, 0.01))]
    runs = {"hacks": (C.Variant("tp-grpo", iterations=40, eval_every=20), hacks),
            "honest": (C.Variant("flow-grpo", iterations=40, eval_every=20), honest),
            "plateau": (C.Variant("incremental", iterations=40, eval_every=20), plateau)}
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in report.drift_table(runs).splitlines()[2:]]
    assert [(r[0], r[1], r[4]) for r in rows] == [
        ("hacks", "0-20", "both up"), ("hacks", "20-40", "**over-optimises**"), ("honest", "0-20", "both up"),
        ("honest", "20-40", "both up"), ("plateau", "0-20", "both down"), ("plateau", "20-40", "proxy up, gold flat")]
    # the gold's 20-40 stretch of "hacks", by hand: per-seed changes -0.10, -0.12, -0.11
    gold = stats.paired_difference({0: 0.40, 1: 0.38, 2: 0.39}, {0: 0.5, 1: 0.5, 2: 0.5})
    assert rows[1][3] == stats.format_difference(gold) and gold["hi"] < 0
    figures.proxy_gold_figure(runs, str(tmp_path / "pg.png"), "test")
    assert (tmp_path / "pg.png").stat().st_size > 0


def test_an_experiment_with_a_gold_metric_reports_gold_then_proxy_and_their_drift(tmp_path, monkeypatch):
    results = str(tmp_path / "results")
    v = C.Variant("tp-grpo", iterations=2, eval_every=1, reward="toyscore")
    for s in (0, 1):
        write_result(results, "heldout", v, s, [0.2, 0.2], [0.6 + 0.08 * s, 0.6], rewards=(0.5, 0.6), evals_at=(1,))
    monkeypatch.setitem(C.EXPERIMENTS, "t", C.Experiment("t", "test", "heldout", (0, 1), lambda r: {"tp": v},
                                                         metrics=C.GOLD_AND_PROXY))
    text = C.write_reports(["t"], results, str(tmp_path / "reports"))
    gold, proxy = text.index("#### gold"), text.index("#### proxy")
    assert gold < proxy and "Over-optimisation" in text[proxy:]
    # per seed the proxy moved +0.40 and +0.44 (mean +0.42, SE std / sqrt(2) = 0.02); the gold, half the proxy by
    # construction, half as much
    changes = [cells[9] for cells in (line.split(" | ") for line in text.splitlines()) if cells[0] == "| tp" and len(cells) == 16]
    assert changes == ["+0.210 +- 0.010", "+0.420 +- 0.020"]
    assert (tmp_path / "reports" / "t.png").exists()


def test_evaluations_of_a_subset_on_the_way_are_read_on_the_images_every_point_scored():
    # --eval-subset 2: the evaluation at iteration 10 scored the first 2 of the 4 images; before and after all 4
    def point(it, values):
        return {"iteration": it, "eval/reward": sum(values) / len(values), "per_image": {"reward": values}}
    seeds = [{"argv": ["--seed", str(s)], "rows": [],
              "evals": {"before": point(0, [0.1, 0.2, 0.3, 0.4]), "iter000010": point(10, [0.5 + s, 0.6]),
                        "after": point(20, [0.7, 0.8, 0.9, 1.0])}} for s in (0, 1)]
    its, scores = report._evals(seeds)
    assert its.tolist() == [0, 10, 20]
    # every point on the first two images: (0.1 + 0.2) / 2, (0.5 + s + 0.6) / 2, (0.7 + 0.8) / 2
    torch.testing.assert_close(scores, torch.tensor([[0.15, 0.55, 0.75], [0.15, 1.05, 0.75]]))
    # the change at iteration 10 pairs its two images with the same two before training: seed s, 0.4 + s / 2
    on_the_way = report.change_stats(seeds, tag="iter000010")
    assert on_the_way["per_seed"] == pytest.approx({0: 0.4, 1: 0.9})
    assert report.change_stats(seeds)["per_seed"] == pytest.approx({0: 0.6, 1: 0.6})  # after: all four


def test_equivalence_is_two_one_sided_tests_at_the_margin():
    # d = (0.01, 0.02, 0.03, 0.02): mean 0.02, sd 0.00816, SE 0.00408; t(0.95, 3) = 2.353: 90% 0.0104 to 0.0296
    a, b = {s: x for s, x in enumerate((0.51, 0.52, 0.53, 0.52))}, {s: 0.5 for s in range(4)}
    e = stats.equivalence(a, b, margin=0.05)
    assert e["lo"] == pytest.approx(0.02 - 2.3534 * 0.0040825, abs=1e-5) and e["level"] == 0.90
    assert e["equivalent"] and e["resolved"]  # inside +-0.05, and apart from 0: both can hold at once
    assert not stats.equivalence(a, b, margin=0.025)["equivalent"]  # the upper end 0.0296 passes 0.025
    assert stats.format_difference(e).startswith("+0.020 +- 0.004 (90%: +0.010 to +0.030, 3 df)")


def test_the_clip_check_counts_late_drops_and_pairs_the_late_loss_pooled_over_methods():
    def run(seed, proxy, gold):  # scores at iterations 0 (before), 20, ..., 100
        evals = {("before" if it == 0 else "after" if it == 100 else f"iter{it:06d}"):
                 {"iteration": it, "eval/reward": p, "eval/toy": g, "per_image": {"reward": [p], "toy": [g]}}
                 for it, p, g in zip(range(0, 101, 20), proxy, gold)}
        return {"argv": ["--seed", str(seed)], "rows": [], "evals": evals}
    steady = [0.1, 0.2, 0.3, 0.35, 0.36, 0.37]
    fall = [0.1, 0.2, 0.3, 0.35, 0.36, 0.30]  # the proxy falls by 0.06 in 80-100: a late drop
    runs = {"a clip 1e-5": (None, [run(0, steady, [0.4, 0.5, 0.7, 0.7, 0.7, 0.7]), run(1, steady, [0.4] * 6)]),
            "a clip 1e-4": (None, [run(0, fall, [0.4, 0.5, 0.7, 0.6, 0.5, 0.4]), run(1, steady, [0.4] * 5 + [0.3])]),
            "b clip 1e-5": (None, [run(0, steady, [0.4, 0.6, 0.6, 0.6, 0.6, 0.5]), run(1, fall, [0.4] * 6)]),
            "b clip 1e-4": (None, [run(0, fall, [0.4, 0.6, 0.6, 0.6, 0.6, 0.3]), run(1, fall, [0.4] * 6)])}
    assert report.late_drops(runs["a clip 1e-4"][1]) == 1 and report.late_drops(runs["b clip 1e-4"][1]) == 2
    # gold late loss (best after training began - last): a: 1e-5 (0, 0), 1e-4 (0.3, 0.1); b: 1e-5 (0.1, 0),
    # 1e-4 (0.3, 0)
    assert report.late_loss(runs["a clip 1e-4"][1]) == pytest.approx({0: 0.3, 1: 0.1})
    table = report.clip_check_table(runs, (("a clip 1e-5", "a clip 1e-4"), ("b clip 1e-5", "b clip 1e-4")))
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert rows[0][:2] == ["| a", "0 of 2 / 1 of 2"] and rows[1][:2] == ["| b", "1 of 2 / 2 of 2"]
    # a: d = (-0.3, -0.1), mean -0.2, SE 0.1; b: d = (-0.2, 0), mean -0.1; pooled: the four, mean -0.15
    assert rows[0][2].startswith("-0.200 +- 0.100") and rows[1][2].startswith("-0.100 +- 0.100")
    d = torch.tensor([-0.3, -0.1, -0.2, 0.0], dtype=torch.float64)
    assert rows[2][0] == "| pooled (4 pairs)" and rows[2][2].startswith(f"-0.150 +- {d.std().item() / 2:.3f}")


def test_the_audit_over_training_is_read_per_audited_iteration_over_the_seeds_that_logged_it(tmp_path):
    def run(seed, audits):  # audits: {iteration: (corr_0 or None, sign_agree)}; other iterations log no audit
        rows = [{"iteration": i, "reward/mean": 0.5} for i in range(1, 21)]
        for i, (corr, sign) in audits.items():
            rows[i - 1].update({"judge/resolved": 3, "judge/sign_agree": sign,
                                **({} if corr is None else {"judge/corr_0": corr})})
        return {"argv": ["--seed", str(seed)], "rows": rows, "evals": {}}
    v = C.Variant("tp-grpo", 3e-3, 1e-5, 0.7, 5, 20)
    # seed 1's audit at 20 had nothing to correlate (no corr_0): that cell is seed 0's alone
    seeds = [run(0, {10: (0.2, 0.6), 20: (0.5, 0.9)}), run(1, {10: (0.6, 0.8), 20: (None, 0.7)})]
    corr = report.audit_curve(seeds, "judge/corr_0")
    assert list(corr) == [10, 20] and corr[10].tolist() == pytest.approx([0.2, 0.6]) and corr[20].tolist() == [0.5]
    table = report.audit_table({"tp-grpo": (v, seeds)}).splitlines()
    assert table[0] == "| variant | statistic | iteration 10 | iteration 20 |"
    # iteration 10: mean 0.4, SE = sd / sqrt(2) = 0.2828 / 1.414 = 0.2; one seed: SE 0
    assert table[2] == "| tp-grpo | correlation at s_0 | 0.40 +- 0.20 | 0.50 +- 0.00 |"
    assert table[3] == "| tp-grpo | sign agreement | 0.70 +- 0.10 | 0.80 +- 0.10 |"
    figures.audit_figure({"tp-grpo": (v, seeds)}, str(tmp_path / "audit.png"), "test")
    assert (tmp_path / "audit.png").stat().st_size > 0


def test_each_variant_of_a_method_is_drawn_in_its_own_colour_and_line_style():
    # the judge round: four judges of TP-GRPO beside Flow-GRPO; a reader tells them apart by colour alone
    runs = {label: (C.Variant(method, 3e-3, 1e-5, 0.7, 5, 100), []) for label, method in
            [("tp ode", "tp-grpo"), ("tp x0", "tp-grpo"), ("flow", "flow-grpo"), ("tp mc:1", "tp-grpo"),
             ("tp mc:4", "tp-grpo")]}
    look = figures.looks(runs)
    assert look["tp ode"] == ("tab:red", "-") and look["flow"] == ("tab:gray", "-")  # first variants: as before
    assert look["tp x0"] == ("darkred", "--") and look["tp mc:4"] == ("tab:purple", "-.")
    tp = [look[k] for k in ("tp ode", "tp x0", "tp mc:1", "tp mc:4")]
    assert len({c for c, _ in tp}) == 4 and len({s for _, s in tp}) == 4
