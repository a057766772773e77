#!/usr/bin/env bash
# The GPU path's device check (issue 34; docs/loading.md, "The GPU path"):
#   scripts/device_check.sh OUTDIR
# 1. the CUDA tests (tests/data/test_cuda_path.py and the CUDA tests of the other test files),
#    junit XML -> OUTDIR/tests.xml, log -> OUTDIR/tests.log;
# 2. scripts/device_check.py: host cost, normalization throughput, H2D bandwidth, the step loop,
#    GPU decode (nvJPEG, NVDEC: issue 45) -> OUTDIR/report.json (with the tests' summary), log ->
#    OUTDIR/bench.log.
# Without CUDA the same steps run on the CPU fallback (report: "device": "cpu", "cuda": false).
# A few minutes on one GPU, seconds on a CPU. Hard limits, seconds: DEVICE_CHECK_TEST_LIMIT
# (default 180) and DEVICE_CHECK_BENCH_LIMIT (default 240). DEVICE_CHECK_K narrows the tests
# (a pytest -k expression; default "cuda or cpu", all of them).
# Installs nothing that is present. A missing Python package is installed from a wheel in
# DEVICE_CHECK_WHEELS (default: .whl in the repository) into a temporary folder, with no
# network; one with no wheel there is reported (report.json "missing") and the check stops.
# Exit status: 0 all passed, 1 a test or a measurement failed, 2 usage, 3 packages missing.
set -u
if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 2
PY=${PYTHON:-python3}
WHEELS=${DEVICE_CHECK_WHEELS:-$REPO/.whl}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# module:distribution for each package the tests and the benchmark import
NEEDED="torch:torch numpy:numpy PIL:pillow cv2:opencv-python-headless lmdb:lmdb h5py:h5py crc32c:crc32c
tqdm:tqdm pebble:pebble click:click pytest:pytest av:av hypothesis:hypothesis"
# One interpreter imports them all (torch's import alone is ~1.5 CPU-s): "missing: DIST..." names
# each that fails to import and, when none does, the next line says which torch it got. A probe
# that dies before its "missing:" line (a crashing import) falls back to one interpreter each.
PROBE='import importlib, sys
missing = []
for pair in sys.argv[1].split():
    mod, dist = pair.split(":")
    try:
        importlib.import_module(mod)
    except BaseException:
        missing.append(dist)
print("missing:", *missing, flush=True)
if not missing:
    import torch
    print("device_check: torch", torch.__version__, "CUDA:", torch.cuda.is_available(),
          torch.cuda.get_device_name() if torch.cuda.is_available() else "(CPU fallback)")'
probe() {
    local out
    out=$("$PY" -c "$PROBE" "$NEEDED" 2>/dev/null)
    if grep -q '^missing:' <<<"$out"; then
        printf '%s\n' "$out"
        return
    fi
    printf 'missing: %s\n' "$(for pair in $NEEDED; do
        "$PY" -c "import ${pair%%:*}" >/dev/null 2>&1 || printf '%s ' "${pair#*:}"
    done | sed 's/ $//')"
}
PROBED=$(probe)
MISSING=$(sed -n 's/^missing: *//p' <<<"$PROBED")
if [ -n "$MISSING" ] && [ -d "$WHEELS" ]; then
    SITE=$(mktemp -d /tmp/device_check_site.XXXXXX)
    WANT=""
    for dist in $MISSING; do
        for whl in "$WHEELS"/*.whl; do  # wheel names spell a distribution's - as _
            case "$(basename "$whl" | tr '[:upper:]' '[:lower:]')" in
                "${dist//-/_}"-*) WANT="$WANT $whl" ;;
            esac
        done
    done
    if [ -n "$WANT" ]; then
        echo "device_check: installing from $WHEELS into $SITE:$WANT"
        # shellcheck disable=SC2086
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" $WANT
        export PYTHONPATH="$PYTHONPATH:$SITE"
        PROBED=$(probe)
        MISSING=$(sed -n 's/^missing: *//p' <<<"$PROBED")
    fi
fi
if [ -n "$MISSING" ]; then
    echo "device_check: MISSING Python packages: $MISSING" >&2
    echo "device_check: put their wheels in $WHEELS (see docs/loading.md, 'The GPU path'); nothing was run" >&2
    printf '{"error": "missing Python packages", "missing": "%s", "wheels": "%s"}\n' "$MISSING" "$WHEELS" \
        >"$OUT/report.json"
    exit 3
fi
grep '^device_check: torch' <<<"$PROBED" || "$PY" -c 'import torch; print("device_check: torch", torch.__version__,
      "CUDA:", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "(CPU fallback)")'

# 1. tests: the CUDA test file whole (its CPU halves too), the CUDA tests of the other files
FILES=$(grep -rl --include='test_*.py' 'torch.cuda.is_available' tests | grep -v test_device_check | sort)
K=${DEVICE_CHECK_K:-cuda or cpu}
echo "device_check: tests in" $FILES "(-k '$K'), at most ${DEVICE_CHECK_TEST_LIMIT:-180} s"
# shellcheck disable=SC2086
timeout -k 10 "${DEVICE_CHECK_TEST_LIMIT:-180}" "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
    -k "$K" --junitxml="$OUT/tests.xml" $FILES >"$OUT/tests.log" 2>&1
TESTS=$?
tail -n 15 "$OUT/tests.log"
[ $TESTS -eq 124 ] && echo "device_check: the tests ran past their limit" >&2

# 2. measurements
echo "device_check: measurements, at most ${DEVICE_CHECK_BENCH_LIMIT:-240} s"
timeout -k 10 "${DEVICE_CHECK_BENCH_LIMIT:-240}" "$PY" scripts/device_check.py --out "$OUT" \
    --junit "$OUT/tests.xml" 2>&1 | tee "$OUT/bench.log"
BENCH=${PIPESTATUS[0]}
[ "$BENCH" -eq 124 ] && echo "device_check: the measurements ran past their limit (report.json holds the steps done)" >&2
echo "device_check: report in $OUT/report.json (tests exit $TESTS, measurements exit $BENCH)"
[ $TESTS -eq 0 ] && [ "$BENCH" -eq 0 ]
