"""Checkpoints of train.py: the exact training state (so that --resume continues bit for bit) plus the trained
weights in diffusers' format (so that a checkpoint loads in plain diffusers with `pipe.load_lora_weights`).

A checkpoint is output_dir/checkpoints/iter-NNNNNN/ holding accelerate's state (the trainable weights as
safetensors, the optimizer and RNG states), progress.json, config.json, ema.safetensors (with EMA), lora/ and
lora_ema/ (diffusers' LoRA format; transformer/ instead with full fine-tuning). Written under a .tmp name and
renamed when complete. Under DeepSpeed the engine writes its own state instead of model.safetensors and
optimizer.bin: pytorch_model/ with the trainable weights (frozen ones left out) and each process's shard of the
optimizer (docs/gpu.md, 'DeepSpeed ZeRO-2').

Written last, manifest.json lists every file with its size and SHA-256. --resume checks the checkpoint against it
before anything is loaded, and a damaged one (a file missing, truncated or changed) stops the run with one line
naming the file and what to do; nothing is written. A checkpoint from before manifests is checked by reading what it
holds: every JSON file parses, every safetensors header covers its file, every torch pickle archive's CRCs match (a
missing file then shows only when it is loaded).

Resuming with other settings: the fields that shape the saved state (SHAPING: the model, LoRA's rank, alpha and
targets, the EMA on or off) must match the checkpoint's config.json, checked before anything loads (one line naming
the field, the checkpoint's value and what to do; nothing written); every other field that differs is printed once
("resumed with lr 0.001 -> 0.01") and appended to output_dir/resumes.jsonl. A field an older config.json lacks
counts as unchanged.

Besides iter-NNNNNN, --keep-best keeps output_dir/checkpoints/best/ (alarms.py): the same complete checkpoint plus
best.json, replaced by the same write-then-rename; --resume takes it like any other, and 'latest' stays the newest
iter-NNNNNN.

Used by train.py and alarms.py; tested by tests/test_train.py (resume is bit-exact, damaged checkpoints are refused,
checkpoints load in diffusers), tests/test_alarms.py (the best checkpoint) and tests/test_bad_input.py (resuming with
other settings).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import zipfile
from dataclasses import dataclass

import safetensors.torch
from accelerate.utils import DistributedType
from safetensors import SafetensorError

from config import Config
from policy import EMA, save_weights


@dataclass
class Progress:
    """The loop's position, saved as progress.json in every checkpoint so --resume continues exactly."""

    iteration: int = 0


def register_trainable_only_hooks(accelerator):
    """accelerate's save_state keeps only the trainable weights (LoRA), not gigabytes of frozen base weights."""
    def save_hook(models, weights, output_dir):
        # under DeepSpeed `weights` is empty: the engine has written its own checkpoint (save_checkpoint)
        for i, (model, state) in enumerate(zip(models, weights)):
            keep = {name for name, p in model.named_parameters() if p.requires_grad}
            weights[i] = {k: v for k, v in state.items() if k in keep}

    def load_hook(models, input_dir):
        for i in range(len(models)):
            model = models.pop(0)
            name = "model.safetensors" if i == 0 else f"model_{i}.safetensors"
            state = safetensors.torch.load_file(os.path.join(input_dir, name))
            unexpected = model.load_state_dict(state, strict=False).unexpected_keys
            if unexpected:
                raise RuntimeError(f"checkpoint {input_dir} does not fit this model ({unexpected[0]} ...)")

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


