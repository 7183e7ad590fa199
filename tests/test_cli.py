"""The command line: the README's quick start and `dsv4 synth`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dsv4

_ROOT = Path(dsv4.__file__).resolve().parent.parent


def dsv4_cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "dsv4.cli", *args], capture_output=True, text=True, timeout=timeout)


def dsv4_main(*args):
    """dsv4.cli.main(args) in this process, as dsv4_cli runs it in a new one but without its ~3 s of interpreter and
    torch start-up (the cases that fail before a model runs): (returncode, stdout, stderr) as a CompletedProcess.
    The worker's torch threads stay (conftest sets OMP_NUM_THREADS, which the command then keeps)."""
    import contextlib
    import io

    from dsv4.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = e.code
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def test_quick_start_generate():
    proc = dsv4_cli("generate", "--preset", "tiny", "--device", "cpu", "--prompt", "Hello", "--max-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Hello")
    assert "8 tokens" in proc.stderr or "tokens in" in proc.stderr


def test_synth_then_load(tmp_path):
    out = tmp_path / "ckpt"
    proc = dsv4_cli("synth", "--preset", "tiny", "--out", str(out), "--seed", "3", "--quant", "fp8")
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "fp8" and cfg["expert_dtype"] == "fp4"
    model = dsv4.load(out, device="cpu")
    state = model.new_state(8)
    assert torch.isfinite(model.prefill(state, [5, 6, 7])).all()
    again = dsv4_main("synth", "--preset", "tiny", "--out", str(out))
    assert again.returncode == 2 and str(out) in again.stderr  # never overwrites


def test_synth_from_config_and_bad_args(tmp_path):
    cfg = dsv4.config.preset("tiny").to_dict()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "num_hidden_layers": 3, "layer_types": cfg["layer_types"][:3],
                                "mlp_layer_types": ["hash_moe", "moe", "moe"]}))
    assert dsv4_main("synth", "--config", str(path), "--out", str(tmp_path / "c")).returncode == 0
    assert dsv4.load(tmp_path / "c", device="cpu").cfg.num_hidden_layers == 3
    neither = dsv4_main("synth", "--out", str(tmp_path / "d"))
    assert neither.returncode == 2 and "exactly one of" in neither.stderr
    path.write_text(json.dumps({**cfg, "scoring_func": "relu"}))
    bad = dsv4_main("synth", "--config", str(path), "--out", str(tmp_path / "e"))
    assert bad.returncode == 2 and "scoring_func" in bad.stderr and not (tmp_path / "e").exists()


def chat(stdin: str, *args):
    return subprocess.run([sys.executable, "-m", "dsv4.cli", "chat", "--preset", "tiny", "--device", "cpu", *args],
                          input=stdin, capture_output=True, text=True, timeout=240)


def test_chat_turns_are_reproducible_and_follow_the_engine():
    """Two user turns get two replies; the same seed replays the same session; the first reply is the
    engine's sampled stream for the chat-encoded prompt (seed + turn 0)."""
    from dsv4.serve.protocol import Request, chat_text, generate

    a = chat("hello\nhow are you\n", "--max-tokens", "6", "--seed", "3")
    b = chat("hello\nhow are you\n", "--max-tokens", "6", "--seed", "3")
    c = chat("hello\nhow are you\n", "--max-tokens", "6", "--seed", "3", "--speculate", "ngram")  # the same tokens
    assert a.returncode == 0 and c.returncode == 0, a.stderr + c.stderr
    assert a.stdout == b.stdout == c.stdout and a.stdout.count("\n") >= 2
    model = dsv4.load("tiny", device="cpu")
    ids = model.tokenizer.encode(chat_text([{"role": "user", "content": "hello"}]))
    sampling = dsv4.SamplingParams(temperature=0.7, top_p=0.95, seed=3)
    first = "".join(t for t, _, _ in generate(model, Request(ids, 6, sampling)))
    assert a.stdout.startswith(first + "\n")


def test_chat_thinking_streams_the_reasoning_to_stderr():
    """--thinking: the prompt opens DeepSeek-V4's <think> (chat.prompt's thinking mode), so the reply is
    reasoning until </think>: with tiny's random words it all goes to stderr, the answer line stays empty."""
    from dsv4.serve import chat as chat_module
    from dsv4.serve.protocol import Request, generate

    r = chat("hello\n", "--max-tokens", "6", "--seed", "3", "--thinking")
    assert r.returncode == 0, r.stderr
    model = dsv4.load("tiny", device="cpu")
    ids, fmt = chat_module.prompt(model.tokenizer, [{"role": "user", "content": "hello"}],
                                  template_kwargs={"thinking": True})
    assert fmt.reasoning and ids != chat_module.prompt(model.tokenizer, [{"role": "user", "content": "hello"}])[0]
    sampling = dsv4.SamplingParams(temperature=0.7, top_p=0.95, seed=3)
    text = "".join(t for t, _, _ in generate(model, Request(ids, 6, sampling, skip_special=False)))
    reply = chat_module.ChatReply(fmt)
    deltas = [reply.push(text), reply.end()]
    thought = "".join(d.get("reasoning_content", "") for d in deltas if d)
    answer = "".join(d.get("content", "") for d in deltas if d)
    assert thought and thought in r.stderr
    assert r.stdout == answer + "\n"


