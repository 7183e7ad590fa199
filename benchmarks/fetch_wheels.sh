#!/usr/bin/env bash
# The serving wheels a device call carries in .whl (ignored by git; benchmarks/gpu_env.sh installs them there): the
# packages the GPU image lacks (its list: /work/.library/device/KINDS.md) for tests/test_cli.py's chat and serve
# subprocesses and benchmarks/serve_bench.py, each at the version this machine's test extra installs, their
# Requires-Dist checked against the image (session 32: fastapi 0.165 needs opentelemetry-api, openai 3.60 httpx2).
# Usage: bash benchmarks/fetch_wheels.sh   (in the repository's root, on a machine with the test extra installed)
set -euo pipefail
mkdir -p .whl
version() { python3 -m pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}'; }
for name in fastapi starlette uvicorn pydantic pydantic_core annotated-types typing-inspection typing_extensions \
            opentelemetry-api openai jiter sniffio httpx2 httpcore2 truststore idna anyio; do
  v=$(version "$name"); [ -n "$v" ] || { echo "fetch_wheels: $name is not installed here (pip install -e '.[test]')" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$name==$v"
done
ls .whl
