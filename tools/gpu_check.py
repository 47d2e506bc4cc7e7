"""The GPU check: one prepared command that measures every GPU figure docs/gpu.md shows, on one GPU of 80 GB or more,
in about 8 minutes, and writes them as one JSON and docs/gpu.md's Markdown tables.

Items (each a function below, run in this order; docs/gpu.md's sections 'Real runs (SD3.5-Medium)', 'Compiling the
transformer', 'Real runs (FLUX.1-dev)' and 'DeepSpeed' show their tables):
  1. sd35m_compile  SD3.5-M's shapes, random weights, bf16 (bench.py): the Flow-GRPO rollout (a) and the TP-GRPO
                    wavefront (c) eager and compiled (a*, c*) after the compile warm-up, the warm-up itself,
                    TFLOP/s, peak memory (Sec. 4.1's cost; docs/gpu.md's compile section);
  2. flux_dev       FLUX.1-dev's shapes at the FLUX presets' T = 6, W = 5 with 3 trajectories per GPU (bench.py):
                    the rollout, the completions, decoding, a training step, peak memory;
  3. train_runs     `python train.py --model random-sd35m`, 2 iterations each of tp-grpo and flow-grpo at B x G =
                    2 x 9: seconds per phase of the second iteration (sampling, decode + reward, training), the
                    TP/Flow ratio, peak memory, and one flow-grpo iteration with --gradient-checkpointing true (the
                    peak is the training pass's, the same micro-batch in both algorithms); then `evaluate.py`
                    reloading tp-grpo's saved LoRA;
  4. deepspeed_zero2 when deepspeed is importable: tp-grpo's first iteration again, launched with
                    configs/deepspeed_zero2.yaml on one process, its LoRA compared with the plain launch's
                    (LORA_TOLERANCE says what precision allows and why), the dtype of the LoRA weights it trains,
                    its seconds;
  5. judges         SD3.5-M's shapes: the wavefront with the judges x0, mc:1 and mc:4 beside the ODE judge
                    (bench.py's (c)), and one training iteration with the judge audit on (--judge-audit 1, 8
                    continuations): the audit's seconds and evaluations against the iteration's.
An item that fails is recorded with its error and the next one runs (a GPU slot is too scarce to lose to one bug);
the exit status is then 1.

  python -m tools.gpu_check                            # one GPU: runs/gpu_check/gpu_check.json and gpu_check.md
  python -m tools.gpu_check --only train_runs deepspeed_zero2   # some items
  python -m tools.gpu_check --dry-run                  # every item at tiny sizes on the CPU (tests/test_gpu_check.py)

No download: random weights, the toy world's prompts, a reward without a model (JPEG compressibility). On a GPU
machine without internet, carry the wheels docs/gpu.md's 'The GPU check' section lists.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import importlib.util
import json
import os
import runpy
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file

import bench
import evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITEMS = ("sd35m_compile", "flux_dev", "train_runs", "deepspeed_zero2", "judges")
PHASE_KEYS = ("sample", "reward", "train")  # train.py's time/<phase>_s: sampling, decode + reward, training
# What the DeepSpeed launch's LoRA after one iteration may differ from the plain launch's (item 4):
#   float32 (the dry run): the same arithmetic in another order (flattened buffers, another clip-norm reduction);
#     relative L2 difference <= 1e-5 (measured on the CPU: 2e-8). A gradient clipped at another value, a missed or
#     extra optimizer step, or a wrong accumulation boundary gives 1e-3 or more.
#   bf16 (the GPU): DeepSpeed stores the trained weights in bf16 (8 significant bits) (their gradients accumulate
#     in float32: train.py sets grad_accum_dtype), and accelerate leaves autocast off under DeepSpeed, so every forward pass rounds differently from the
#     plain launch's autocast: rollouts, rewards and advantages move by about bf16's precision (the tiny model on
#     the CPU, 2026-12-04: lora_B cosine 0.999998, all weights 2.3e-3 apart). One iteration is two AdamW steps, and
#     AdamW divides each gradient element by its own size, so an element's step keeps its size (~lr) and flips sign
#     only where its gradient lies within that noise of 0. lora_B is 0 at the start, so after one iteration it is
#     the update alone: it must point the same way (cosine >= 0.9) with a norm within 10%; a missed or extra step or
#     a step per micro-batch changes the norm by 2x or more, a sign error makes the cosine negative.
LORA_TOLERANCE = {"float32": dict(rel_l2=1e-5), "bfloat16": dict(cos_b=0.9, norm_b=0.1)}


# ----------------------------------------------------------------------------------------------------------------
# The items
# ----------------------------------------------------------------------------------------------------------------


def sd35m_compile(args) -> dict:
    """Item 1: bench.py's (a) and (c) eager and compiled at SD3.5-M's shapes (dry run: the tiny SD3, dynamo's eager
    backend, which traces without compiling kernels)."""
    size = ["--size", "tiny", "--compile-backend", "eager", "--batches", "2"] if args.dry_run else \
        ["--size", "random-sd35m", "--device", "cuda", "--dtype", "bf16", "--batches", "8"]
    rows = bench.main([*size, "--phases", "a,c", "--compile", "--repeats", "1"])
    return {"rows": _rows(rows)}


def flux_dev(args) -> dict:
    """Item 2: bench.py at FLUX.1-dev's shapes with the presets' schedule (dry run: the tiny FLUX)."""
    size = ["--size", "tiny-flux", "--batches", "2"] if args.dry_run else \
        ["--size", "random-flux-dev", "--device", "cuda", "--dtype", "bf16", "--batches", "3"]
    rows = bench.main([*size, "--steps", "6", "--window", "5", "--guidance", "3.5", "--phases", "a,c,d,e",
                       "--repeats", "1"])
    return {"rows": _rows(rows)}


def train_runs(args) -> dict:
    """Item 3: train.py's two algorithms, gradient checkpointing, then evaluate.py on the saved LoRA."""
    runs = {}
    for key, algo, iterations, extra in [("tp-grpo", "tp-grpo", 2, []), ("flow-grpo", "flow-grpo", 2, []),
                                         ("flow-grpo, checkpointing", "flow-grpo", 1,
                                          ["--gradient-checkpointing", "true"])]:
        out = os.path.join(args.out, key.replace(", ", "-"))
        peak = run_train([*train_argv(args, algo, out, iterations), *extra])
        last = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))][-1]
        runs[key] = {"iteration": last["iteration"], "peak_gib": peak,
                     "evals_per_trajectory": last["cost/evals_per_trajectory"],
                     **{k: last[f"time/{k}_s"] for k in PHASE_KEYS}}
    ratio = sum(runs["tp-grpo"][k] for k in PHASE_KEYS) / sum(runs["flow-grpo"][k] for k in PHASE_KEYS)
    lora = os.path.join(args.out, "tp-grpo", "checkpoints", "iter-000002")
    model = ["--task", "tiny", "--model", "tiny", "--eval-steps", "4", "--eval-samples", "2"] if args.dry_run else \
        ["--task", "pickscore", "--model", "random-sd35m", "--eval-steps", "10", "--eval-samples", "4",
         "--reward-batch", "4"]
    start = time.perf_counter()
    summary = evaluate.main([*model, "--checkpoint", lora, "--eval-prompts", "toy:heldout", "--rewards",
                             "jpeg_compressibility:1", "--output-dir", os.path.join(args.out, "evaluate")])
    return {"runs": runs, "tp_over_flow": ratio,
            "evaluate": {"checkpoint": lora, "reward": summary["reward"], "seconds": time.perf_counter() - start}}


