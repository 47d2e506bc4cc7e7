"""Tools around the reproduction, run from the repository root as modules:
  python -m tools.gpu_check    # every GPU figure of the docs in one prepared command
"""