def test_chat_prefix_cache_reuses_each_turn_and_keeps_its_tokens():
    """--prefix-cache: each turn prefills from the last turn's prompt state (stderr counts the tokens reused), and
    the replies are those of a plain prefill at the same capacity and chunk (a turn's stream rebuilt here as cmd_chat
    builds it)."""
    import re

    from dsv4.generation import sample_tokens
    from dsv4.serve import chat as chat_module
    from dsv4.serve.protocol import Request, generate

    lines = ["hello", "how are you", "tell me more"]
    r = chat("".join(x + "\n" for x in lines), "--max-tokens", "6", "--seed", "3", "--prefix-cache", "2",
             "--prefill-chunk", "8", "--max-model-len", "256")
    assert r.returncode == 0, r.stderr
    reused = [tuple(map(int, m)) for m in re.findall(r"prefix cache: (\d+) of (\d+) prompt tokens", r.stderr)]
    assert len(reused) == 3 and reused[0][0] == 0 and reused[2][0] > reused[1][0] > 0
    model = dsv4.load("tiny", device="cpu")
    messages, out = [], []
    for turn, line in enumerate(lines):
        messages.append({"role": "user", "content": line})
        ids, fmt = chat_module.prompt(model.tokenizer, messages)
        sampling = dsv4.SamplingParams(temperature=0.7, top_p=0.95, seed=3 + turn)
        request = Request(ids, min(6, 256 - len(ids)), sampling, skip_special=not fmt.markup)
        tokens = sample_tokens(model, ids, request.max_tokens, sampling, capacity=256, chunk_size=8)
        reply = chat_module.ChatReply(fmt)
        shown = []
        for text, finish, _ in generate(model, request, tokens=tokens):
            for delta in (reply.push(text), reply.end() if finish else None):
                if delta and delta.get("content"):
                    shown.append(delta["content"])
        out.append("".join(shown))
        messages.append(reply.message())
    assert r.stdout == "".join(x + "\n" for x in out)
    bad = chat("hello\n", "--prefill-chunk", "8")
    assert bad.returncode == 2 and "--prefill-chunk goes with --prefix-cache" in bad.stderr


def test_chat_refuses_a_conversation_past_its_limit():
    r = chat("hello there, a long enough line\n", "--max-model-len", "8")
    assert r.returncode == 2 and "--max-model-len 8" in r.stderr


def test_bench_prints_its_records():
    r = dsv4_cli("bench", "--preset", "tiny", "--device", "cpu", "--prime", "20", "--steps", "6", "--rows", "2",
                 "--prefill", "200")
    assert r.returncode == 0, r.stderr
    records = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in r.stdout.splitlines()}
    prefill = records["BENCH_PREFILL"]  # --prefill: the prompt's prefill, rows timed, the same logits each
    assert prefill["prompt_tokens"] == 200 and len(prefill["walls_s"]) == 2 and prefill["same_logits"]
    assert abs(prefill["tok_s"] * prefill["wall_s"] / 200 - 1) < 0.02  # tokens a second of the median wall
    summary = records["BENCH_SUMMARY"]
    assert summary["same_stream"] and summary["eager_tok_s"] > 0
    assert summary["graph_arm"] is False and summary["graph_tok_s"] is None  # no CUDA graph on CPU
    assert summary["reductions_per_token_per_rank"] == [2.0 * 5]  # attention + MoE in each of tiny's 5 layers
    rows = [json.loads(line.split(" ", 1)[1]) for line in r.stdout.splitlines() if line.startswith("BENCH_ROW ")]
    assert [row["arm"] for row in rows] == ["eager"] * 4  # the arm that ran: no graph on CPU
    assert dsv4_cli("bench", "--preset", "tiny", "--device", "cpu", "--steps", "0").returncode == 2
    assert dsv4_cli("bench", "--preset", "tiny", "--device", "cpu", "--prefill", "1").returncode == 2
    assert summary["gemv"] == "v2"