def deepspeed_zero2(args) -> dict:
    """Item 4: tp-grpo's first iteration under configs/deepspeed_zero2.yaml (one process, `accelerate launch`, the
    user's command), its LoRA against the plain launch's of item 3."""
    if importlib.util.find_spec("deepspeed") is None:
        return {"skipped": "deepspeed is not importable (pip install -r requirements.txt)"}
    out, plain = os.path.join(args.out, "deepspeed"), os.path.join(args.out, "tp-grpo")
    # the dry run is float32 on the CPU: the launch's precision follows (the yaml says bf16)
    precision = ["--mixed_precision", "no"] if args.dry_run else []
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           os.path.join(ROOT, "configs", "deepspeed_zero2.yaml"), "--num_processes", "1", *precision,
           os.path.join(ROOT, "train.py"), *train_argv(args, "tp-grpo", out, 1)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the DeepSpeed launch failed ({proc.returncode}): {proc.stderr[-2000:]}")
    lora = "checkpoints/iter-000001/lora/pytorch_lora_weights.safetensors"
    result = compare_lora(load_file(os.path.join(plain, lora)), load_file(os.path.join(out, lora)))
    seconds = {}
    for name, folder in (("plain", plain), ("deepspeed", out)):
        first = json.loads(open(os.path.join(folder, "metrics.jsonl")).readline())
        seconds[name] = {k: first[f"time/{k}_s"] for k in PHASE_KEYS}
    return {**result, "first_iteration_s": seconds, "deepspeed_version": importlib.metadata.version("deepspeed")}