def find_checkpoint(cfg: Config) -> str:
    """The folder --resume names ('latest' = the newest complete one in output_dir/checkpoints), checked whole
    (check_checkpoint), or exit with one line."""
    if cfg.resume != "latest":
        path = cfg.resume
    else:
        root = os.path.join(cfg.output_dir, "checkpoints")
        done = complete_checkpoints(root)
        if not done:
            sys.exit(f"error: --resume latest found no checkpoint in {root}; train first or pass a folder")
        path = os.path.join(root, done[-1])
    if not any(os.path.isfile(os.path.join(path, name)) for name in ("progress.json", MANIFEST)):
        sys.exit(f"error: '{path}' is not a training checkpoint (no progress.json); pass a folder "
                 f"output_dir/checkpoints/iter-NNNNNN written by train.py")
    problem = check_checkpoint(path)
    if problem:
        parent, name = os.path.split(os.path.normpath(path))
        earlier = [d for d in complete_checkpoints(parent) if d < name or name == BEST]  # best: any iter-NNNNNN
        advice = (f"resume from an earlier one (--resume {os.path.join(parent, earlier[-1])}, the newest of "
                  f"{len(earlier)}) or start fresh without --resume" if earlier else
                  f"start fresh without --resume (no earlier checkpoint in {parent})")
        sys.exit(f"error: checkpoint {path} is damaged: {problem}; {advice}")
    problem = shape_problem(saved_config(path), cfg)
    if problem:
        sys.exit(f"error: checkpoint {path} {problem}")
    if cfg.ema_decay > 0 and not os.path.isfile(os.path.join(path, "ema.safetensors")):
        sys.exit(f"error: '{path}' has no ema.safetensors (trained with EMA off, or by an older train.py); "
                 f"resume with the --ema-decay it was trained with")
    return path


def save_checkpoint(accelerator, transformer, ema: EMA | None, progress: Progress, cfg: Config, *, name: str = "",
                    extra: dict | None = None) -> str:
    """The whole training state plus diffusers-format weights of `transformer` (the unwrapped policy), written to
    a temp folder and renamed at the end, so that an interrupted save never leaves a checkpoint that looks
    complete. `name`: the folder under output_dir/checkpoints (default iter-NNNNNN; BEST for --keep-best's);
    `extra`: {file name: JSON-able} written beside progress.json (alarms.py's state, best.json). Every process
    calls it (accelerate's state has files of each). Returns the folder."""
    final = os.path.join(cfg.output_dir, "checkpoints", name or f"iter-{progress.iteration:06d}")
    tmp = final + ".tmp"
    if accelerator.is_main_process:  # what an interrupted save left there would otherwise enter the manifest
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    # DeepSpeed's engine saves the whole module unless told otherwise: gigabytes of frozen base weights
    accelerator.save_state(tmp, **({"exclude_frozen_parameters": True} if _deepspeed(accelerator) else {}))
    accelerator.wait_for_everyone()  # every process has written its files (RNG states, optimizer shards) into tmp
    if accelerator.is_main_process:
        save_weights(transformer, os.path.join(tmp, "lora"))
        if ema is not None:
            ema.swap()
            save_weights(transformer, os.path.join(tmp, "lora_ema"))
            ema.swap()
            ema.save(os.path.join(tmp, "ema.safetensors"))
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(cfg), f, indent=1)
        with open(os.path.join(tmp, "progress.json"), "w") as f:
            json.dump(dataclasses.asdict(progress), f)
        for file, content in (extra or {}).items():
            with open(os.path.join(tmp, file), "w") as f:
                json.dump(content, f)
        write_manifest(tmp)
        # the old folder (the previous best, or a checkpoint rewritten after a resume) is moved aside before the new
        # one takes its name: at every moment one complete checkpoint is there under the name or beside it (.old)
        if os.path.isdir(final):
            shutil.rmtree(final + ".old", ignore_errors=True)
            os.replace(final, final + ".old")
        os.replace(tmp, final)
        shutil.rmtree(final + ".old", ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, ema: EMA | None, progress: Progress, folder: str, cfg: Config, *, optimizer):
    """accelerate's state (trainable weights as safetensors; optimizer, RNG states as pickles), then ours:
    progress.json and ema.safetensors, not accelerate's pickled custom state. Exits with one line if the EMA does
    not fit. The settings changed since the checkpoint (config_changes) are printed in one line and appended to
    output_dir/resumes.jsonl, and this run's AdamW settings are put back into `optimizer`."""
    # the DeepSpeed checkpoint holds the trainable weights alone (save_checkpoint), so the frozen ones are missing
    accelerator.load_state(folder, **({"load_module_strict": False} if _deepspeed(accelerator) else {}))
    # torch's load_state_dict restores the saved param groups' hyperparameters too: without this, `--resume latest
    # --lr 0.01` would log lr 0.01 and go on stepping at the checkpoint's lr (AdamW's moments stay as saved)
    for group in optimizer.param_groups:
        group.update(lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), weight_decay=cfg.weight_decay,
                     eps=cfg.adam_eps)
    progress.iteration = json.load(open(os.path.join(folder, "progress.json")))["iteration"]
    if ema is not None:
        try:
            ema.load(os.path.join(folder, "ema.safetensors"))
        except ValueError as e:
            sys.exit(f"error: {e}")
    accelerator.print(f"resumed from {folder} at iteration {progress.iteration}")
    changes = config_changes(saved_config(folder), cfg)
    if changes:
        accelerator.print("resumed with " + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changes.items()))
        if accelerator.is_main_process:
            os.makedirs(cfg.output_dir, exist_ok=True)
            with open(os.path.join(cfg.output_dir, "resumes.jsonl"), "a") as f:
                f.write(json.dumps({"iteration": progress.iteration, "checkpoint": folder,
                                    "changed": {k: list(v) for k, v in changes.items()}}) + "\n")


