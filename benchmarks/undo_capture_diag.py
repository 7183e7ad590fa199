"""Why a verify graph captured with the fused Undo (kernels/undo.py) faulted on replay (session 48 call 4): one arm per
process (a fault takes the process's CUDA context), each capturing one verify graph of `--rows` rows with CONFIG fused
and capture on, then before its first replay:

* the tables read back against the entries recorded at capture (the fill after the capture);
* every address in them looked up in the allocator's snapshot: in a live block, a free one, or none, and in which
  pool (a free block, or the default pool's, is an address the graph must not bake in);

then its replays against eager verify steps (tokens and DecodeState.digest). Arms: `keep` (main: VerifyReplay keeps
the tables as long as its graph), `drop` (session 48's code: the tables let go after the fill, a gc run).

Usage: python benchmarks/undo_capture_diag.py --preset mini [--arm keep|drop] [--rows 4] [--variant both|apply|back]
(no --arm: both, each in its own process; --variant apply: the fused apply alone, back: the fused take-back alone)
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys

import torch

from dsv4.receipts import emit

POINTERS = {9: ("buf", "index", "rows", "keep", "save"), 7: ("buf", "index", "save")}


def _blocks():
    out = []
    for seg in torch.cuda.memory._snapshot()["segments"]:
        addr = seg["address"]
        for b in seg["blocks"]:
            start = b.get("address", addr)
            out.append((start, start + b["size"], b["state"], tuple(seg.get("segment_pool_id", (0, 0)))))
            addr = start + b["size"]
    return out


def _where(ptr, blocks):
    for start, end, state, pool in blocks:
        if start <= ptr < end:
            return state, pool
    return "none", None


def arm(preset: str, which: str, rows: int, variant: str = "both") -> int:
    import dsv4
    from dsv4.kernels import undo as fused_undo

    fused_undo.CONFIG["fused"] = fused_undo.CONFIG["capture"] = True
    from dsv4.model import commit
    if variant != "both":  # one of the two kernels alone, the other half by torch's ops (their records agree)
        fused_apply, fused_back = commit.Undo.apply, commit.Undo.take_back

        def torch_only(method):
            def run(self, *args):
                fused_undo.CONFIG["fused"] = False
                try:
                    return method(self, *args)
                finally:
                    fused_undo.CONFIG["fused"] = True
            return run
        if variant == "apply":
            commit.Undo.take_back = torch_only(fused_back)
        else:
            commit.Undo.apply = torch_only(fused_apply)
    recorded = []
    get = fused_undo._Tables.get

    def recording_get(self, entries, width, device):
        table = get(self, entries, width, device)
        if torch.cuda.is_current_stream_capturing():
            recorded.append((table, [tuple(e) for e in entries], width))
        return table

    fused_undo._Tables.get = recording_get
    model = dsv4.load(preset, device="cuda", seed=0)
    sampling = dsv4.SamplingParams(temperature=1.0, seed=7)
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(2, model.cfg.vocab_size, (40,), generator=g).tolist()
    steps = 24

    def prefilled():
        s = model.new_state(len(prompt) + steps + 8)
        model.prefill(s, prompt[:-1])
        return s

    ref, token, plain = prefilled(), prompt[-1], []
    for _ in range(steps):
        token = model.step(ref, token, sampling)
        plain.append((token, ref.digest()))
    tokens = [t for t, _ in plain]

    state, token, done = prefilled(), prompt[-1], 0
    from dsv4.replay import VerifyReplay
    orig_capture = VerifyReplay._capture

    def capture_then_check(self, st):
        orig_capture(self, st)
        torch.cuda.synchronize()
        if which == "drop":
            self.undo_tables = []
            gc.collect()
        bad_fill = sum(t.tolist() != [list(e) for e in entries] for t, entries, _ in recorded)
        blocks = _blocks()
        tally: dict = {}
        for _, entries, width in recorded:
            for e in entries:
                for name, ptr in zip(POINTERS[width], e):
                    if ptr == 0:
                        continue
                    state_, pool = _where(ptr, blocks)
                    key = (width, name, state_, "default" if pool in (None, (0, 0)) else "private")
                    tally[key] = tally.get(key, 0) + 1
        tables_where = {}
        for t, _, _ in recorded:
            k = _where(t.data_ptr(), blocks)
            tables_where[k] = tables_where.get(k, 0) + 1
        emit("UNDO_CAPTURE_TABLES", arm=which, variant=variant, tables=len(recorded), not_as_filled=bad_fill,
             tables_blocks={f"{state_} {pool}": n for (state_, pool), n in tables_where.items()},
             pointers={f"width={w} {name}: {state_} block, {pool} pool": n for (w, name, state_, pool), n in
                       sorted(tally.items(), key=str)})
        sys.stdout.flush()

    VerifyReplay._capture = capture_then_check
    ok = True
    while done + rows <= steps:
        drafts = list(tokens[done:done + rows - 1])
        if (done // rows) % 2:
            drafts[-1] = (drafts[-1] + 1) % model.cfg.vocab_size
        got = model.verify(state, token, drafts, sampling, graph=True)
        torch.cuda.synchronize()
        same = list(got) == tokens[done:done + len(got)]
        done += len(got)
        same = same and state.digest() == plain[done - 1][1]
        ok = ok and same
        token = got[-1]
    emit("UNDO_CAPTURE_REPLAYS", arm=which, variant=variant, same_as_plain_steps=ok)
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="mini")
    p.add_argument("--arm", choices=("keep", "drop"))
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--variant", choices=("both", "apply", "back"), default="both",
                   help="both kernels, or only the apply (take-back by torch) or only the take-back")
    a = p.parse_args()
    if a.arm:
        return arm(a.preset, a.arm, a.rows, a.variant)
    rc = 0
    for which in ("keep", "drop"):
        r = subprocess.run([sys.executable, __file__, "--preset", a.preset, "--arm", which, "--rows", str(a.rows),
                            "--variant", a.variant],
                           env=os.environ, capture_output=True, text=True)
        sys.stdout.write(r.stdout)  # the arm's records
        sys.stderr.write("\n".join(r.stderr.strip().splitlines()[-12:]) + "\n")
        emit("UNDO_CAPTURE_ARM", arm=which, variant=a.variant, exit=r.returncode)
        rc |= r.returncode if which == "keep" else 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
