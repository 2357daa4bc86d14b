# Stop 19 on one H200 (issue 18): NVIDIA's aiperf (HTTP) and `pdcluster bench` (ZMQ) sending the same Poisson load
# to the same cluster, Qwen3-0.6B random weights, ISL 1024 / OSL 128, 160 requests a rate, no prefix cache; disaggregated (1P+1D
# sharing the GPU) and colocated (one replica on it).
# Needs .gpu-deps and .whl/aiperf carried (docs/gpu_runs/install_aiperf.sh makes the venv).
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
env -u PYTHONPATH python3 docs/gpu_runs/host_modules.py aiofiles aiohappyeyeballs aiohttp aiosignal anyio attr certifi \
  charset_normalizer click crick cyclopts docstring_parser ffmpeg frozenlist future h11 httpcore httpx idna jinja2 \
  markupsafe markdown_it mdurl msgspec multidict orjson PIL prometheus_client propcache psutil pydantic pydantic_core \
  pydantic_settings pygments dotenv zmq rich ruamel sniffio shellingham typing_extensions typing_inspection yarl \
  requests urllib3 numpy transformers tokenizers huggingface_hub safetensors regex yaml tqdm packaging filelock \
  fsspec typer hf_xet setproctitle jmespath zstandard
bash docs/gpu_runs/install_aiperf.sh 2>&1 | tail -2
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite 2>&1 | tail -1
# No prefix cache: aiperf's synthetic prompts share most of their tokens (it read 1008 of 1024 from the cache in a
# first run), the bench's random ones none; without it both prefill every prompt token.
common="--model /tmp/q06 --device cuda --rates 8,16 --with-bench --requests 160 --warmup 8 --isl 1024 --osl 128"
common="$common --serve-args=--no-enable-prefix-caching"
timeout 270 python -m scripts.bench_aiperf $common --modes disagg --prefill-workers 1 --decode-workers 1 \
  --gpus-per-worker 0.5 --out $OUT/aiperf 2>&1 | grep -v -i warn | tail -6
timeout 200 python -m scripts.bench_aiperf $common --modes colocated --workers 1 --gpus-per-worker 1 \
  --out $OUT/aiperf 2>&1 | grep -v -i warn | tail -6
for m in disagg colocated; do for r in 8 16; do
  cp $OUT/aiperf/$m/rate-$r/profile_export_aiperf.json $OUT/aiperf-$m-$r.json 2>/dev/null
  cp $OUT/aiperf/$m/rate-$r/bench/results.json $OUT/bench-$m-$r.json 2>/dev/null
done; done
tail -5 $OUT/aiperf/disagg/rate-8/aiperf.log 2>/dev/null
rm -rf $OUT/aiperf
