#!/usr/bin/env bash
# Session 23 call 2 (one H200, <= 9.5 min): DSV4_MOE_TC_BF16_DECODE (off by default): moe_tc's FP4 words decoded
# straight to bf16 with two exact bf16 products, where the default decodes through fp16 -> fp32 -> fp32 products ->
# bf16 (sm_90 SASS of the 16 x 128 gate/up K step: 1,623 -> 1,165 instructions; call 1's profile of one 63-token
# chunk: the routed experts 12.0 of 17.4 ms, issue-bound by that decode). The same operands reach the tensor cores:
# the same bits.
#   1. tests/test_moe_tc.py on the GPU (test_bf16_decode_keeps_the_bits: every tile shape and order, bit for bit);
#   2. prefill_moe_bench, ms a layer, off and on at each tile shape (bit_equal_tc must hold for every arm);
#   3. mini's prefill at 64 to 4,096 tokens off and on (logits_sha equal between the arms);
#   4. one 63-token chunk and the 16 x 63 wave with it on (digests equal call 1's off arms: 10e576ff..., 9c7adc3e...),
#      and the wave with DSV4_MOE_TC_WAVE_TILES=1 too.
# Usage: OUT=dir [RES=/tmp/res] bash benchmarks/gpu_s23_call2.sh   (carry .whl)
source benchmarks/gpu_env.sh
SUMMARY_LINES=40
step 60 "$OUT/pytest_tc.txt" python -m pytest -q -p no:cacheprovider -rfE tests/test_moe_tc.py
step 100 "$OUT/prefill_moe_mini.txt" python benchmarks/prefill_moe_bench.py --n-local 256 \
  --tokens 64,128,512,1024,4096 --arms "^tc$|^tc_bf16|^tc_bm32_n128$|^tc_bm32_bf16|^tc_bm64_n128$|^tc_bm64_bf16"
step 40 "$OUT/prefill_moe_flash_rank.txt" python benchmarks/prefill_moe_bench.py --n-local 128 \
  --tokens 128,512 --arms "^tc$|^tc_bf16$|^tc_bf16_w8$"
step 70 "$OUT/prefill_off.txt" python benchmarks/prefill_bench.py mini --sizes 64 128 512 1024 4096 \
  --runs 3 --eager-steps 0 --graph-steps 0 --no-hf
step 70 "$OUT/prefill_on.txt" env DSV4_MOE_TC_BF16_DECODE=1 python benchmarks/prefill_bench.py mini \
  --sizes 64 128 512 1024 4096 --runs 3 --eager-steps 0 --graph-steps 0 --no-hf
step 50 "$OUT/prefill_chunk_on.txt" env DSV4_MOE_TC_BF16_DECODE=1 python benchmarks/prefill_batch_bench.py mini \
  --states 1 --tokens 63 --runs 3 --profile 25
step 60 "$OUT/prefill_wave_on.txt" env DSV4_MOE_TC_BF16_DECODE=1 python benchmarks/prefill_batch_bench.py mini \
  --states 16 --tokens 63 --runs 3
step 60 "$OUT/prefill_wave_on_tiles.txt" env DSV4_MOE_TC_BF16_DECODE=1 DSV4_MOE_TC_WAVE_TILES=1 \
  python benchmarks/prefill_batch_bench.py mini --states 16 --tokens 63 --runs 3 --profile 12
