"""prompt_sets.py: the official prompt files fetched on first use, served by a local HTTP server in the test process
(no internet): a good download, a corrupted one, an unreachable host, a file already present (no request made),
and `train.py --task pickscore` getting its prompts without a manual step. Served files get pins computed here
(the real files are not available offline); the real pins were read off the repository at prompt_sets.COMMIT."""

import hashlib
import http.server
import json
import socket
import threading

import pytest

import config
import prompt_sets
import train

NAME = "dataset/pickscore_sfw/train.txt"


@pytest.fixture
def server(tmp_path):
    """A local HTTP server over tmp_path/served in a thread: (base URL, served folder, paths requested)."""
    root, seen = tmp_path / "served", []
    root.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            seen.append(self.path)
            super().do_GET()

        def log_message(self, *args):  # keep pytest's output clean
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}/", root, seen
    httpd.shutdown()
    httpd.server_close()


def pin(content: bytes) -> prompt_sets.Pin:
    return prompt_sets.Pin(prompt_sets.git_blob_id(content), len(content), hashlib.sha256(content).hexdigest())


def publish(root, monkeypatch, name: str, content: bytes, pinned: bytes | None = None):
    """Serve `content` as the official file `name`, pinned to `pinned` (default: `content` itself)."""
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(content)
    monkeypatch.setitem(prompt_sets.FILES, name, pin(content if pinned is None else pinned))


def leftovers(folder):
    return sorted(p.name for p in folder.rglob("*") if p.is_file())


def test_git_blob_id_is_the_id_git_gives_a_file():
    # `git hash-object` of an empty file and of "hello world\n"
    assert prompt_sets.git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert prompt_sets.git_blob_id(b"hello world\n") == "3b18e512dba79e4c8300dd08aeb37f8e728b8dad"


def test_good_download_through_load_prompts(tmp_path, server, monkeypatch, capsys):
    url, root, seen = server
    publish(root, monkeypatch, NAME, b"a red cube\n\na blue ball\n")
    monkeypatch.setenv(prompt_sets.DATA_ENV, str(tmp_path / "data"))
    monkeypatch.setenv(prompt_sets.URL_ENV, url)
    prompts, metadata = config.load_prompt_set(NAME)
    assert prompts == ["a red cube", "a blue ball"] and metadata == [{}, {}]
    assert seen == ["/" + NAME]
    assert leftovers(tmp_path / "data") == ["train.txt"]  # the file itself, no temporary file beside it
    line = capsys.readouterr().err.strip().split("\r")[-1]
    assert NAME in line and "100%" in line and "verified" in line
    assert config.load_prompt_set(f"./{NAME}")[0] == prompts and len(seen) == 1  # the second read is local


def test_corrupted_download_stops_train_with_one_line_and_leaves_nothing(tmp_path, server, monkeypatch):
    url, root, seen = server
    publish(root, monkeypatch, NAME, b"a red cube\nsomething else\n", pinned=b"a red cube\na blue ball\n")
    monkeypatch.setenv(prompt_sets.DATA_ENV, str(tmp_path / "data"))
    monkeypatch.setenv(prompt_sets.URL_ENV, url)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as err:
        train.main(config.parse_config(["--task", "pickscore", "--mixed-precision", "no", "--output-dir", str(out)]))
    message = str(err.value.code)
    assert message.startswith("error: ") and len(message.splitlines()) == 1
    assert NAME in message and "failed its checksum" in message and str(tmp_path / "data") in message
    assert seen == ["/" + NAME] and leftovers(tmp_path / "data") == [] and not (out / "checkpoints").exists()


def test_unreachable_host_and_missing_file_say_where_to_put_a_copy(tmp_path, server):
    with socket.socket() as s:  # a port nothing listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/"
    with pytest.raises(prompt_sets.PromptSetError) as err:
        prompt_sets.local_copy(NAME, tmp_path / "data", closed)
    message = str(err.value)
    assert "cannot download" in message and "refused" in message and len(message.splitlines()) == 1
    assert f"put a copy of {closed}{NAME} at {tmp_path / 'data' / 'pickscore_sfw' / 'train.txt'}" in message
    url, _, seen = server  # the server holds nothing: 404
    with pytest.raises(prompt_sets.PromptSetError, match="HTTP Error 404"):
        prompt_sets.local_copy(NAME, tmp_path / "data", url)
    assert seen == ["/" + NAME] and leftovers(tmp_path / "data") == []


def test_a_present_file_is_used_without_the_network_and_checked(tmp_path, server, monkeypatch):
    url, _, seen = server
    content = b"a red cube\na blue ball\n"
    monkeypatch.setitem(prompt_sets.FILES, NAME, pin(content))
    (tmp_path / "pickscore_sfw").mkdir()
    (tmp_path / "pickscore_sfw" / "train.txt").write_bytes(content)
    assert prompt_sets.local_copy(NAME, tmp_path, url) == tmp_path / "pickscore_sfw" / "train.txt"
    (tmp_path / "pickscore_sfw" / "train.txt").write_bytes(content.replace(b"red", b"tan"))  # same size, other text
    with pytest.raises(prompt_sets.PromptSetError, match="is not the pinned .*git blob id"):
        prompt_sets.local_copy(NAME, tmp_path, url)
    assert seen == []


def test_train_pickscore_gets_its_prompts_without_a_manual_step(tmp_path, server, monkeypatch):
    url, root, seen = server
    publish(root, monkeypatch, NAME, b"a photo of a red cube\na photo of a blue ball\n")
    publish(root, monkeypatch, "dataset/pickscore_sfw/test.txt", b"a green cone\n")
    monkeypatch.setenv(prompt_sets.DATA_ENV, str(tmp_path / "data"))
    monkeypatch.setenv(prompt_sets.URL_ENV, url)
    out = tmp_path / "run"
    # the pickscore preset with its prompt sets; only the model, the reward and the sizes are made CPU-sized
    train.main(config.parse_config(
        ["--task", "pickscore", "--model", "tiny", "--rewards", "jpeg_compressibility:1", "--resolution", "16",
         "--steps", "4", "--window", "3", "--eval-steps", "4", "--prompts-per-iter", "2", "--group-size", "2",
         "--sample-batch", "4", "--train-batch", "2", "--eval-samples", "2", "--iterations", "1",
         "--max-sequence-length", "32", "--mixed-precision", "no", "--report-to", "none", "--output-dir", str(out)]))
    assert sorted(seen) == ["/dataset/pickscore_sfw/test.txt", "/" + NAME]
    assert json.load(open(out / "eval_after.json"))["iteration"] == 1


def test_every_preset_names_pinned_prompt_files():
    named = {p[k] for p in config.PRESETS.values() for k in ("prompts", "eval_prompts") if k in p}
    official = {n for n in named if n.startswith(prompt_sets.PREFIX)}
    assert official and official <= prompt_sets.FILES.keys() and all(prompt_sets.is_official(n) for n in official)
    assert "dataset/drawbench/test.txt" in prompt_sets.FILES  # DrawBench's evaluation reads it the same way
    assert all(len(p.blob) == 40 for p in prompt_sets.FILES.values())
