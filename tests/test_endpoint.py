"""`embodied eval` through an OpenAI-compatible endpoint, against a real `transformers serve` on 127.0.0.1.

No mock: the module trains the shipped tiny base for a few SFT steps (so that it answers in the format and
an episode's turn 1 executes, fails, and a turn 2 follows), saves it, serves the folder with `transformers
serve` on a free loopback port, and evaluates it both ways on a small generated MCQ split and a small
episode split. The server is killed mid-evaluation and restarted once.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from embodied.config import Config
from embodied.eval.compare import cells_of, format_cell
from embodied.eval.endpoint import EndpointClient, cache_key
from embodied.eval.loop import MCQEval, evaluate_answers
from embodied.eval.served import EndpointAnswerer
from embodied.eval.stats import format_result, markdown_table
from embodied.video import VideoConfig

# push: an impulse far too small, so turn 1 fails; two reasoning and two content regions, so that reading a
# non-streamed answer of transformers serve (one region of each kind kept: the last) loses the answer
SHORT = "<think>far</think><answer>0.05</answer><think>low</think>."
KEY_ENV = "EMBODIED_TEST_ENDPOINT_KEY"
KEY = "sk-test-7f3a9c1e-do-not-write-me"
N_MCQ = 8
QUIET = MCQEval(choice=False, progress=False)  # the answers alone, no progress bar


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`transformers serve FOLDER` on 127.0.0.1:`port`, started and killed by the tests."""

    def __init__(self, folder: Path, log: Path):
        self.folder, self.log, self.port, self.proc = folder, log, _free_port(), None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        exe = Path(sys.executable).parent / "transformers"
        cmd = [str(exe), "serve", str(self.folder), "--host", "127.0.0.1", "--port", str(self.port)]
        env = os.environ | {"OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [*cmd, "--device", "cpu"], stdout=self.log.open("a"), stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + 300  # a loaded 2-core machine takes minutes to import and load
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"transformers serve exited: {self.log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"transformers serve did not come up: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A generated MCQ split (arrow of time, 112 px) and a generated push episode split (56 px)."""
    from embodied.data.build import generate_dataset
    from embodied.data.episodes import generate_episodes
    from embodied.envs.config import EnvConfig

    root = tmp_path_factory.mktemp("endpoint_data")
    cfg = Config()
    cfg.data.root, cfg.data.n_train, cfg.data.n_val, cfg.data.n_test = str(root / "aot"), 0, 0, N_MCQ
    cfg.data.workers = 1
    generate_dataset(cfg.data, progress=False)
    env = EnvConfig(root=str(root / "env"), tasks=["push"], n_train=0, n_test=3, width=56, height=56)
    generate_episodes(env, progress=False)
    return cfg.data.root, env.root


@pytest.fixture(scope="module")
def served_folder(tmp_path_factory, data):
    """The tiny base after 120 SFT steps (5 s) towards SHORT on the push episodes, shown as images
    (`eval.media=images`, the form the server takes), saved as a folder."""
    from embodied.config import SFTConfig
    from embodied.data.load import Example, load_split
    from embodied.eval.answerer import as_images
    from embodied.policy.model import load_policy, save_policy
    from embodied.policy.tiny import SHIPPED
    from embodied.train.sft import train_sft
    from embodied.train.state import Run

    out = tmp_path_factory.mktemp("served")
    model, processor = load_policy(SHIPPED)
    train = load_split(data[1], "test", VideoConfig())
    train = [Example(as_images(e.record, e.clip), e.clip) for e in train]
    cfg = SFTConfig(steps=120, batch_size=1, lr=5e-3, eval_every=0, checkpoint_every=0, warmup_steps=0)
    train_sft(cfg, Run(model, processor, train, out / "sft", progress=False), target_fn=lambda r: SHORT)
    save_policy(model, processor, out / "model")
    return out / "model"


@pytest.fixture(scope="module")
def server(served_folder, tmp_path_factory):
    s = Server(served_folder, tmp_path_factory.mktemp("server") / "server.log")
    s.start()
    yield s
    s.kill()


def _cfg(run_dir: Path, root: str, **eval_settings) -> Config:
    cfg = Config()
    cfg.run_dir, cfg.data.root, cfg.threads = str(run_dir), root, 1
    for key, value in eval_settings.items():
        setattr(cfg.eval, key, value)
    return cfg


def _same_text(served: str, local: str) -> bool:
    """The same response, as far as a chat server lets one tell: `transformers serve` splits
    `<think>...</think>` off into `reasoning_content` (put back by the client), trimmed, drops an empty one,
    and trims the content: compared without whitespace and without an empty `<think></think>`."""
    squeeze = lambda t: "".join(t.split()).replace("<think></think>", "", 1)  # noqa: E731
    return squeeze(served) == squeeze(local)


def _predictions(run_dir: Path) -> dict[str, dict]:
    return {p["id"]: p for p in json.loads((run_dir / "eval_test.json").read_text())["predictions"]}


def test_endpoint_answers_equal_local_answers_and_the_key_is_written_nowhere(
    server, served_folder, data, tmp_path, monkeypatch
):
    from embodied.run import eval as run_eval

    monkeypatch.setenv(KEY_ENV, KEY)
    local = run_eval(_cfg(tmp_path / "local", data[0], media="images") | _policy(served_folder), False)
    served_cfg = _cfg(tmp_path / "served", data[0], endpoint=server.url, api_key_env=KEY_ENV)
    served = run_eval(served_cfg, False)
    a, b = _predictions(tmp_path / "local"), _predictions(tmp_path / "served")
    assert len(a) == len(b) == N_MCQ and served["n"] == N_MCQ and not served["failed"]
    for qid, row in a.items():  # the same greedy text (the server trims trailing spaces) and letter
        assert _same_text(b[qid]["response"], row["response"]), qid
        assert b[qid]["predicted"] == row["predicted"]
    assert served["accuracy"] == local["accuracy"] and served["unparseable"] == local["unparseable"]
    # transformers serve returns no log-probs: forced choice is unavailable, never a number
    assert "choice_accuracy" not in served and "unavailable" in served["settings"]["choice"]
    ep = served["endpoint"]
    # a streamed answer's usage comes in its last event, when asked for (stream_options.include_usage)
    assert ep["sent"] == ep["requests"] == N_MCQ and ep["sent_completion_tokens"] > 0 and ep["seconds"] > 0
    assert ep["unreported"] == 0 and "stream_options" not in ep["refused_fields"]
    assert ep["read"] == {"stream": N_MCQ} and ep["cached"] == 0 and served["settings"]["read"] == "stream"
    assert served["signature"]["media"] == local["signature"]["media"] == "images"
    assert served["signature"]["content_hash"] == local["signature"]["content_hash"] is not None
    written = [p for p in (tmp_path / "served").rglob("*") if p.is_file()]
    assert (
        any("endpoint_cache" in str(p) for p in written) and (tmp_path / "served" / "config.yaml") in written
    )
    assert all(KEY.encode() not in p.read_bytes() for p in written)
    assert KEY_ENV in (tmp_path / "served" / "config.yaml").read_text()  # the variable's name only


def _policy(folder: Path):
    """`| _policy(folder)`: a tiny helper so the local config reads like the served one."""
    return _PolicyPath(str(folder))


class _PolicyPath:
    def __init__(self, path: str):
        self.path = path

    def __ror__(self, cfg: Config) -> Config:
        cfg.policy.path = self.path
        return cfg


def test_interactive_split_through_the_endpoint_executes_answers_and_shows_outcomes(
    server, served_folder, data, tmp_path
):
    from embodied.run import eval as run_eval

    local = run_eval(_cfg(tmp_path / "local", data[1], media="images") | _policy(served_folder), False)
    cfg = _cfg(tmp_path / "served", data[1], endpoint=server.url, samples=2, k=[1, 2])
    cfg.env.turns = 2
    served = run_eval(cfg, False)
    a, b = _predictions(tmp_path / "local"), _predictions(tmp_path / "served")
    assert all(r["response"].count("<think>") == 2 for r in a.values())  # several regions, every episode
    for qid, row in a.items():  # turn 1 is the single-turn greedy answer, executed in MuJoCo
        assert _same_text(b[qid]["response"], row["response"])
        # transformers serve drops an empty `<think></think>`, read by `reward/format` (docs/evaluation.md)
        same = lambda t: {k: v for k, v in t.items() if k not in ("reward/format", "reward/total")}  # noqa: E731
        assert same(b[qid]["terms"]) == same(row["terms"])
    assert served["success"] == local["success"] and served["n"] == 3
    assert all(r["terms"]["reward/unparseable"] == 0 for r in b.values())  # answers parse and execute
    second = [r for r in b.values() if len(r["turns"]) == 2]
    assert second, "a failed turn 1 is followed by a turn 2 that sees its outcome"
    assert "success@2" in served["turns"]["greedy"] and "best_of@2" in served["test_time"]
    assert all(len(r["sampled"]) == 2 for r in b.values())


def test_server_killed_mid_evaluation_loses_nothing_and_resume_sends_only_what_is_missing(
    server, data, tmp_path
):
    from embodied.data.load import load_split

    examples = load_split(data[0], "test", VideoConfig())
    cache = tmp_path / "cache"

    def answerer(on_response=None) -> EndpointAnswerer:
        client = EndpointClient(
            server.url, "", cache, concurrency=1, retries=1, backoff=0.05, on_response=on_response
        )
        return EndpointAnswerer(client, VideoConfig())

    def kill_at_half(done: int) -> None:
        if done == N_MCQ // 2:
            server.kill()

    first = answerer(kill_at_half)
    broken = evaluate_answers(first, examples, QUIET)
    lost = {f["id"] for f in broken["failed"]}
    assert all(f["error"] and f["family"] for f in broken["failed"])  # id, family and error, as documented
    assert lost and broken["n"] == N_MCQ - len(lost) and broken["requested"] == N_MCQ
    assert first.client.usage.failed == len(lost) and first.client.usage.retries == len(lost)
    assert all("predicted" not in r for r in broken["predictions"] if r.get("failed"))  # listed, not scored
    assert broken["unparseable"] < 1.0 or broken["n"] > 0  # accuracy is over the answered questions only

    server.start()
    again = answerer()
    resumed = evaluate_answers(again, examples, QUIET)
    assert again.client.usage.sent == len(lost) and again.client.usage.cached == N_MCQ - len(lost)
    assert resumed["n"] == N_MCQ and not resumed["failed"]
    once = evaluate_answers(answerer(), examples, QUIET)  # all cached now
    assert [r["response"] for r in once["predictions"]] == [r["response"] for r in resumed["predictions"]]
    kept = {r["id"]: r["response"] for r in broken["predictions"] if not r.get("failed")}
    assert all(r["response"] == kept[r["id"]] for r in resumed["predictions"] if r["id"] in kept)


def test_a_refused_request_is_counted_and_listed_never_scored(server, data, tmp_path):
    """A model the server does not serve: HTTP 400, not retried (it would fail the same way), every question
    listed as failed, none scored as wrong."""
    from embodied.data.load import load_split

    examples = load_split(data[0], "test", VideoConfig(), limit=3)
    client = EndpointClient(server.url, "not-this-model", tmp_path / "cache", retries=3, backoff=0.05)
    result = evaluate_answers(EndpointAnswerer(client, VideoConfig()), examples, QUIET)
    assert result["n"] == 0 and result["requested"] == 3 and len(result["failed"]) == 3
    assert result["accuracy"] is None and result["ci95"] is None  # no figure, not a 0.000 that reads as one
    assert format_result(result).startswith("no accuracy: none of the questions was answered (n=0, 3 failed)")
    assert "| **all** | all | 0 | none answered |" in markdown_table(result)
    assert format_cell(cells_of(result)[1][("all", "all")]) == "none answered n=0"
    assert client.usage.failed == 3 and client.usage.retries == 0 and "HTTP 400" in client.usage.errors[0]
    assert not any((tmp_path / "cache").rglob("*.json"))  # a failure is not cached: the next run asks again


def test_a_server_error_is_retried_then_counted(server, data, tmp_path):
    """A real 5xx: transformers serve 5.24 answers a Qwen2.5-VL `video_url` with HTTP 500, even given as the
    path of a local mp4 (`eval.video_url` auto on 127.0.0.1), which its video loader would read: it first
    loads the clip's audio, and soundfile cannot decode an mp4 without torchcodec (docs/evaluation.md). Each
    request is retried `retries` times, then listed as failed. If this test fails because the server answered,
    it has learned video: compare its answers with local video answers and update docs/evaluation.md."""
    from embodied.data.load import load_split

    examples = load_split(data[0], "test", VideoConfig(), limit=2)
    client = EndpointClient(server.url, "", tmp_path / "cache", retries=2, backoff=0.05)
    answerer = EndpointAnswerer(client, VideoConfig(), media="video")
    assert answerer.video_url == "file"
    result = evaluate_answers(answerer, examples, QUIET)
    assert result["n"] == 0 and len(result["failed"]) == 2
    assert (
        client.usage.retries == 4
        and client.usage.failed == 2
        and client.usage.errors[0].startswith("HTTP 500")
    )
    import av
    import numpy as np

    sent = sorted((tmp_path / "cache" / "videos").glob("*.mp4"))  # the paths the server was given
    assert len(sent) == 2
    with av.open(str(sent[0])) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert any(np.array_equal(frames, e.clip.frames) for e in examples)  # lossless, as the local clip


def test_response_text_puts_the_reasoning_back_and_choice_needs_log_probs():
    from embodied.eval.served import choice_from_logprobs, response_text

    def response(message: dict, logprobs=None) -> dict:  # the shape transformers serve returns
        return {"choices": [{"index": 0, "message": message} | ({"logprobs": logprobs} if logprobs else {})]}

    said = response({"role": "assistant", "content": "<answer>B</answer>", "reasoning_content": "it rises"})
    assert response_text(said) == "<think>it rises</think><answer>B</answer>"
    assert response_text(response({"content": "<answer>B</answer>"})) == "<answer>B</answer>"
    unclosed = response({"content": "", "reasoning_content": ".0.0<|im_end|>"})  # `<think>.0.0` never closed
    assert response_text(unclosed) == "<think>.0.0"
    assert choice_from_logprobs(said, 2) is None  # no log-probs: unavailable, never a guess
    tokens = [{"token": t, "logprob": -0.1, "top_logprobs": []} for t in ("<answer>", "B", "</answer>")]
    tokens[1]["top_logprobs"] = [{"token": "B", "logprob": -0.1}, {"token": " A", "logprob": -2.5}]
    assert choice_from_logprobs(response({"content": ""}, {"content": tokens}), 2) == [-2.5, -0.1]


def test_frames_travel_losslessly_as_png_and_as_mp4(data):
    """What the server decodes is the clip the local policy sees, pixel for pixel, at the clip's rate."""
    import base64
    import io

    import av
    import numpy as np
    from PIL import Image

    from embodied.data.load import load_split
    from embodied.eval.served import mp4_url, png_url

    clip = load_split(data[0], "test", VideoConfig(), limit=1)[0].clip
    png = base64.b64decode(png_url(clip.frames[1]).split(",", 1)[1])
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")), clip.frames[1])
    with av.open(io.BytesIO(base64.b64decode(mp4_url(clip).split(",", 1)[1]))) as container:
        stream = container.streams.video[0]
        assert float(stream.average_rate) == clip.fps
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
    assert np.array_equal(frames, clip.frames)


def test_cache_key_is_the_model_and_the_request_content():
    body = {"messages": [{"role": "user", "content": "x"}], "temperature": 0.0}
    assert cache_key("m", body) == cache_key("m", dict(reversed(body.items())))
    assert cache_key("m", body) != cache_key("n", body)
    assert cache_key("m", body) != cache_key("m", body | {"temperature": 1.0})


def test_a_non_streamed_answer_loses_regions_which_streaming_keeps(server, data, tmp_path):
    """The control of the test above: read without streaming, transformers serve's response parser keeps one
    reasoning and one content region (the last), so the served text is not the generated one."""
    from embodied.data.load import load_split

    examples = load_split(data[1], "test", VideoConfig(), limit=2)  # what the model was trained on
    texts = {}
    for stream in (True, False):
        client = EndpointClient(server.url, "", tmp_path / f"cache{stream}", stream=stream)
        answerer = EndpointAnswerer(client, VideoConfig())
        texts[stream] = answerer.greedy([e.record for e in examples], [e.clip for e in examples])
        assert client.usage.read == {"stream" if stream else "json": 2}
    assert all(t.count("<answer>") == 1 and t.count("<think>") == 2 for t in texts[True])
    assert all(t.count("<answer>") == 0 and t.count("<think>") == 1 for t in texts[False])


def test_sampled_requests_sample_and_a_greedy_server_is_reported_unavailable(server, data, tmp_path):
    """eval.samples=4 at temperature 1 against transformers serve: the client's sampling fields (sent as
    `generation_config` after the server refuses `do_sample` and `top_k`) make it sample, so pass@k and
    cons@k are reported. Without them (an API that takes no extra fields) the server answers greedily:
    identical samples, caught, and pass@k / cons@k reported unavailable with the reason, never as numbers.

    Version-independent: how many distinct texts temperature 1 gives depends on how sure the trained model is
    (transformers 5.25 trains the fixture to a surer model than 5.24 did: 3 distinct texts in 12), so the
    server's sampling is asserted through the detector's own probe (new seeds at a high temperature), which
    differs on a server that samples and not on one that answers greedily."""
    from embodied.data.load import load_split

    examples = load_split(data[0], "test", VideoConfig(), limit=3)
    how = MCQEval(choice=False, progress=False, samples=4, k=[1, 4], temperature=1.0)
    client = EndpointClient(server.url, "", tmp_path / "a")
    answerer = EndpointAnswerer(client, VideoConfig())
    sampled = evaluate_answers(answerer, examples, how)
    assert (
        set(client.usage.refused_fields) == {"do_sample", "top_k"} and "sampling" not in sampled["settings"]
    )
    assert "pass@4" in sampled and "cons@4" in sampled
    same = [["copy", "copy"]]  # what a greedy server would give: the probe must tell the two apart
    assert answerer.check_sampling(examples[0].record, examples[0].clip, 0, same, 1.0) == ""

    client = EndpointClient(server.url, "", tmp_path / "b")
    greedy = EndpointAnswerer(client, VideoConfig(), processor_kwargs=False)
    assert greedy.check_sampling(examples[0].record, examples[0].clip, 0, same, 1.0).startswith("unavailable")
    greedy.sampling = ""
    refused = evaluate_answers(greedy, examples, how)
    assert not any(k.startswith(("pass@", "cons@")) for k in refused)
    assert not any(k.startswith("pass@") for s in refused["per_family"].values() for k in s)
    assert refused["settings"]["sampling"].startswith("unavailable: the server returned identical samples")
    assert "pass@k and cons@k unavailable" in markdown_table(refused) and "unavailable" in format_result(
        refused
    )


def test_a_wrong_model_or_a_url_without_v1_fails_naming_the_fault(server, data, tmp_path, capsys):
    from embodied.cli import main

    base = [f"data.root={data[0]}", "eval.limit=2", "eval.retries=0", "threads=1", "-q"]
    run = tmp_path / "wrong"
    assert main(["eval", f"eval.endpoint={server.url}", "eval.model=nope", f"run_dir={run}", *base]) == 1
    err = capsys.readouterr().err
    assert "none of the 2 questions was answered: wrong model" in err and "nope" in err, err
    assert main(["eval", f"eval.endpoint={server.url[:-3]}", f"run_dir={tmp_path / 'v1'}", *base]) == 1
    assert "must be the server's base URL ending in /v1" in capsys.readouterr().err
    assert (
        main(["eval", f"eval.endpoint={server.url[:-3]}", "eval.model=m", f"run_dir={tmp_path / 'v'}", *base])
        == 1
    )
    assert "HTTP 404" in capsys.readouterr().err
    out = tmp_path / "cmp"
    assert main(["compare", str(run), f"out={out}"]) == 0  # the failed result: shown, not a crash
    assert "none answered n=0" in (out / "compare.html").read_text()


class _Broken(http.server.BaseHTTPRequestHandler):
    """A server that answers every chat request the same broken way (`mode`): HTTP 500, a 200 whose body is
    not JSON, or a 200 with `content: null`; `hits` counts the requests it received."""

    mode, hits = "500", 0

    def do_POST(self):  # noqa: N802 - the stdlib's name
        type(self).hits += 1
        asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        null = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None}}]}
        fine = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "<answer>A</answer>"}}]}
        refuse = b'{"detail": "stream is not supported"}'
        status, body, kind = {
            "500": (500, b"boom", "text/plain"),
            "html": (200, b"<html>a proxy's login page</html>", "text/html"),
            "null": (200, json.dumps(null).encode(), "application/json"),
            "json": (200, json.dumps(fine).encode(), "application/json"),  # ignores `stream`
            "nostream": (400, refuse, "application/json")
            if asked.get("stream")
            else (200, json.dumps(fine).encode(), "application/json"),
            "nooptions": (400, b'{"detail": "stream_options is not supported"}', "application/json")
            if "stream_options" in asked
            else (200, json.dumps(fine).encode(), "application/json"),
        }[self.mode]
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def broken():
    import threading

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


