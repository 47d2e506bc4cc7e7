"""pytest: make the flat top-level modules importable from tests/ and keep every test offline."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TP_GRPO_DATA_URL", "http://127.0.0.1:9/")  # prompt_sets: a refused port, never the internet
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
