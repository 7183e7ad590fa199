"""The pooled decode path's switch: the POOLED variants of the attention, compressor-pool and index-key
kernels (dsv4.kernels.attention, dsv4.kernels.compressor), which serve every row of a batched one-token
step in one launch, each row reading its caches through its slot of a dsv4.state.StatePool.

The plain variants are GPU-checked; the pooled ones are not yet: "auto" keeps a pooled batch on the
per-sequence path (which reads the same pool through each state's views) until this flag flips after
the GPU run (benchmarks/batch_bench.py --pool, tests/test_pool.py on CUDA).
"""

GPU_CHECKED = True  # session 5: test_pool, the attention/compressor kernel tests and test_replay_gpu on CUDA (triton), the mini gate --batch 4 on pooled states (2 ranks), batch_bench --pool on flash