@pytest.mark.parametrize(
    ("mode", "hits", "cause"),
    [
        ("500", 4, "every request failed with a server error (HTTP 500"),
        ("html", 2, "not JSON"),
        ("null", 2, "null"),
    ],
)
def test_a_broken_server_fails_the_run_naming_why_and_compare_and_report_show_it(
    broken, data, tmp_path, capsys, mode, hits, cause
):
    """Every request 5xx (retried), a 200 that is not JSON or holds `content: null` (failed at once, neither
    retried nor cached nor scored): `embodied eval` exits 1 naming the cause; compare and report show the
    result as none answered."""
    from embodied.cli import main
    from embodied.report import build_report

    _Broken.mode, _Broken.hits = mode, 0
    run = tmp_path / "run"
    args = [f"eval.endpoint={broken}", "eval.model=m", "eval.limit=2", "eval.retries=1", "eval.backoff=0.01"]
    assert main(["eval", *args, f"data.root={data[0]}", f"run_dir={run}", "threads=1", "-q"]) == 1
    err = capsys.readouterr().err
    assert "none of the 2 questions was answered" in err and cause in err, err
    assert _Broken.hits == hits  # 2 questions: a 500 is retried once, a bad 200 never
    assert not list((run / "endpoint_cache").rglob("*.json"))
    result = json.loads((run / "eval_test.json").read_text())
    assert result["n"] == 0 and result["accuracy"] is None and result["endpoint"]["sent"] == 2
    assert main(["compare", str(run), f"out={tmp_path / 'cmp'}"]) == 0
    assert "none answered" in (tmp_path / "cmp" / "compare.html").read_text()
    page = build_report(run)
    assert "none answered" in page and f"Served: model m at {broken}" in page and "2 failed" in page


