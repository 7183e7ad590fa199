import os

import torch

# Triton's interpreter runs the fused kernels on CPU tensors (tests/test_kernels.py). It has to be
# chosen before triton is first imported; on a GPU machine the kernels compile for the device instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The slow set: long interpreter runs of whole models through kernels that CI also covers in unit tests.
# CI (the README's command) skips them to stay within its time; run them with DSV4_SLOW=1.
def pytest_collection_modifyitems(config, items):
    import pytest

    if os.environ.get("DSV4_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow set: DSV4_SLOW=1 runs it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
