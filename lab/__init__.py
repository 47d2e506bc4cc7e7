"""The laboratory: the paper's experiments (Sec. 5) in miniature, in the toy world (toyworld.py), on a CPU.

Run from the repository root, as modules (so that the method's files at the top level are importable):
  python -m lab.compare list | run | report ...   # named experiments: variants x seeds of `train.py --task tiny`
  python -m lab.judge measure | fidelity | figures # the ODE judge against SDE continuations; the README's pictures
  python -m lab.toymodel pretrain | evaluate       # the shipped toy checkpoint's recipe
lab/README.md is the laboratory's guide: its protocol, its results and what they do and do not show. Nothing at the
top level imports this package: the reproduction stands without its laboratory.
"""

# models.py drops transformers' torchvision notice (a line no user can act on); imported here, before any module of
# the laboratory imports diffusers
import models  # noqa: F401,E402
