"""The laboratory's runs (lab/compare.py's `run`): every (variant, seed) of an experiment is a process of
`train.py --task tiny`, launched `jobs` at a time, and each finished run leaves two things: its folder under runs/lab/
(checkpoint, pictures, everything train.py writes) and a small gzipped JSON under lab/results/ (its metrics, its
evaluations' summaries and per-image scores, the command and the machine it ran on), which is committed: a sweep
killed at any point, or moved to another machine, picks up where it stopped, and the reports need only
lab/results/.

Run: through `python -m lab.compare run ...`; tested by `python -m pytest tests/test_compare.py`.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import subprocess
import sys
import time

import torch

import toyworld

LAB = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(LAB)
TRAIN = os.path.join(ROOT, "train.py")
SPLIT_FLAGS = {"heldout": [], "validation": ["--eval-prompts", toyworld.VALIDATION_SETTINGS["eval_prompts"],
                                             "--eval-seed", str(toyworld.VALIDATION_SETTINGS["eval_seed"])]}



def result_path(results: str, split: str, variant, seed: int) -> str:
    return os.path.join(results, split, variant.name, f"seed{seed}.json.gz")


def finished(results: str, split: str, variant, seeds) -> bool:
    return all(os.path.exists(result_path(results, split, variant, s)) for s in seeds)


def load_result(results: str, split: str, variant, seed: int) -> dict:
    with gzip.open(result_path(results, split, variant, seed), "rt") as f:
        return json.load(f)


def mean_score(results: str, split: str, variant, seeds) -> float:
    """The evaluation score after training (eval/reward), mean over seeds: what the grid chooses by."""
    return sum(load_result(results, split, variant, s)["evals"]["after"]["eval/reward"] for s in seeds) / len(seeds)


def machine() -> dict:
    """Where a run ran: results differ in the last digits between CPUs (float rounding), so each result says."""
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        cpu = names[0] if names else cpu
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": os.environ.get("OMP_NUM_THREADS", ""),
            "torch": torch.__version__, "commit": commit.stdout.strip(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "load_1min": round(os.getloadavg()[0], 2)}  # how busy the machine was as the run ended (seconds vary)


def harvest(folder: str, out_path: str, argv: list[str], jobs: int) -> None:
    """A finished run folder -> its small result: metrics rows, every evaluation's summary with the per-image
    reward, programmatic score and strict accuracy (the paired standard errors need them; under ToyScore the
    reward is the proxy and `toy` the gold), the command and the machine."""
    rows = [json.loads(line) for line in open(os.path.join(folder, "metrics.jsonl"))]
    evals = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("eval_") and name.endswith(".json"):
            e = json.load(open(os.path.join(folder, name)))
            per_image = {k: v for k, v in e.pop("per_image").items() if k in ("reward", "toy", "toy_strict")}
            evals[name[5:-5]] = {**e, "per_image": per_image}
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    tmp = out_path + ".part"
    with gzip.open(tmp, "wt") as f:
        json.dump({"argv": argv, "machine": dict(machine(), concurrent_runs=jobs), "rows": rows, "evals": evals}, f)
    os.replace(tmp, out_path)  # a result exists only whole


def run_experiment(name: str, exp, results: str, runs: str, jobs: int = 1) -> None:
    """Run every unfinished (variant, seed) of one experiment (compare.Experiment), `jobs` processes at a time. The
    list of runs is recomputed after each wave: the grid widens itself, and later experiments read its choice."""
    while True:
        # seed-major: a whole first seed of every variant before the next seed (a sweep cut short still covers every
        # variant)
        todo = [(v, s) for s in exp.seeds for v in dict.fromkeys(exp.variants(results).values())
                if not finished(results, exp.split, v, [s])]
        if not todo:
            print(f"{name}: every run finished")
            break
        print(f"{name}: {len(todo)} runs to go" + (" (one at a time: a timing experiment)" if exp.alone else ""))
        _run_wave(todo, exp.split, results, runs, 1 if exp.alone else jobs)


def _run_wave(todo: list, split: str, results: str, runs: str, jobs: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1") if jobs == 1 else "1")
    active = []
    try:
        _launch(todo, split, results, runs, jobs, env, active)
    except BaseException:  # a failed run or Ctrl-C: stop the others too (their folders are redone next time)
        for proc, *_ in active:
            proc.kill()
        raise


def _launch(todo: list, split: str, results: str, runs: str, jobs: int, env: dict, active: list) -> None:
    for i, (variant, seed) in enumerate(todo):
        folder = os.path.join(runs, split, variant.name, f"seed{seed}")
        argv = ["--task", "tiny", *variant.flags(), *SPLIT_FLAGS[split], "--seed", str(seed), "--output-dir", folder,
                "--report-to", "none"]
        print(f"[{i + 1}/{len(todo)}] python train.py " + " ".join(argv), flush=True)
        # a process per run: every run starts from the same fresh state, as when launched by hand
        log = open(os.path.join(_mkdir(folder), "train.log"), "w")
        proc = subprocess.Popen([sys.executable, TRAIN, *argv], stdout=log, stderr=subprocess.STDOUT, env=env)
        active.append((proc, folder, result_path(results, split, variant, seed), argv, log))
        while len(active) >= jobs or (i == len(todo) - 1 and active):
            active[:] = _reap(active, jobs)


def _reap(active: list, jobs: int) -> list:
    time.sleep(0.2)
    still = []
    for proc, folder, out, argv, log in active:
        if proc.poll() is None:
            still.append((proc, folder, out, argv, log))
            continue
        log.close()
        if proc.returncode:
            raise SystemExit(f"error: train.py failed ({proc.returncode}) in {folder}; see {folder}/train.log")
        harvest(folder, out, argv, jobs)
        print(f"  done: {out}", flush=True)
    return still


def _mkdir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def load_experiment(results: str, exp) -> dict[str, tuple]:
    """{label: (variant, [result per finished seed])} of the variants with at least one finished seed."""
    out = {}
    for label, v in exp.variants(results).items():
        done = [load_result(results, exp.split, v, s) for s in exp.seeds if finished(results, exp.split, v, [s])]
        if done:
            out[label] = (v, done)
    return out
