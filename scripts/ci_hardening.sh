#!/usr/bin/env bash
# CI hardening (issue 6), run by .ci/run after the main suite; CPU only, sized for 2 cores.
#   1. The whole test suite built with AddressSanitizer + UndefinedBehaviorSanitizer (gcc) in a
#      second build directory, run by ctest. Excluded: find_package_consumer (it links an outside
#      project against the instrumented static library without the sanitizer runtime; the main
#      suite runs it).
#   2. The libFuzzer targets of fuzz/ built with clang-14 (+ ASan + UBSan), each run for
#      MOEKIT_FUZZ_SECONDS (default 60) from seeds: configs/, the golden test files, fuzz/corpus/
#      and the tiny checkpoints fuzz_make_seeds writes, with the target's dictionary
#      (fuzz/<target>.dict) and inputs up to MOEKIT_FUZZ_MAX_LEN bytes (default 131072: enough for
#      the JSON nesting limit and header sizes past it). A crash, sanitizer report, leak, timeout
#      or out-of-memory fails the script and leaves the reproducer under <fuzz build>/artifacts/.
# Environment: MOEKIT_ASAN_BUILD_DIR (build-asan), MOEKIT_FUZZ_BUILD_DIR (build-fuzz),
# MOEKIT_FUZZ_SECONDS (60), MOEKIT_HARDENING_SKIP_ASAN=1 / MOEKIT_HARDENING_SKIP_FUZZ=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=$(nproc)
asan_dir=${MOEKIT_ASAN_BUILD_DIR:-build-asan}
fuzz_dir=${MOEKIT_FUZZ_BUILD_DIR:-build-fuzz}
fuzz_seconds=${MOEKIT_FUZZ_SECONDS:-60}
fuzz_max_len=${MOEKIT_FUZZ_MAX_LEN:-131072}
start=$(date +%s)
stamp() { echo "hardening: $1 ($(( $(date +%s) - start )) s)"; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# --- 1. sanitizer suite -------------------------------------------------------------------------
if [ "${MOEKIT_HARDENING_SKIP_ASAN:-0}" != 1 ]; then
  # -O1 -g1: sanitizer reports with line numbers, and the tests still run at a usable speed.
  cmake -S . -B "$asan_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" -DMOEKIT_SANITIZE=ON -DMOEKIT_CUDA=OFF \
    -DMOEKIT_BUILD_TOOLS=ON -DMOEKIT_BUILD_TESTS=ON >/dev/null
  cmake --build "$asan_dir" -j "$jobs"
  stamp "sanitizer build done"
  ctest --test-dir "$asan_dir" --output-on-failure -j "$jobs" -E '^find_package_consumer$'
  stamp "sanitizer suite passed"
fi

# --- 2. fuzzers ---------------------------------------------------------------------------------
if [ "${MOEKIT_HARDENING_SKIP_FUZZ:-0}" != 1 ]; then
  clangxx=${MOEKIT_FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || true)}
  if [ -z "$clangxx" ]; then
    echo "hardening: no clang++ found (scripts/install_deps.sh installs clang-14)" >&2
    exit 1
  fi
  cmake -S . -B "$fuzz_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$clangxx" -DMOEKIT_FUZZ=ON -DMOEKIT_CUDA=OFF \
    -DMOEKIT_BUILD_TESTS=OFF -DMOEKIT_BUILD_TOOLS=OFF >/dev/null
  cmake --build "$fuzz_dir" -j "$jobs" --target fuzz_spec fuzz_safetensors fuzz_checkpoint \
    fuzz_make_seeds
  stamp "fuzz build done"

  # Seeds are staged into directories (libFuzzer reads directories; a file argument would only
  # be replayed). The working corpus starts empty each run: new inputs land there.
  seeds="$fuzz_dir/seeds"
  rm -rf "$seeds" "$fuzz_dir/corpus" "$fuzz_dir/artifacts"
  mkdir -p "$seeds"/{spec,safetensors,checkpoint} "$fuzz_dir"/corpus/{spec,safetensors,checkpoint} \
    "$fuzz_dir/artifacts"
  cp configs/*.json fuzz/corpus/spec/* "$seeds/spec/"
  for d in tests/golden/*/; do
    name=$(basename "$d")
    [ -f "$d/config.json" ] && cp "$d/config.json" "$seeds/spec/golden_$name.json"
    for f in "$d"*.safetensors; do
      # Small files only: libFuzzer's max_len follows the largest seed.
      [ -f "$f" ] && [ "$(stat -c %s "$f")" -le 65536 ] &&
        cp "$f" "$seeds/safetensors/golden_${name}_$(basename "$f")"
    done
  done
  cp fuzz/corpus/safetensors/* "$seeds/safetensors/"
  "$fuzz_dir/fuzz/fuzz_make_seeds" "$seeds/checkpoint"
  cp "$seeds"/checkpoint/* "$seeds/safetensors/"

  failed=()
  for target in spec safetensors checkpoint; do
    log="$fuzz_dir/fuzz_$target.log"
    # -timeout: one input taking > 10 s is a hang; -rss_limit_mb: a parser must not need 2 GB.
    if "$fuzz_dir/fuzz/fuzz_$target" -max_total_time="$fuzz_seconds" -timeout=10 \
         -rss_limit_mb=2048 -print_final_stats=1 -max_len="$fuzz_max_len" \
         -dict="fuzz/fuzz_$target.dict" \
         -artifact_prefix="$fuzz_dir/artifacts/$target-" \
         "$fuzz_dir/corpus/$target" "$seeds/$target" >"$log" 2>&1; then
      stamp "fuzz_$target: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" |
                            grep -o '[0-9]*$') runs, no findings"
    else
      failed+=("$target")
      echo "hardening: fuzz_$target FOUND A PROBLEM; last lines of $log:" >&2
      tail -n 60 "$log" >&2
      ls -l "$fuzz_dir/artifacts" >&2
    fi
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "hardening: fuzz findings in: ${failed[*]} (reproduce: <fuzzer> <artifact>)" >&2
    exit 1
  fi
fi
stamp "all hardening checks passed"