def judges(args) -> dict:
    """Item 5: the judges' cost at SD3.5-M's shapes (bench.py's (c) for each; dry run: the tiny SD3), and one
    iteration of train.py with the judge audit on: its seconds and transformer evaluations beside the iteration's."""
    size = ["--size", "tiny", "--batches", "2"] if args.dry_run else \
        ["--size", "random-sd35m", "--device", "cuda", "--dtype", "bf16", "--batches", "8"]
    rows = bench.main([*size, "--phases", "c", "--judges", "x0,mc:1,mc:4", "--repeats", "1"])
    out = os.path.join(args.out, "audit")
    peak = run_train([*train_argv(args, "tp-grpo", out, 1), "--judge-audit", "1", "--audit-continuations", "8"])
    first = json.loads(open(os.path.join(out, "metrics.jsonl")).readline())
    keys = ("time/audit_s", "judge/evals", "cost/transformer_evals", *(f"time/{k}_s" for k in PHASE_KEYS))
    return {"rows": _rows(rows), "audit": {k: first[k] for k in keys}, "audit_peak_gib": peak}


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------


def train_argv(args, algo: str, out: str, iterations: int) -> list[str]:
    """The pickscore preset on random weights with the toy world's prompts and a reward that needs no model, at
    B x G = 2 x 9 (docs/gpu.md's table), a checkpoint every iteration; the dry run: the tiny SD3, T = 4, W = 3."""
    size = ["--model", "tiny", "--resolution", "16", "--max-sequence-length", "32", "--mixed-precision", "no",
            "--steps", "4", "--window", "3", "--prompts-per-iter", "2", "--group-size", "2", "--sample-batch", "4",
            "--train-batch", "2"] if args.dry_run else \
        ["--model", "random-sd35m", "--prompts-per-iter", "2", "--group-size", "9", "--sample-batch", "9",
         "--train-batch", "9"]
    return ["--task", "pickscore", *size, "--algo", algo, "--iterations", str(iterations), "--rewards",
            "jpeg_compressibility:1", "--prompts", "toy:train", "--eval-prompts", "toy:heldout", "--eval-samples", "2",
            "--eval-steps", "4", "--save-every", "1", "--report-to", "none", "--output-dir", out]


