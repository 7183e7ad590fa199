import os

import torch

# Triton's interpreter runs the fused kernels on CPU tensors (tests/test_kernels.py). It has to be
# chosen before triton is first imported; on a GPU machine the kernels compile for the device instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
