"""train.py with two more rewards registered first: run in-process by the tests and as a script under `accelerate
launch` (2 gloo processes), where each process then writes the weights it trained, trained_rank<r>.safetensors in
the output folder, for the test to compare; tests/eval_worker.py runs evaluate.py with them.

`half_constant`: prompts starting with "constant" score 0 whatever the image, so their whole group has advantage 0
at every window step and Flow-GRPO's zero-advantage filter drops it; the other prompts score JPEG compressibility (a
continuous value: no ties). `brightness`: the mean pixel value, a smooth function of the image, for comparisons of
runs whose images differ by float rounding (other batch shapes, compiled kernels): their rewards then differ by
rounding too, where a JPEG reward steps by a byte (1e-3) whenever a rounding moves a uint8 pixel across a level."""

import os
import sys

import torch
from safetensors.torch import save_file

import config
import rewards
import train


def load_half_constant(device, **_):
    jpeg = rewards.load_jpeg_compressibility(device)

    def score(images, prompts, metadata):
        constant = torch.tensor([p.startswith("constant") for p in prompts], device=device)  # (N,)
        return torch.where(constant, 0.0, jpeg(images, prompts, metadata))  # (N,)

    return score


def load_brightness(device, **_):
    return lambda images, prompts, metadata: images.mean((1, 2, 3))  # (N,)


rewards.REWARD_LOADERS["half_constant"] = load_half_constant
rewards.REWARD_LOADERS["brightness"] = load_brightness

if __name__ == "__main__":
    cfg = config.parse_config(sys.argv[1:])
    trained = train.main(cfg)["policy"]
    weights = {name: p.detach().contiguous() for name, p in trained.named_parameters() if p.requires_grad}
    save_file(weights, os.path.join(cfg.output_dir, f"trained_rank{os.environ.get('RANK', '0')}.safetensors"))