def run_train(argv: list[str]) -> float | None:
    """`python train.py ARGV`, in this process; returns its peak GPU memory in GiB (None on the CPU): the peak
    allocation during the run less what was allocated before it (nothing, unless an earlier item left some).

    train.py is the script at the top of the import graph, which no module imports (tests/test_structure.py);
    runpy runs it as `python train.py` would, here, so that its peak memory can be read and no run pays the
    start-up (imports, CUDA context) again."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    saved = sys.argv
    sys.argv = [os.path.join(ROOT, "train.py"), *argv]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        sys.argv = saved
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30 if cuda else None
    free_memory()
    return peak


def free_memory() -> None:
    """Drop what an item left on the GPU before the next one: compiled graphs (which hold the compiled model's
    weights), unreachable objects, the allocator's cache."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def compare_lora(plain: dict, ds: dict) -> dict:
    """The DeepSpeed launch's LoRA against the plain launch's: relative L2 difference over all weights, and of
    lora_B (the update alone) the cosine and norm ratio; judged by LORA_TOLERANCE for the weights' dtype."""
    keys = sorted(plain)
    assert keys == sorted(ds), "the two launches saved different LoRA layers"
    a, b = (torch.cat([w[k].double().flatten() for k in keys]) for w in (plain, ds))  # (all LoRA weights,)
    a_b, b_b = (torch.cat([w[k].double().flatten() for k in keys if "lora_B" in k]) for w in (plain, ds))
    dtype = str(ds[keys[0]].dtype).removeprefix("torch.")
    found = {"rel_l2": float((b - a).norm() / a.norm()), "cos_b": float(a_b @ b_b / (a_b.norm() * b_b.norm())),
             "norm_b": float(b_b.norm() / a_b.norm() - 1)}
    bound = LORA_TOLERANCE.get(dtype, LORA_TOLERANCE["bfloat16"])
    within = all(found[k] >= v if k == "cos_b" else abs(found[k]) <= v for k, v in bound.items())
    return {"lora_dtype": dtype, "plain_dtype": str(plain[keys[0]].dtype).removeprefix("torch."), **found,
            "tolerance": bound, "within_tolerance": within}


def _rows(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "out"} for r in rows]


def _version() -> str:
    """The code's version: the git commit (with '+changes' when the tree differs from it), else 'unknown'."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return commit + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def _c(value, fmt: str, unit: str = "") -> str:
    return "-" if value is None else format(value, fmt) + unit


def _rate(row: dict) -> float:
    """A bench row's TFLOP/s."""
    return row["flops"] / 1e12 / row["seconds"]