def test_bench_speculating_prints_the_verify_rows():
    """--speculate mtp: rows of verify steps from the same prefix (its MTP window filled), their stream the plain
    rows'; BENCH_SPECULATIVE says how many tokens a step they made."""
    r = dsv4_cli("bench", "--preset", "tiny", "--device", "cpu", "--prime", "20", "--steps", "6", "--rows", "1",
                 "--speculate", "mtp", "--draft-tokens", "2")
    assert r.returncode == 0, r.stderr
    records = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in r.stdout.splitlines()}
    spec = records["BENCH_SPECULATIVE"]
    assert spec["same_stream"] and spec["drafter"] == "mtp" and spec["draft_tokens"] == 2
    assert 1 <= spec["tokens_per_step"] <= 3 and spec["verify_steps"] >= 2


def test_gemv_flag_selects_the_decode_gemvs(monkeypatch):
    """--gemv names the decode GEMVs' kernels for the load (and the ranks it spawns, through the environment); the
    records say which ran."""
    from dsv4 import kernels
    from dsv4.kernels import dense, qgemv

    r = dsv4_cli("bench", "--preset", "tiny", "--device", "cpu", "--prime", "4", "--steps", "2", "--rows", "1",
                 "--gemv", "v3")
    assert r.returncode == 0, r.stderr
    summary = next(line for line in r.stdout.splitlines() if line.startswith("BENCH_SUMMARY "))
    assert json.loads(summary.split(" ", 1)[1])["gemv"] == "v3"
    assert "invalid choice: 'v9'" in dsv4_cli("bench", "--preset", "tiny", "--gemv", "v9").stderr
    monkeypatch.setitem(qgemv.CONFIG, "kernel", "v2")
    monkeypatch.setitem(dense.CONFIG, "kernel", "v2")
    monkeypatch.setenv("DSV4_QGEMV", "v2")
    monkeypatch.setenv("DSV4_DENSE_GEMV", "v2")
    kernels.select_gemv("v3")
    assert qgemv.CONFIG["kernel"] == dense.CONFIG["kernel"] == os.environ["DSV4_QGEMV"] == "v3"
    assert os.environ["DSV4_DENSE_GEMV"] == "v3" and kernels.gemv() == "v3"
    kernels.select_gemv("mma")  # the FP8 GEMVs as m16n8k16 products; the bf16 ones v3's
    assert qgemv.CONFIG["kernel"] == os.environ["DSV4_QGEMV"] == "mma"
    assert dense.CONFIG["kernel"] == os.environ["DSV4_DENSE_GEMV"] == "v3" and kernels.gemv() == "qgemv mma, dense v3"
    with pytest.raises(ValueError, match="gemv 'v1': allowed"):
        kernels.select_gemv("v1")


def test_version_module_entry_and_help_defaults():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "dsv4", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("dsv4 ")
    help_text = subprocess.run([sys.executable, "-m", "dsv4", "generate", "--help"], capture_output=True,
                               text=True).stdout
    assert "(default: 32)" in help_text and "(default: None)" not in help_text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where there is no CUDA")
