# On the GPU machine, from the checkout's root: python3 there lacks only structlog and orjson.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpuprobe-site .gpuprobe/whl/*.whl || exit 1
export PYTHONPATH=/tmp/gpuprobe-site:$PWD PYTHONUNBUFFERED=1
timeout 400 python3 e2e/gpuprobe/probe.py .gpuprobe "$OUT"
