"""Run by tests/test_train.py under `accelerate launch` with 2 processes (gloo): every process holds only its own
trajectories' completion rewards and calls train.assign_credit, the code train.py runs between scoring and the
policy update. Each process saves the advantages it got; the test compares them with one process's computation."""

import os
import sys

import torch
from accelerate import Accelerator

import config
import train

out = sys.argv[1]
accelerator = Accelerator()
N, W, G = 12, 4, 4
g = torch.Generator().manual_seed(0)
R = (torch.rand(N, W + 1, generator=g) * 4).round() / 4  # (N, W+1) few levels: ties and sign(0) cases
mine = torch.arange(accelerator.process_index, N, accelerator.num_processes)  # strided: groups span processes
result = {"mine": mine, "R": R}
for algo in ("tp-grpo", "flow-grpo", "incremental"):
    cfg = config.Config(algo=algo, prompts_per_iter=N // G, group_size=G, window=W)
    R_mine = R[mine] if algo != "flow-grpo" else R[mine][:, -1:]  # Flow-GRPO scores the final image only
    *_, adv = train.assign_credit(accelerator, R_mine, mine, cfg)
    result[algo] = adv.cpu()
torch.save(result, os.path.join(out, f"rank{accelerator.process_index}.pt"))
accelerator.wait_for_everyone()
accelerator.end_training()  # a gloo group left to interpreter exit can abort