def test_a_missing_or_unknown_device_is_one_line(capsys):
    from dsv4.cli import main

    assert main(["generate", "--preset", "tiny", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device here" in err[0]
    assert main(["generate", "--preset", "tiny", "--device", "gpu0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'gpu0'" in err[0]


def test_synth_refuses_then_overwrites(tmp_path, capsys):
    from dsv4.cli import main

    out = tmp_path / "ckpt"
    assert main(["synth", "--preset", "tiny", "--out", str(out)]) == 0
    first = (out / "config.json").read_text()
    assert main(["synth", "--preset", "tiny", "--out", str(out), "--seed", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["synth", "--preset", "tiny", "--out", str(out), "--seed", "1", "--overwrite"]) == 0
    assert (out / "config.json").read_text() == first and (out / "model.safetensors.index.json").exists()


def _on_a_terminal(*args) -> str:
    """stdout of `python -m dsv4.cli ARGS` written to a pseudo-terminal."""
    import os
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "dsv4.cli", *args], stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=240)
    os.close(leader)
    assert proc.returncode == 0, proc.stderr.read()
    return out.decode("utf-8", "replace")


def test_unprintable_text_is_escaped_on_a_terminal_only():
    from dsv4.cli import terminal_text

    assert terminal_text("a\x07b\x1b[2J\u202e日本\n\tz\r") == "a\\x07b\\x1b[2J\\u202e日本\n\tz\\r"
    args = ("generate", "--preset", "tiny", "--device", "cpu", "--prompt", "ding\x07dong", "--max-tokens", "2")
    assert "ding\\x07dong" in _on_a_terminal(*args)
    piped = dsv4_cli(*args)
    assert piped.returncode == 0 and piped.stdout.startswith("ding\x07dong")


def test_generate_prints_the_decode_of_the_sampled_tokens():
    """The printed text is the tokenizer's decode of the whole sampled stream: characters split over
    tokens are not printed as replacement-character pieces."""
    proc = dsv4_cli("generate", "--preset", "tiny", "--device", "cpu", "--prompt", "日本語", "--max-tokens", "24",
                    "--seed", "1")  # seed 1 samples two-byte characters over two tokens
    assert proc.returncode == 0, proc.stderr
    model = dsv4.load("tiny", device="cpu")
    ids = model.tokenizer.encode("日本語")
    tokens = list(model.sample_tokens(ids, 24, dsv4.SamplingParams(seed=1)))
    n = tokens.index(model.cfg.eos_token_id) + 1 if model.cfg.eos_token_id in tokens else len(tokens)
    assert proc.stdout == "日本語" + model.tokenizer.decode(tokens[:n]) + "\n"
    assert f"[dsv4] {n} tokens in" in proc.stderr  # the EOS, when sampled, counts


def _one_line(proc) -> str:
    """The single stderr line of a command that failed with exit 2 (no traceback)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from dsv4.checkpoint import synth

    return synth(dsv4.config.preset("tiny"), tmp_path_factory.mktemp("cli") / "ck", quant="fp8",
                 max_shard_bytes=150_000)


def test_damaged_checkpoints_are_one_line(tiny_ckpt, tmp_path):
    import shutil

    path = tmp_path / "ck"
    shutil.copytree(tiny_ckpt, path)
    shard = sorted(path.glob("model-*.safetensors"))[0]
    data = shard.read_bytes()
    run = ("generate", "--model", str(path), "--device", "cpu", "--max-tokens", "2")
    shard.write_bytes(data[:-100])
    assert _one_line(dsv4_cli(*run)) .startswith(f"dsv4 generate: {shard}: truncated")  # one run end to end
    shard.write_bytes(bytes(range(256)) * (len(data) // 256))
    assert f"{shard}: not a safetensors file" in _one_line(dsv4_main(*run))
    shard.unlink()
    assert f"{shard}: tensor " in _one_line(dsv4_main(*run))  # named by the index, the file is gone


def test_missing_tokenizer_needs_the_stand_in_flag(tiny_ckpt, tmp_path):
    import shutil

    path = tmp_path / "ck"
    shutil.copytree(tiny_ckpt, path)
    (path / "tokenizer.json").unlink()
    run = ("generate", "--model", str(path), "--device", "cpu", "--max-tokens", "2")
    assert f"{path / 'tokenizer.json'}: no such file" in _one_line(dsv4_main(*run))
    ok = dsv4_cli(*run, "--stand-in-tokenizer")
    assert ok.returncode == 0 and "stand-in tokenizer" in ok.stderr, ok.stderr


def test_presets_and_directories_are_explicit(tiny_ckpt, tmp_path):
    """--preset tiny beside a ./tiny checkpoint is the preset (and says nothing about it); --model tiny
    is the directory, and without one an error pointing to --preset."""
    import shutil

    from dsv4.checkpoint import synth

    synth(dsv4.config.preset("tiny").replace(num_hidden_layers=3, layer_types=["sliding_attention"] * 3,
                                             mlp_layer_types=["hash_moe", "moe", "moe"]), tmp_path / "tiny")

    def layers(*args):
        proc = subprocess.run([sys.executable, "-m", "dsv4.cli", "bench", *args, "--device", "cpu", "--prime", "8",
                               "--steps", "2", "--rows", "1"], capture_output=True, text=True, cwd=tmp_path,
                              timeout=240, env={**os.environ, "PYTHONPATH": str(_ROOT)})
        assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr
        return json.loads(proc.stdout.splitlines()[0].split(" ", 1)[1])["layers"]

    assert layers("--preset", "tiny") == 5 and layers("--model", "tiny") == 3
    shutil.rmtree(tmp_path / "tiny")
    proc = subprocess.run([sys.executable, "-m", "dsv4.cli", "generate", "--model", "tiny", "--device", "cpu"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(_ROOT)})
    assert "--preset tiny" in _one_line(proc)
    assert dsv4_main("generate", "--device", "cpu").returncode == 2  # a source is required: no silent default


def test_not_enough_memory_is_one_line(capsys, monkeypatch):
    from dsv4.checkpoint import memory
    from dsv4.cli import main

    monkeypatch.setattr(memory, "available_bytes", lambda device: (1000, "available RAM"))
    assert main(["generate", "--preset", "tiny", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "preset 'tiny': its weights need 3.4 MiB (float32 on cpu), 0.0 MiB available RAM" in err[0], err


def test_port_in_use_is_one_line_before_loading():
    """The port is checked before the load: with --preset flash the memory check would speak first."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = dsv4_cli("serve", "--preset", "flash", "--device", "cpu", "--port", str(port))
    assert _one_line(proc).startswith(f"dsv4 serve: cannot listen on 127.0.0.1:{port}: ")


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_ctrl_c_ends_quietly(command):
    import signal

    # SIGINT back to its default in the child: a shell's background job starts with it ignored, and Python then
    # keeps ignoring it (the test must not depend on how pytest was started)
    proc = subprocess.Popen([sys.executable, "-m", "dsv4.cli", command, "--preset", "tiny", "--device", "cpu",
                             "--max-tokens", "3000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc.stdin.write(b"hello\n")  # chat's first turn
    proc.stdin.flush()
    assert proc.stdout.read(1)  # it is generating
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == b"", err.decode()


def test_cpu_thread_default():
    from dsv4.cli import cpu_threads

    assert cpu_threads(torch_default=64, cores=64, cpus=64, load=0.1) == 8  # at most 8
    assert cpu_threads(torch_default=4, cores=64, cpus=64, load=0.0) == 4  # never above torch's own
    assert cpu_threads(torch_default=2, cores=2, cpus=2, load=1.2) == 1  # a busy 2-core machine: one thread
    assert cpu_threads(torch_default=2, cores=2, cpus=2, load=9.0) == 1  # at least 1
    assert cpu_threads(torch_default=64, cores=4, cpus=64, load=32.0) == 2  # its share of the load: 4/64 of it


def test_threads_flag_and_environment(monkeypatch):
    from dsv4 import cli

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    flag = subprocess.run([sys.executable, "-m", "dsv4.cli", "generate", "--preset", "tiny", "--device", "cpu",
                           "--max-tokens", "2", "--threads", "3"], capture_output=True, text=True, env=env,
                          timeout=240)
    assert flag.returncode == 0 and ", 3 CPU threads" in flag.stderr, flag.stderr
    assert "--threads 0: at least 1" in _one_line(dsv4_cli("generate", "--preset", "tiny", "--threads", "0"))
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(cli, "cpu_threads", lambda *a: 1)
        monkeypatch.setenv("OMP_NUM_THREADS", str(before))
        cli._set_threads(None)  # the user's OMP_NUM_THREADS stands
        assert torch.get_num_threads() == before
        monkeypatch.delenv("OMP_NUM_THREADS")
        cli._set_threads(None)  # unset: the default, also for the ranks this process spawns
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    finally:
        torch.set_num_threads(before)


def test_serve_takes_mma_unless_told(monkeypatch):
    """`dsv4 serve`'s GEMVs: --gemv when given, else mma (batched steps), unless the environment names the kernels."""
    from dsv4.cli import serve_gemv

    for name in ("DSV4_QGEMV", "DSV4_DENSE_GEMV"):
        monkeypatch.delenv(name, raising=False)
    assert serve_gemv(None) == "mma"
    assert serve_gemv("v2") == "v2"
    monkeypatch.setenv("DSV4_QGEMV", "v2")
    assert serve_gemv(None) is None  # the environment's choice stands
    assert "mma (a server's steps are batched" in dsv4_cli("serve", "--help").stdout


def test_generate_speculating_prints_the_same_text():
    """--speculate ngram | mtp: the verify steps' tokens are the plain loop's (dsv4.speculative), so is the text; the
    tally goes to stderr. A prompt that repeats itself gives the n-gram drafter something to find."""
    args = ["generate", "--preset", "tiny", "--device", "cpu", "--prompt", "ab ab ab ab ab ab ab", "--max-tokens",
            "24", "--seed", "4"]
    plain = dsv4_cli(*args)
    spec = dsv4_cli(*args, "--speculate", "ngram", "--draft-tokens", "3")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    assert "speculative (ngram, up to 3 drafts):" in spec.stderr and "verify steps" in spec.stderr
    mtp = dsv4_cli(*args, "--speculate", "mtp", "--draft-tokens", "2")  # the preset's random MTP layer drafts
    assert mtp.returncode == 0 and mtp.stdout == plain.stdout, mtp.stderr
    assert "speculative (mtp, up to 2 drafts):" in mtp.stderr
    bad = dsv4_cli(*args, "--speculate", "ngram", "--draft-tokens", "-1")
    assert bad.returncode != 0 and "--draft-tokens -1" in bad.stderr
