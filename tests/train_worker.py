"""train.py with one more reward, `half_constant`, registered first: run in-process by tests/test_train.py and as a
script under `accelerate launch` (2 gloo processes). Prompts starting with "constant" score 0 whatever the image, so
their whole group has advantage 0 at every window step and Flow-GRPO's zero-advantage filter drops it; the other
prompts score JPEG compressibility (a continuous value: no ties)."""

import sys

import torch

import config
import rewards
import train


def load_half_constant(device, **_):
    jpeg = rewards.load_jpeg_compressibility(device)

    def score(images, prompts, metadata):
        constant = torch.tensor([p.startswith("constant") for p in prompts], device=device)  # (N,)
        return torch.where(constant, 0.0, jpeg(images, prompts, metadata))  # (N,)

    return score


rewards.REWARD_LOADERS["half_constant"] = load_half_constant

if __name__ == "__main__":
    train.main(config.parse_config(sys.argv[1:]))