def test_a_closed_port_fails_naming_it_and_credentials_in_the_url_are_written_nowhere(data, tmp_path, capsys):
    from embodied.cli import main

    port = _free_port()  # nothing listens there
    base = [f"data.root={data[0]}", "eval.limit=2", "eval.retries=0", "threads=1", "-q"]
    closed = f"http://127.0.0.1:{port}/v1"
    assert main(["eval", f"eval.endpoint={closed}", f"run_dir={tmp_path / 'a'}", *base]) == 1
    assert f"connection refused at {closed}" in capsys.readouterr().err  # not "set eval.model"
    assert main(["compare", str(tmp_path / "a"), f"out={tmp_path / 'cmp'}"]) == 0  # its result: none answered
    assert "none answered n=0" in (tmp_path / "cmp" / "compare.html").read_text()
    assert main(["eval", f"eval.endpoint={closed}", "eval.model=m", f"run_dir={tmp_path / 'b'}", *base]) == 1
    err = capsys.readouterr().err
    assert "none of the 2 questions was answered: connection refused" in err, err
    assert json.loads((tmp_path / "b" / "eval_test.json").read_text())["endpoint"]["unreached"] == 2

    secret = "SECRET-do-not-print-7c1"
    url = f"http://user:{secret}@127.0.0.1:{port}/v1"
    assert main(["eval", f"eval.endpoint={url}", "eval.model=m", f"run_dir={tmp_path / 'c'}", *base]) == 1
    out = capsys.readouterr()
    assert "eval.api_key_env" in out.err and "***@127.0.0.1" in out.err
    assert secret not in out.out + out.err
    assert all(secret.encode() not in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    with pytest.raises(ValueError) as e:
        EndpointClient(url, "m", tmp_path / "cache")
    assert secret not in str(e.value)


@pytest.mark.parametrize("mode", ["json", "nostream"])
def test_a_server_that_does_not_stream_is_read_without_streaming(broken, data, tmp_path, mode):
    """A server that answers a streamed request with JSON, or refuses `stream` with a 400 naming it: the
    answer is read as JSON (`read` counts it) and scored, the refusal costing one extra request each."""
    from embodied.data.load import load_split

    _Broken.mode, _Broken.hits = mode, 0
    examples = load_split(data[0], "test", VideoConfig(), limit=2)
    client = EndpointClient(broken, "m", tmp_path / "cache", concurrency=1, retries=0)
    answerer = EndpointAnswerer(client, VideoConfig())
    result = evaluate_answers(answerer, examples, QUIET)
    assert result["n"] == 2 and {p["predicted"] for p in result["predictions"]} == {"A"}
    assert client.usage.read == {"json": 2} and client.usage.failed == 0
    # the answers carry no `usage`: the token counters say "not reported", never 0
    assert client.usage.sent_completion_tokens is None and client.usage.unreported == 2
    from dataclasses import asdict

    from embodied.run import tokens_sent

    assert tokens_sent(asdict(client.usage)) == "tokens not reported by the server"
    assert _Broken.hits == (2 if mode == "json" else 3) and answerer.settings()["read"] == (
        "stream" if mode == "json" else "json"
    )


def test_a_server_refusing_stream_options_keeps_streaming_without_it(broken, data, tmp_path):
    """The usage option refused with a 400 that names it (and not as an unexpected field): dropped like any
    refused field, one extra request, and streaming stays asked for."""
    from embodied.data.load import load_split

    _Broken.mode, _Broken.hits = "nooptions", 0
    examples = load_split(data[0], "test", VideoConfig(), limit=2)
    client = EndpointClient(broken, "m", tmp_path / "cache", concurrency=1, retries=0)
    answerer = EndpointAnswerer(client, VideoConfig())
    result = evaluate_answers(answerer, examples, QUIET)
    assert result["n"] == 2 and client.usage.refused_fields == ["stream_options"] and _Broken.hits == 3
    assert client.stream and answerer.settings()["read"] == "stream"


def test_streamed_pieces_are_rebuilt_in_arrival_order():
    from embodied.eval.reading import BadResponse, read_stream, rebuild_text

    pieces = [
        ("reasoning", "far"),
        ("content", "<answer>0.05</answer>"),
        ("reasoning", "low"),
        ("content", "."),
    ]
    assert rebuild_text(pieces) == SHORT
    assert rebuild_text([("reasoning", ".0.0<|im_end|>")]) == "<think>.0.0"  # never closed: stays open
    assert rebuild_text([("reasoning", "abc")], "length") == "<think>abc"  # cut by the token budget
    assert rebuild_text([("reasoning", "abc")], "stop") == "<think>abc</think>"
    events = [
        {"choices": [{"delta": {"role": "assistant"}}]},
        {"choices": [{"delta": {"reasoning_content": "far"}}]},
        {
            "choices": [{"delta": {"content": "<answer>B</answer>"}, "finish_reason": "stop"}],
            "usage": {"x": 2},
        },
    ]
    lines = [f"data: {json.dumps(e)}".encode() for e in events] + [b"", b"data: [DONE]"]
    got = read_stream(lines)
    assert got["choices"][0]["message"]["content"] == "<think>far</think><answer>B</answer>"
    assert got["usage"] == {"x": 2} and got["read"] == "stream"
    with pytest.raises(BadResponse):
        read_stream([b"<html>a login page</html>"])
    with pytest.raises(ConnectionError):  # an error event: retried like a 5xx
        read_stream([b'data: {"error": "CUDA out of memory"}'])