# ---- resuming with other settings --------------------------------------------------------------------------------
BEST = "best"  # --keep-best's folder under output_dir/checkpoints (alarms.py)
# The fields that shape the saved state, with what a change would do: the trainable weights would not load (another
# model, rank or set of adapted layers: a state_dict error deep in accelerate), or would load into another policy
# (alpha scales LoRA's output by alpha / r); the EMA on or off is checked apart (shape_problem).
SHAPING = {"model": "the base model its weights adapt", "lora_rank": "the shape of its LoRA weights",
           "lora_alpha": "the scale of its LoRA (alpha / r): the same weights would be another policy",
           "lora_targets": "the layers its LoRA adapts"}


def saved_config(folder: str) -> dict:
    """The checkpoint's config.json ({} for a checkpoint without one)."""
    path = os.path.join(folder, "config.json")
    return json.load(open(path)) if os.path.isfile(path) else {}


def config_changes(saved: dict, cfg: Config) -> dict[str, tuple]:
    """{field: (the checkpoint's value, this run's)} for every field that differs from the checkpoint's config
    (`saved`); a field it lacks counts as unchanged, and --resume itself is left out."""
    now = dataclasses.asdict(cfg)
    return {k: (saved[k], v) for k, v in now.items() if k in saved and k != "resume" and not _same(k, saved[k], v)}


def shape_problem(saved: dict, cfg: Config) -> str:
    """'' if this run's settings fit the checkpoint's saved state, else the rest of one line: which field, the
    checkpoint's value and what to do."""
    changes = config_changes(saved, cfg)
    fix = "or start fresh without --resume (in another --output-dir)"
    for name, what in SHAPING.items():
        if name in changes:
            old, new = changes[name]
            flag = "--" + name.replace("_", "-")
            return f"was trained with {flag} {old}, not {new} ({what}); resume with {flag} {old}, {fix}"
    if "ema_decay" in changes and (changes["ema_decay"][0] > 0) != (cfg.ema_decay > 0):
        old, now = changes["ema_decay"][0], "on" if cfg.ema_decay > 0 else "off"
        return (f"was trained with the EMA {'on' if old > 0 else 'off'} (--ema-decay {old}) and --ema-decay "
                f"{cfg.ema_decay} turns it {now}; resume with --ema-decay {old}, {fix}")
    return ""


