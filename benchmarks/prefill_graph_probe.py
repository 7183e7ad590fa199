"""Can a short prefill chunk be captured in a CUDA graph as it runs today, and what would its replay save?

    python benchmarks/prefill_graph_probe.py --preset mini --tokens 16,63,128 --runs 9 [--engine 63:1,64:16]

A question before a design change (session 30): a prefill chunk of T tokens at position 0 (a new request's first
chunk), eager (Model.prefill) against the same transaction captured once in a CUDA graph and replayed on the same
state. Per T: whether the capture succeeds (no host sync, no host read of device data inside the forward; the
error otherwise), whether the replay's logits and committed state equal the eager prefill's bit for bit, and the
medians of the eager chunk's wall and the replay's wall (each after restoring the state to empty, a restore timed
alone and subtracted). --engine T:n: the engine's own path since (Model.prefill of n chunks of T tokens with
DSV4_PREFILL_GRAPHS' graphs and without, interleaved rounds, their bits compared). One rank. Records
(dsv4.receipts): PROBE_BUILD, PROBE (one a T), PROBE_ENGINE (one an arm).
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback

import torch

import dsv4
from dsv4.receipts import emit, provenance


def _median_wall(fn, sync, runs: int) -> float:
    walls = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def probe(model, T: int, runs: int) -> dict:
    V = model.cfg.vocab_size
    ids = [(i * 7919 + 13) % V for i in range(T)]
    cap = T + 64
    empty, eager, graphed = model.new_state(cap), model.new_state(cap), model.new_state(cap)
    sync = model.synchronize
    tokens = torch.tensor(ids, dtype=torch.int64, device=model.device)
    tr = model.transformer

    def run_eager():
        eager.restore(empty)
        model.prefill(eager, ids, T)

    run_eager()
    run_eager()  # compiles, allocator, tickets
    want_logits, want_digest = eager.logits.clone(), eager.digest()
    out = {"tokens": T}
    # warm the captured path on a scratch state from a side stream, as dsv4.replay does
    scratch = model.new_state(cap)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    census = model.comm.census.clone()
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(2):
            scratch.restore(empty)
            tr.transaction([scratch], tokens)
    torch.cuda.current_stream().wait_stream(side)
    model.comm.census.copy_(census)
    graphed.restore(empty)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.inference_mode(), torch.cuda.graph(graph):
            verdict = tr.transaction([graphed], tokens)
    except Exception as e:
        out.update(captured=False, error=f"{type(e).__name__}: {str(e)[:300]}")
        return out
    out["captured"] = True

    def run_graph():
        graphed.restore(empty)
        graph.replay()

    run_graph()
    sync()
    graphed.host_pos = T
    out.update(verdict=float(verdict), logits_equal=bool(torch.equal(graphed.logits, want_logits)),
               state_equal=graphed.digest() == want_digest)
    restore_s = _median_wall(lambda: graphed.restore(empty), sync, runs)
    eager_s = _median_wall(run_eager, sync, runs)
    graph_s = _median_wall(run_graph, sync, runs)
    eager2_s = _median_wall(run_eager, sync, runs)  # the eager arm again: the spread between rounds
    out.update(restore_ms=round(restore_s * 1e3, 3), eager_ms=round((eager_s - restore_s) * 1e3, 3),
               eager_again_ms=round((eager2_s - restore_s) * 1e3, 3),
               replay_ms=round((graph_s - restore_s) * 1e3, 3),
               speedup=round((eager_s - restore_s) / max(graph_s - restore_s, 1e-9), 2))
    return out


def engine_arms(model, T: int, chunks: int, runs: int) -> dict:
    """Model.prefill of a prompt of `chunks` chunks of T tokens on a state restored to empty before each run, with
    the prefill graphs (DSV4_PREFILL_GRAPHS; their first chunks run before the timing) and without, interleaved
    rounds; the two arms' logits and committed states compared."""
    V = model.cfg.vocab_size
    ids = [(i * 7919 + 13) % V for i in range(T * chunks)]
    cap = len(ids) + 64
    empty, state = model.new_state(cap), model.new_state(cap)
    sync = model.synchronize
    out = {}

    def run(graphs: bool):
        model.prefill_graphs = graphs
        try:
            state.restore(empty)
            model.prefill(state, ids, T)
        finally:
            model.prefill_graphs = False

    for graphs in (True, True, False):  # warm: the graph's eager chunk and its capture; the eager arm's compiles
        run(graphs)
    digests = {}
    for graphs in (True, False):
        run(graphs)
        sync()
        digests[graphs] = (state.digest(), state.logits.clone())
    walls = {True: [], False: []}
    for _ in range(runs):
        for graphs in (True, False):
            walls[graphs].append(_median_wall(lambda: run(graphs), sync, 1))
    restore_s = _median_wall(lambda: state.restore(empty), sync, runs)
    g, e = statistics.median(walls[True]) - restore_s, statistics.median(walls[False]) - restore_s
    out.update(tokens=T, chunks=chunks, graph_ms=round(g * 1e3, 3), eager_ms=round(e * 1e3, 3),
               speedup=round(e / max(g, 1e-9), 2), graph_tok_s=round(T * chunks / g, 1),
               eager_tok_s=round(T * chunks / e, 1), equal=digests[True][0] == digests[False][0] and
               bool(torch.equal(digests[True][1], digests[False][1])),
               replays=getattr(state.prefill_graphs.get(T), "replays", None))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--tokens", default="16,63,128")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--engine", default="", help="T:chunks,... Model.prefill with and without the prefill graphs")
    args = ap.parse_args()
    model = dsv4.load(args.preset, device="cuda", ranks=1, seed=0)
    emit("PROBE_BUILD", provenance(model.device, args.preset))
    for T in (int(t) for t in args.tokens.split(",") if t):
        try:
            emit("PROBE", probe(model, T, args.runs))
        except Exception as e:
            traceback.print_exc()
            emit("PROBE", tokens=T, error=f"{type(e).__name__}: {str(e)[:300]}")
    for arm in (a for a in args.engine.split(",") if a):
        T, n = (int(v) for v in arm.split(":"))
        try:
            emit("PROBE_ENGINE", engine_arms(model, T, n, args.runs))
        except Exception as e:
            traceback.print_exc()
            emit("PROBE_ENGINE", tokens=T, chunks=n, error=f"{type(e).__name__}: {str(e)[:300]}")


if __name__ == "__main__":
    main()
