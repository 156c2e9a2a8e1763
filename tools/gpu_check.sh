#!/usr/bin/env bash
# The GPU machine's checks and measurements in one go, within about 7 minutes on 16 cores and
# one H100/H200: the CUDA tests, the loader's scaling with cores against the decode limit, the
# CPU / nvJPEG / hybrid loaders in one run, the ResNet-50 training bench, and the record
# (docs/bench_gpu.json) with its chart. On a machine without CUDA the GPU parts say "skipped"
# and the rest runs (GPU_CHECK_QUICK=1 makes that short).
#
# Usage: tools/gpu_check.sh [OUT]    (OUT: where the JSON and logs go; default $OUT, else ./gpu-check-out)
# Environment: PYTHON (default python3), GPU_CHECK_WORK (generated data, default
# /tmp/shardfmt-gpu-check), GPU_CHECK_WORKERS (default: every core), GPU_CHECK_IMAGES (default
# 5000), GPU_CHECK_QUICK=1 (few images, two worker counts, short timings: a dry run).
set -u
out=${1:-${OUT:-$PWD/gpu-check-out}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD:$PWD/tools${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
work=${GPU_CHECK_WORK:-/tmp/shardfmt-gpu-check}
workers=${GPU_CHECK_WORKERS:-$(nproc)}
images=${GPU_CHECK_IMAGES:-5000}
counts=$(for w in 1 2 4 8 16 32 64; do [ "$w" -lt "$workers" ] && printf '%s,' "$w"; done)$workers
seconds=3
steps=50
warmup=8
if [ "${GPU_CHECK_QUICK:-0}" = 1 ]; then
    images=${GPU_CHECK_IMAGES:-600}
    counts="1,$workers"
    seconds=0.5
    steps=6
    warmup=2
fi
log="$out/check.log"
commands="$out/commands.txt"
: >"$log"
: >"$commands"
failed=0

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log everything, remember failures
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*" | tee -a "$log"
    echo "$*" >>"$commands"
    local began=$SECONDS
    timeout "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - began)) s" | tee -a "$log"
    [ "$rc" -eq 0 ] || failed=1
}

{
    date -u
    nvidia-smi 2>&1 || echo "no nvidia-smi"
    "$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
    "$py" -c 'import torchvision; print("torchvision", torchvision.__version__)' 2>&1 | tail -1
    "$py" -c 'import shardfmt, simplejpeg; from shardfmt.ops.jpegcrop import CropDecoder; print("shardfmt", shardfmt.__version__, "simplejpeg", simplejpeg.__version__, "partial decode", CropDecoder.available())'
    nproc
    df -h /dev/shm | tail -1
    lscpu 2>/dev/null | grep -E "^(Model name|Thread|Core|Socket|CPU\(s\))"
    uptime
} >"$out/environment.txt" 2>&1
cat "$out/environment.txt" | tee -a "$log"

step "CUDA tests" 240 "$py" -m pytest -q -rs -p no:cacheprovider --timeout 120 \
    tests/loader/test_cuda.py tests/loader/test_gpudecode.py \
    tests/loader/test_loader.py::test_cuda_delivery_normalises_on_the_device \
    tests/loader/test_loader_fields.py::test_cuda_delivery_of_every_field
step "loaders on the GPU" 150 "$py" tools/bench_gpu.py --work-dir "$work" --images "$images" --workers "$workers" \
    --min-seconds "$seconds" --json "$out/loader_gpu.json"
step "training" 200 "$py" tools/bench_train.py --work-dir "$work" --images "$images" --workers "$workers" \
    --steps "$steps" --warmup-steps "$warmup" --json "$out/train.json"
step "scaling" 200 "$py" tools/bench_loader.py --work-dir "$work" --images "$images" --workers "$workers" --scaling "$counts" \
    --rounds 1 --epochs 1 --min-seconds "$seconds" --json "$out/scaling.json"
step "record" 60 "$py" tools/gpu_record.py --scaling "$out/scaling.json" --loader "$out/loader_gpu.json" \
    --train "$out/train.json" --commands "$commands" --json "$out/bench_gpu.json" --chart "$out/bench_gpu.png"

grep -E "^(==|target|hybrid /|hybrid,|pixels|device:|ratio|shardfmt|PIL|synthetic|the side|[0-9 ]+ workers|loader|gpu,|cpu,|nvjpeg)|passed|failed|skipped" "$log" | tail -60
exit $failed