def _same(name: str, saved, now) -> bool:
    """Whether a saved setting equals this run's: LoRA's targets as a set; the model also when the saved path no
    longer exists and this run's folder has its name (the repository moved, e.g. the tiny preset's toy_model/, which
    the preset names by its absolute path) or when both name the same folder."""
    if saved == now:
        return True
    if name == "lora_targets" and isinstance(saved, str):
        return set(saved.split(",")) == set(now.split(","))
    if name == "model" and isinstance(saved, str) and os.path.isdir(now):
        if os.path.exists(saved):
            return os.path.samefile(saved, now)
        return os.path.basename(os.path.normpath(saved)) == os.path.basename(os.path.normpath(now))
    return False


# ---- the manifest ------------------------------------------------------------------------------------------------
MANIFEST = "manifest.json"


def write_manifest(folder: str):
    """manifest.json: every file under `folder` with its size and SHA-256, written last and atomically."""
    files = {rel: {"bytes": os.path.getsize(os.path.join(folder, rel)), "sha256": _sha256(os.path.join(folder, rel))}
             for rel in _files(folder)}
    with open(os.path.join(folder, MANIFEST + ".tmp"), "w") as f:
        json.dump({"files": files}, f, indent=1)
    os.replace(os.path.join(folder, MANIFEST + ".tmp"), os.path.join(folder, MANIFEST))


def check_checkpoint(folder: str) -> str:
    """'' if the checkpoint is whole, else what is wrong with which file: against manifest.json (every listed file
    there, of its size and SHA-256; files added later, such as evaluate.py's eval/, are not checked), or without one
    (a checkpoint from before manifests) every file that is there must read (READERS)."""
    manifest = os.path.join(folder, MANIFEST)
    if os.path.isfile(manifest):
        try:
            files = {rel: (int(w["bytes"]), w["sha256"]) for rel, w in json.load(open(manifest))["files"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{MANIFEST} cannot be read ({type(e).__name__}: {e})"
        for rel, (size, digest) in sorted(files.items()):
            path = os.path.join(folder, rel)
            if not os.path.isfile(path):
                return f"{rel} is missing"
            if os.path.getsize(path) != size:
                return f"{rel} has {os.path.getsize(path)} bytes where {size} were written"
            if _sha256(path) != digest:
                return f"{rel} differs from what was written (its SHA-256 does not match {MANIFEST})"
        return ""
    for rel in _files(folder):
        read = READERS.get(os.path.splitext(rel)[1])
        try:
            if read:
                read(os.path.join(folder, rel))
        except (OSError, ValueError, EOFError, SafetensorError, zipfile.BadZipFile) as e:
            return f"{rel} cannot be read ({type(e).__name__}: {e})"
    return ""


def complete_checkpoints(root: str) -> list[str]:
    """The names of the complete iter-NNNNNN checkpoints in `root`, oldest first (not an unfinished .tmp, a .old
    being replaced, or BEST)."""
    return sorted(d for d in os.listdir(root) if re.fullmatch(r"iter-\d+", d)) if os.path.isdir(root) else []


def _read_safetensors(path: str):
    """Opening reads the header and checks that its tensors cover the file exactly (a truncated file fails)."""
    with safetensors.safe_open(path, "pt") as f:
        f.keys()


def _read_torch_archive(path: str):
    """torch.save's files (accelerate's optimizer.bin and RNG states, DeepSpeed's .pt) are zip archives with a CRC
    per member."""
    bad = zipfile.ZipFile(path).testzip()
    if bad is not None:
        raise ValueError(f"the CRC of its member {bad} does not match")


# how a checkpoint from before manifests is checked, by file suffix
READERS = {".json": lambda path: json.load(open(path)),
           ".safetensors": _read_safetensors,
           ".bin": _read_torch_archive, ".pkl": _read_torch_archive, ".pt": _read_torch_archive}


def _files(folder: str) -> list[str]:
    """Every file under `folder` (but the manifest), as sorted paths relative to it."""
    return sorted(os.path.relpath(os.path.join(d, name), folder) for d, _, names in os.walk(folder) for name in names
                  if not (d == folder and name.startswith(MANIFEST)))


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _deepspeed(accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.DEEPSPEED