def _table(header: list[str], rows: list[list]) -> list[str]:
    """Markdown table lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]


def markdown(report: dict) -> str:
    """docs/gpu.md's tables from the JSON report."""
    items, lines = report["items"], [f"GPU check of {report['date']} on {report['device']}, code {report['version']}, "
                                     f"torch {report['torch']}" + (" (dry run: tiny sizes, CPU)" if report["dry_run"]
                                                                   else ""), ""]
    for name in ITEMS:
        item = items.get(name)
        if item is None:
            continue
        lines.append(f"### {name}" + (f" ({item['seconds']:.0f} s)" if "seconds" in item else ""))
        lines.append("")
        if "error" in item or "skipped" in item:
            lines += [f"{'error' if 'error' in item else 'skipped'}: {item.get('error') or item['skipped']}", ""]
            continue
        if name == "sd35m_compile":
            by = {r["phase"]: r for r in item["rows"]}
            lines += _table(["phase", "batch", "eager s", "compiled s", "speed-up", "eager TFLOP/s", "compiled TFLOP/s",
                             "compile warm-up s", "peak GiB"],
                            [[e["layout"], e["batch"], f"{e['seconds']:.3f}", f"{c['seconds']:.3f}",
                              f"{e['seconds'] / c['seconds']:.2f}", f"{_rate(e):.3g}", f"{_rate(c):.3g}",
                              f"{c['warmup_s']:.1f}", _c(c["peak_gib"], ".1f")]
                             for e, c in ((by[k], by[k + "*"]) for k in ("a", "c"))])
        elif name == "flux_dev":
            lines += _table(["phase", "batch", "nfe/traj", "calls", "seconds", "TFLOP", "TFLOP/s", "peak GiB"],
                            [[r["layout"], r["batch"], _c(r["nfe"], ".0f"), _c(r["calls"], "d"), f"{r['seconds']:.3f}",
                              f"{r['flops'] / 1e12:.4g}", f"{_rate(r):.3g}", _c(r["peak_gib"], ".1f")]
                             for r in item["rows"]])
        elif name == "train_runs":
            rows = []
            for key, r in item["runs"].items():
                ratio = f" (tp-grpo / flow-grpo = {item['tp_over_flow']:.2f})" if key == "flow-grpo" else ""
                rows.append([f"{key} (iteration {r['iteration']})", *(f"{r[k]:.2f} s" for k in PHASE_KEYS),
                             f"{sum(r[k] for k in PHASE_KEYS):.2f} s{ratio}", _c(r["peak_gib"], ".1f", " GiB")])
            ev = item["evaluate"]
            lines += _table(["", "sampling", "decode + reward", "training", "iteration", "peak GPU memory"], rows)
            lines += ["", f"evaluate.py on {ev['checkpoint']}: reward {ev['reward']:.4f}, {ev['seconds']:.1f} s"]
        elif name == "deepspeed_zero2":
            secs = item["first_iteration_s"]
            lines += _table(["LoRA dtype (plain / DeepSpeed)", "rel. L2 difference", "lora_B cosine",
                             "lora_B norm ratio - 1", "tolerance", "within", "first iteration, plain / DeepSpeed"],
                            [[f"{item['plain_dtype']} / {item['lora_dtype']}", f"{item['rel_l2']:.3g}",
                              f"{item['cos_b']:.4f}", f"{item['norm_b']:+.3g}", item["tolerance"],
                              item["within_tolerance"],
                              f"{sum(secs['plain'].values()):.2f} s / {sum(secs['deepspeed'].values()):.2f} s"]])
        elif name == "judges":
            a = item["audit"]
            lines += _table(["phase", "batch", "nfe/traj", "calls", "seconds", "TFLOP"],
                            [[r["layout"], r["batch"], _c(r["nfe"], ".0f"), _c(r["calls"], "d"), f"{r['seconds']:.3f}",
                              f"{r['flops'] / 1e12:.4g}"] for r in item["rows"]])
            lines += ["", f"judge audit (one group, 8 continuations per window state): {a['time/audit_s']:.1f} s and "
                      f"{a['judge/evals']} evaluations, beside the iteration's "
                      f"{sum(a[f'time/{k}_s'] for k in PHASE_KEYS):.1f} s and {a['cost/transformer_evals']} "
                      f"evaluations; peak {_c(item['audit_peak_gib'], '.1f', ' GiB')}"]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="every item at tiny sizes on the CPU (about a minute)")
    p.add_argument("--only", nargs="+", choices=ITEMS, default=list(ITEMS),
                   help="these items (deepspeed_zero2 compares with train_runs' tp-grpo run, so it needs it)")
    p.add_argument("--out", default="runs/gpu_check", help="folder for the runs, gpu_check.json and gpu_check.md")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no GPU visible to torch; run with --dry-run on a CPU")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random weights only: nothing to fetch, and no internet needed
    os.makedirs(args.out, exist_ok=True)
    report = {"date": datetime.date.today().isoformat(), "version": _version(), "dry_run": args.dry_run,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.dry_run else "CPU",
              "torch": torch.__version__, "items": {}}
    started = time.perf_counter()
    for name in args.only:
        print(f"==== gpu_check: {name}", flush=True)
        start = time.perf_counter()
        try:
            result = globals()[name](args)
        except Exception as e:  # recorded, and the next item runs: see the docstring
            result = {"error": f"{type(e).__name__}: {str(e)[-1500:]}"}
        free_memory()
        report["items"][name] = {**result, "seconds": time.perf_counter() - start}
        print(f"==== gpu_check: {name} took {report['items'][name]['seconds']:.0f} s", flush=True)
    report["seconds"] = time.perf_counter() - started
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(report, f, indent=1)
    table = markdown(report)
    with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    print(f"wrote {os.path.join(args.out, 'gpu_check.json')} and gpu_check.md ({report['seconds']:.0f} s)")
    failed = [n for n, item in report["items"].items() if "error" in item]
    if failed or any(not item.get("within_tolerance", True) for item in report["items"].values()):
        sys.exit(f"error: gpu_check items failed or out of tolerance: {failed or ['deepspeed_zero2']}; see "
                 f"{os.path.join(args.out, 'gpu_check.md')}")
    return report


if __name__ == "__main__":
    main()
