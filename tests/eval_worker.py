"""evaluate.py with tests/train_worker.py's rewards registered (`brightness`), run as a script under `accelerate
launch` by tests/test_train.py."""

import sys

import evaluate
from tests import train_worker  # noqa: F401 (registers the test rewards)

if __name__ == "__main__":
    evaluate.main(sys.argv[1:])
