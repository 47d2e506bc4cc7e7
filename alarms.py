"""Watching a run: the best checkpoint kept, and alarms that report a run going wrong while it runs (a day on
8 GPUs ends with the best policy on disk, not only the last one).

Three alarms, each one line on the console when it comes on, an alarm/* metric in every row of metrics.jsonl (and
TensorBoard) and a line of the summary at the end (docs/metrics.md, 'Alarms'):

  collapse  the watched held-out metric (--keep-best's, else the first training reward's: eval/<name>) falls below
            its best so far after training began by more than --alarm-se paired standard errors over the images
  drift     with a weight-0 gold reward evaluated (`--rewards toyscore:1,toy:0`): since the previous evaluation the
            proxy (eval/reward, what training maximises) rose and the gold fell, each by more than --alarm-se paired
            SEs: the laboratory's drift rule (lab/report.py's drift_table) for one run, its images in place of seeds
  signal    the mean of the last --alarm-window iterations of reward/zero_std_groups, train/clip_frac or
            train/approx_kl above --alarm-zero-std, --alarm-clip-frac or --alarm-kl (a window, not one noisy
            iteration; judged once the window is full)

The rules are pure functions of a sequence of evaluations [(iteration, {metric: (M,) per-image values})], as
evaluate.HeldOut keeps them, and of training-metric rows, as train.py logs them: the live run (`Watch`, called by
train.py after every iteration) and the laboratory's replay of committed runs (`python -m lab.alarms`) run the same
code. Every value they read is the same on every process (HeldOut's are gathered over processes, the training
metrics are means over them), so every process takes the same decision and a multi-GPU run never waits on one
process that stopped alone.

--keep-best METRIC: after each evaluation of the trained policy, the policy with the best mean so far is kept as
output_dir/checkpoints/best (checkpoint.save_checkpoint: the complete training state, lora/, lora_ema/, plus
best.json), replaced only when a later evaluation beats it. --stop-on-alarm ends the run at the first alarm after an
evaluation of that iteration (its last one: eval_iterNNNNNN.json, no eval_after.json) and a last checkpoint.

  python train.py --task tiny --rewards toyscore:1,toy:0 --eval-every 10 --keep-best eval/toy --stop-on-alarm true

Used by train.py and lab/alarms.py; tested by `python -m pytest tests/test_alarms.py`.

Shape legend: M evaluation images, N = --alarm-window iterations.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import torch

import config
from checkpoint import BEST, save_checkpoint
from config import Config
from evaluate import paired_change

# the training-signal alarms: name -> (the logged metric whose window mean is judged, the Config field of its
# threshold, what it says in words)
SIGNALS = {"zero_std": ("reward/zero_std_groups", "alarm_zero_std", "groups whose rewards all tie"),
           "clip_frac": ("train/clip_frac", "alarm_clip_frac", "ratio terms clipped"),
           "kl": ("train/approx_kl", "alarm_kl", "how far the updates move the policy")}
ALARMS = ("collapse", "drift", *SIGNALS)


# ---- the rules: pure functions ------------------------------------------------------------------------------------


def paired(before: torch.Tensor, after: torch.Tensor) -> tuple[float, float]:
    """The mean change after - before (M,) and its paired standard error over the images both scored (the first
    ones: an evaluation on the way may score only those, --eval-subset) where both have a value (NaN: none)."""
    m = min(len(before), len(after))
    a, b = before[:m].double(), after[:m].double()
    ok = ~(a.isnan() | b.isnan())
    if ok.sum() < 2:
        return math.nan, math.nan
    return paired_change(a[ok], b[ok])


def z_score(mean: float, se: float) -> float:
    """mean / se; a change with no spread over the images (se = 0) is infinitely sure of its sign."""
    if se > 0 or math.isnan(se):
        return mean / se
    return math.copysign(math.inf, mean) if mean else 0.0


def improves(best: torch.Tensor, now: torch.Tensor) -> bool:
    """Whether `now` beats `best` (M,): a higher mean over the images both scored, NaNs left out."""
    m = min(len(best), len(now))
    return bool(now[:m].nanmean() > best[:m].nanmean())


def best_index(evals: list, metric: str) -> int | None:
    """The best of `evals` [(iteration, {metric: (M,)})] by `metric`, walking forward and replacing the best only on
    an improvement (`improves`: an earlier evaluation keeps a tie); None if none has the metric."""
    best = None
    for i, (_, values) in enumerate(evals):
        if metric in values and (best is None or improves(evals[best][1][metric], values[metric])):
            best = i
    return best


def collapse(evals: list, metric: str, se: float) -> tuple[bool, float, int | None]:
    """The last evaluation against the best of the earlier ones of the trained policy (iteration > 0: a collapse
    loses what training gained, as the laboratory's late loss; a run below the base model from its start shows in
    eval/change): (fired, its change in paired SEs, the best's iteration). Fires when the change is below -se."""
    trained = [(i, v) for i, v in evals[:-1] if i > 0]
    best = best_index(trained, metric)
    if best is None or metric not in evals[-1][1]:
        return False, math.nan, None
    z = z_score(*paired(trained[best][1][metric], evals[-1][1][metric]))
    return z < -se, z, trained[best][0]


def drift(evals: list, proxy: str, golds: list[str], se: float) -> tuple[bool, dict[str, float]]:
    """The last two evaluations: (fired, {metric: its change in paired SEs}) for the proxy and each gold. Fires
    when the proxy rose by more than `se` SEs and some gold fell by more than `se`."""
    if len(evals) < 2:
        return False, {}
    (_, a), (_, b) = evals[-2:]
    z = {name: z_score(*paired(a[name], b[name])) for name in (proxy, *golds) if name in a and name in b}
    return z.get(proxy, math.nan) > se and any(z[g] < -se for g in golds if g in z), z


def signals(rows: list[dict], window: int, thresholds: dict[str, float | None]) -> dict[str, tuple[bool, float]]:
    """{alarm: (fired, the mean of its metric over the last `window` rows)} for each signal of SIGNALS whose
    threshold is not None; judged (and the mean given) only once `window` rows exist, else (False, nan)."""
    out = {}
    for name, (key, _, _) in SIGNALS.items():
        if thresholds.get(name) is None:
            continue
        last = [row[key] for row in rows[-window:] if key in row]
        mean = sum(last) / len(last) if len(rows) >= window and last else math.nan
        out[name] = (mean > thresholds[name], mean)
    return out


def thresholds(cfg: Config) -> dict[str, float | None]:
    """The signal alarms' thresholds of a run; None turns one off (--alarm-kl 0: the KL has no level that means
    anything before it is measured on the task)."""
    out = {name: getattr(cfg, attr) for name, (_, attr, _) in SIGNALS.items()}
    return {name: None if name == "kl" and v == 0 else v for name, v in out.items()}


def watched_metric(cfg: Config) -> str:
    """The per-image metric the collapse alarm watches: --keep-best's, else the first reward trained on (weight not
    0), else the total."""
    if cfg.keep_best:
        return cfg.keep_best.removeprefix("eval/")
    trained = [name for name, w in config.parse_weights(cfg.rewards).items() if w != 0]
    return trained[0] if trained else "reward"


def gold_metrics(cfg: Config) -> list[str]:
    """The weight-0 rewards: reported beside the proxy, never trained on (the drift alarm's golds)."""
    return [name for name, w in config.parse_weights(cfg.rewards).items() if w == 0]


# ---- the live run ---------------------------------------------------------------------------------------------------


def _to_json(values: dict) -> dict:
    return {k: [None if math.isnan(x) else x for x in v.tolist()] for k, v in values.items()}


def _from_json(values: dict) -> dict:
    return {k: torch.tensor([math.nan if x is None else x for x in v], dtype=torch.float32) for k, v in values.items()}


@dataclass
class Watch:
    """The alarms and the best checkpoint of one run. train.py calls `step` after every iteration; it runs the
    evaluation that is due (on the way, at the end, or at an alarm under --stop-on-alarm), judges the alarms, keeps
    the best checkpoint, adds alarm/* and best/* to the iteration's log and says whether the run stops. Its history
    (`state`) is saved in every checkpoint as alarms.json, so a resumed run judges as the straight run would."""

    cfg: Config
    resume_from: str = ""  # a checkpoint folder: its alarms.json restores the history
    evaluations: list = field(default_factory=list)  # [(tag, iteration, {metric: (M,)})]: the rules' metrics only
    rows: list = field(default_factory=list)  # the last N iterations' SIGNALS metrics
    best: dict | None = None  # best.json of the kept checkpoint: tag, iteration, metric, value
    fired: dict = field(default_factory=dict)  # {alarm: [the iterations at which it was judged to fire]}
    on: dict = field(default_factory=dict)  # {alarm: on at its last judgement}

    def __post_init__(self):
        self.metric, self.golds = watched_metric(self.cfg), gold_metrics(self.cfg)
        self.kept = list(dict.fromkeys([self.metric, "reward", *self.golds]))  # the per-image values the rules read
        path = os.path.join(self.resume_from, "alarms.json")
        if self.resume_from and os.path.isfile(path):  # a checkpoint from before the alarms has none: a fresh start
            with open(path) as f:
                saved = json.load(f)
            self.evaluations = [(e["tag"], e["iteration"], _from_json(e["values"])) for e in saved["evaluations"]]
            self.rows, self.best, self.fired, self.on = saved["rows"], saved["best"], saved["fired"], saved["on"]

    def state(self) -> dict:
        """What alarms.json holds: the history every rule reads, the best, the alarms' record."""
        return {"evaluations": [{"tag": t, "iteration": i, "values": _to_json(v)} for t, i, v in self.evaluations],
                "rows": self.rows, "best": self.best, "fired": self.fired, "on": self.on}

    def step(self, run, log: dict, summaries: dict) -> bool:
        """After iteration run.progress.iteration of `run` (train.Run): the signal alarms on its `log`, the
        evaluation that is due (its summary into `log`, and into `summaries` at the end or a stop), the held-out
        alarms and the best checkpoint. Returns True when --stop-on-alarm ends the run here."""
        cfg, done = self.cfg, run.progress.iteration
        if not self.evaluations and "before" in run.heldout.values:  # the evaluation before training (train.main)
            self._record("before", 0, run.heldout.values["before"])
        self.rows = (self.rows + [{key: log[key] for key, _, _ in SIGNALS.values() if key in log}])[-cfg.alarm_window:]
        means = signals(self.rows, cfg.alarm_window, thresholds(cfg))
        judged = {name: fired for name, (fired, _) in means.items()}
        last, stopping = done == cfg.iterations, cfg.stop_on_alarm and any(judged.values())
        tag = "after" if last else f"iter{done:06d}"
        due = last or stopping or bool(cfg.eval_every and done % cfg.eval_every == 0)
        summary = run.heldout(tag, done) if due else None
        if summary is not None:
            log.update(summary)
            judged.update(self._evaluated(run, tag, done, log))
        for name in ALARMS:
            if name in means and judged[name] and not self.on.get(name):  # a signal alarm's line when it comes on
                key, attr, words = SIGNALS[name]
                run.accelerator.print(f"alarm at iteration {done}: {key} ({words}) averages {means[name][1]:.3g} over "
                                      f"the last {cfg.alarm_window} iterations, above --{attr.replace('_', '-')} "
                                      f"{getattr(cfg, attr):g}")
            if judged.get(name):
                self.fired.setdefault(name, []).append(done)
            self.on[name] = judged.get(name, self.on.get(name, False))  # held-out alarms: as of the last evaluation
            log[f"alarm/{name}"] = float(self.on[name])
        stop = cfg.stop_on_alarm and any(judged.values()) and not last
        if summary is not None and (last or stop):
            summaries[tag] = summary
        if stop:
            run.accelerator.print(f"--stop-on-alarm: the run ends at iteration {done}{self._best_words()}")
        return stop

    def _record(self, tag: str, iteration: int, values: dict):
        self.evaluations.append((tag, iteration, {k: values[k] for k in self.kept if k in values}))

    def _evaluated(self, run, tag: str, done: int, log: dict) -> dict[str, bool]:
        """An evaluation at iteration `done`: the best checkpoint, the collapse and drift alarms (a line each time
        they fire), their statistics into `log`. Returns {alarm: fired}."""
        cfg, print_ = self.cfg, run.accelerator.print
        self._record(tag, done, run.heldout.values[tag])
        evals = [(i, v) for _, i, v in self.evaluations]
        if cfg.keep_best:
            self._keep(run, tag, done)
            log.update({"best/iteration": self.best["iteration"], "best/value": self.best["value"]})
        fell, z, best = collapse(evals, self.metric, cfg.alarm_se)
        log.update({"alarm/collapse_z": z} if math.isfinite(z) else {})
        if fell:
            print_(f"alarm at iteration {done}: held-out collapse: eval/{self.metric} is {-z:.1f} paired SEs below "
                   f"its best so far (iteration {best}; --alarm-se {cfg.alarm_se:g}){self._best_words()}")
        parted, zs = drift(evals, "reward", self.golds, cfg.alarm_se)
        log.update({f"alarm/{name}_z": v for name, v in zs.items() if math.isfinite(v)})
        if parted:
            print_(f"alarm at iteration {done}: proxy and gold part ways since iteration {evals[-2][0]}: "
                   + ", ".join(f"eval/{name} {v:+.1f} paired SEs" for name, v in zs.items()))
        return {"collapse": fell, "drift": parted}

    def _keep(self, run, tag: str, done: int):
        """--keep-best: this evaluation's policy becomes the best checkpoint if it beats the kept one (every process
        decides alike from the gathered values and takes part in the save). The policy before training is never
        kept (it is the base model: evaluate.py --checkpoint none)."""
        now = self.evaluations[-1][2][self.metric]
        # the kept one's values (none if it was kept by another metric before a resume: then this one replaces it)
        same = self.best and self.best["metric"] == self.cfg.keep_best
        kept = {t: v for t, _, v in self.evaluations}.get(self.best["tag"], {}) if same else {}
        if done == 0 or (self.metric in kept and not improves(kept[self.metric], now)):
            return
        self.best = {"tag": tag, "iteration": done, "metric": self.cfg.keep_best, "value": now.nanmean().item()}
        folder = save_checkpoint(run.accelerator, run.policy, run.ema, run.progress, self.cfg, name=BEST,
                                 extra={"best.json": self.best, "alarms.json": self.state()})
        run.accelerator.print(f"best checkpoint: iteration {done}, {self.cfg.keep_best} {self.best['value']:.4f} "
                              f"({folder})")

    def _best_words(self) -> str:
        if not self.best:
            return ""
        return (f"; the best checkpoint: iteration {self.best['iteration']}, {self.best['metric']} "
                f"{self.best['value']:.4f} ({os.path.join(self.cfg.output_dir, 'checkpoints', BEST)})")

    def summary(self) -> str:
        """The end of the run: each alarm, when it was on (or never), and the best checkpoint."""
        names = {"collapse": f"held-out collapse of eval/{self.metric}", "drift": "proxy and gold part ways",
                 **{name: f"{key} above --{attr.replace('_', '-')}" for name, (key, attr, _) in SIGNALS.items()}}
        lines = [f"alarm {names[name]}: " + (f"fired at {len(its)} judgement(s), the first at iteration {its[0]}, "
                                              f"the last at {its[-1]}" if (its := self.fired.get(name)) else "never")
                 for name in ALARMS]
        return "\n".join(lines + ([self._best_words()[2:]] if self.best else []))
