"""The official prompt sets of Sec. 5 (PickScore, OCR, GenEval, DrawBench), fetched on first use from the
TurningPoint-GRPO repository at a pinned commit and verified against pinned checksums before anything reads them.

The presets name these files as `dataset/<set>/<file>` (config.PRESETS). config.load_prompts, the one place prompt
files are read, hands every such name to `local_copy`, which returns the file in the data folder:
  * present: checked against its pin (below) and used; the network is not touched;
  * missing: downloaded from BASE_URL/<path> into a temporary file beside its destination, checked, then renamed
    into place (os.replace is atomic: nothing half-written is ever left under the real name, and a failed or
    corrupted download leaves nothing at all). Several processes of one launch may do this at once: each writes
    its own temporary file and renames identical, verified bytes.
Any failure (offline, an HTTP error, a checksum mismatch) raises PromptSetError (an OSError), one line naming the
file, why, and where to put a copy by hand; train.py and evaluate.py exit with it.

Source: github.com/YunzeTong/TurningPoint-GRPO at commit COMMIT, folder dataset/, MIT licence (Copyright (c) 2026
Yunze Tong). Every pin is a file's git blob id at that commit (SHA-1 of b"blob <size>\\0" + content, what
`git hash-object FILE` prints and `git ls-tree -l COMMIT dataset` lists), which fixes its content exactly; size
and SHA-256 are pinned too where they were read from the file at that commit (ocr/train.txt and
geneval/train_metadata.jsonl: blob id only).

  python prompt_sets.py                    # fetch every official set now (e.g. on a login node with internet)
  python prompt_sets.py dataset/ocr/test.txt --folder /scratch/prompts

The data folder is `dataset/` beside this file, or $TP_GRPO_DATA (`folder=` in code); the base URL is the
repository's raw files at COMMIT, or $TP_GRPO_DATA_URL (`base_url=`): a mirror, or the tests' local server.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = "YunzeTong/TurningPoint-GRPO"
COMMIT = "994d26a63b65dbeba3260286317c137453cf3070"
BASE_URL = f"https://raw.githubusercontent.com/{REPOSITORY}/{COMMIT}/"
DATA_ENV, URL_ENV = "TP_GRPO_DATA", "TP_GRPO_DATA_URL"
DEFAULT_FOLDER = Path(__file__).resolve().parent / "dataset"  # found from any working directory, as toy_model/
PREFIX = "dataset/"  # the official names are the files' paths in the repository
TIMEOUT_S = 60  # per network operation (connect, each read)


@dataclass(frozen=True)
class Pin:
    blob: str  # git blob id: SHA-1 of b"blob <size>\0" + content
    size: int | None = None  # bytes, where known
    sha256: str | None = None  # where known


# the repository's files at COMMIT (git ls-tree -l), and the SHA-256 of those whose content was read
FILES = {
    "dataset/pickscore_sfw/train.txt": Pin("702338a757b3d434c7ba4319c65d11f78e3ee43f", 1805893,
                                           "edb46f78d7d93df0bafb30568074463822312ee339200f627195ccb2ff1d2f7a"),
    "dataset/pickscore_sfw/test.txt": Pin("bda69556a75a37a5542d2961852573d9df2e1245", 123967,
                                          "d839050acb06aa045e399e76a81e4ade9a55fc743dc0e22e7b3eaeaca5c19107"),
    "dataset/ocr/train.txt": Pin("3ce0521b77b0a9031191d66ecc36ebaaf27a3922"),
    "dataset/ocr/test.txt": Pin("8deb4f8d8f2e863f45353354243669b3c991a6a2", 217565,
                                "4dd8caf3ab6ade73bd376c7d14c6ca49b6eacfb1bd321e22c40714ae4a98d4dc"),
    "dataset/geneval/train_metadata.jsonl": Pin("0b97e8a6802c08fc7537cd00c76ae79c851bddcb"),
    "dataset/geneval/test_metadata.jsonl": Pin("27cdaf5cc1356fe15aeadbb8df55682ca74228f0", 340835,
                                               "cec4b24b9fee7bac21c8f787054ecc8dc9ff831674037713a4cd35e0f0a74a28"),
    "dataset/drawbench/test.txt": Pin("8d96e7cf7017ce6ce299a6eec96e21467a2ac7aa", 65164,
                                      "9006b98feabb94b28a2bc0c88de42fd4f31a9ec3c2a19e308a02c5385b7172f0"),
}


class PromptSetError(OSError):
    """An official prompt file could not be had; the message is one line: which, why, where to put a copy."""


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's content (`git hash-object`): SHA-1 of b"blob <size>\\0" + content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def mismatch(data: bytes, pin: Pin) -> str:
    """'' when `data` is the pinned content, else what differs (size first: the most telling when a download was
    cut short or an error page was saved)."""
    if pin.size is not None and len(data) != pin.size:
        return f"{len(data)} bytes, pinned {pin.size}"
    if git_blob_id(data) != pin.blob:
        return f"git blob id {git_blob_id(data)[:12]}, pinned {pin.blob[:12]}"
    if pin.sha256 is not None and hashlib.sha256(data).hexdigest() != pin.sha256:
        return f"SHA-256 {hashlib.sha256(data).hexdigest()[:12]}, pinned {pin.sha256[:12]}"
    return ""


def is_official(spec) -> bool:
    """Whether a prompt spec names one of the pinned files (`dataset/...`, as the presets write it)."""
    return isinstance(spec, str) and os.path.normpath(spec) in FILES


def local_copy(name: str, folder: str | os.PathLike | None = None, base_url: str | None = None) -> Path:
    """The verified local file of the official set `name`, downloaded first if it is missing."""
    name = os.path.normpath(name)
    pin = FILES[name]
    folder = Path(folder or os.environ.get(DATA_ENV) or DEFAULT_FOLDER)
    path = folder / name[len(PREFIX):]
    url = (base_url or os.environ.get(URL_ENV) or BASE_URL).rstrip("/") + "/" + name
    if path.is_file():
        # A present file is used without the network, but checked in full: it is read whole anyway a moment later
        # and hashing a few MB costs milliseconds, while a stale or hand-edited copy would silently change what a
        # run trains on and what its numbers mean.
        problem = mismatch(path.read_bytes(), pin)
        if problem:
            raise PromptSetError(f"prompt file {path} is not the pinned {name} ({problem}); delete it to download "
                                 f"the pinned one from {url}, or pass your own set under another path")
        return path
    download(name, url, path, pin)
    return path


def download(name: str, url: str, path: Path, pin: Pin) -> None:
    """`url` -> a temporary file beside `path` -> checked against `pin` -> renamed to `path`, with a progress line
    on stderr. On any failure nothing is left behind and PromptSetError says where to put a copy by hand."""
    by_hand = f"put a copy of {url} at {path} (or set {DATA_ENV} to a folder holding {name[len(PREFIX):]})"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name + ".", suffix=".part", delete=False)
    except OSError as e:
        raise PromptSetError(f"cannot write prompt file {name} into {path.parent} ({e.strerror}); "
                             f"set {DATA_ENV} to a writable folder") from e
    line = Progress(f"prompt set {name} <- {url}", pin.size)
    try:
        with part:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
                line.total = line.total or int(response.headers.get("Content-Length") or 0)
                while chunk := response.read(1 << 16):
                    part.write(chunk)
                    line.advance(len(chunk))
        problem = mismatch(Path(part.name).read_bytes(), pin)
        if problem:
            raise PromptSetError(f"prompt file {name} from {url} failed its checksum ({problem}); nothing was "
                                 f"kept; {by_hand}")
        os.chmod(part.name, 0o644)  # a temporary file is private (0600); the prompt file is as readable as any
        os.replace(part.name, path)
        line.end(f", checksums verified, saved to {path}")
    except PromptSetError:
        line.end("")
        raise
    except (OSError, http.client.HTTPException) as e:
        line.end("")
        # URLError wraps the socket's error (refused, unknown host, timeout); HTTPError says its status itself
        reason = e.reason if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError) else e
        raise PromptSetError(f"cannot download prompt file {name} from {url} ({reason}); {by_hand}") from e
    finally:
        if os.path.exists(part.name):
            os.remove(part.name)


class Progress:
    """One line on stderr, rewritten in place: 'prompt set NAME <- URL: 0.6 of 1.8 MB (33%)'."""

    def __init__(self, what: str, total: int | None):
        self.what, self.total, self.got = what, total or 0, 0

    def advance(self, size: int) -> None:
        self.got += size
        done = f"{self.got / 1e6:.1f} of {self.total / 1e6:.1f} MB ({100 * self.got // self.total}%)" if self.total \
            else f"{self.got / 1e6:.1f} MB"
        print(f"\r{self.what}: {done}", end="", file=sys.stderr, flush=True)

    def end(self, note: str) -> None:
        """Finish the line (if one was started), so that what is printed next starts a line of its own."""
        if self.got:
            print(note, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", default=list(FILES), help=f"official sets (default: all): {', '.join(FILES)}")
    p.add_argument("--folder", help=f"data folder (default: ${DATA_ENV} or {DEFAULT_FOLDER})")
    p.add_argument("--base-url", help=f"where the files are (default: ${URL_ENV} or {BASE_URL})")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if not is_official(n)]
    if unknown:
        p.error(f"not an official set: {', '.join(unknown)}; choose from {', '.join(FILES)}")
    try:
        for name in args.names:
            print(f"{name}: {local_copy(name, args.folder, args.base_url)}")
    except PromptSetError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
