# Helpers of a device call's script (bench/results/<gpu>/<date>-sNN/callN.sh), sourced after the
# script has moved to the repository root: the binaries carried in build-carry/<name>.tar.xz
# (built and stripped on the development machine), each step's time limit inside the call's cap,
# and the results packed under $OUT after every section, so a call cut short still returns what
# it measured.
#   CAP   seconds the script may take (default 480), under the device tool's timeout_s
#   R     where the results go ($OUT/r), packed into $OUT/results.tar.gz by pack
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r
mkdir -p "$R"
call_t0=$(date +%s)

# stamp MESSAGE: the message after the seconds since the call began.
stamp() { echo "[$(($(date +%s) - call_t0))s] $*"; }

# left MAX: seconds a step may take: MAX, or what is left of CAP (at least 1).
left() {
  local l=$((${CAP:-480} - ($(date +%s) - call_t0)))
  ((l < 1)) && l=1
  ((l > $1)) && l=$1
  echo "$l"
}

pack() { tar -C "$R" -czf "$OUT/results.tar.gz" .; }

# carried NAME: unpacks build-carry/NAME.tar.xz into /tmp/NAME and prints that directory.
carried() {
  mkdir -p "/tmp/$1" && tar -xJf "build-carry/$1.tar.xz" -C "/tmp/$1" && echo "/tmp/$1"
}

# gpu_info: the GPU's name, driver, memory and clock into $R/gpu.txt (and stdout).
gpu_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
    --format=csv,noheader | tee "$R/gpu.txt"
}

# bench NAME MAX BINARY ARGS...: `BINARY bench ARGS --json` into $R/NAME.json, its stderr into
# $R/NAME.err, within left MAX.
bench() {
  local name=$1 lim=$2 bin=$3
  shift 3
  (timeout -k 5 "$(left "$lim")" "$bin" bench "$@" --json) >"$R/$name.json" 2>"$R/$name.err"
  stamp "$name rc=$?"
}

# gtest NAME MAX BINARY FILTER [WRAPPER...]: the test binary on FILTER into $R/NAME.txt, within
# left MAX, run under WRAPPER if given (e.g. compute-sanitizer --tool racecheck); returns its rc
# and prints gtest's verdict lines.
gtest() {
  local name=$1 lim=$2 bin=$3 filter=$4
  shift 4
  timeout -k 5 "$(left "$lim")" "$@" "$bin" --gtest_filter="$filter" >"$R/$name.txt" 2>&1
  local rc=$?
  stamp "$name rc=$rc"
  grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]|ERROR SUMMARY|RACECHECK SUMMARY" "$R/$name.txt" | head
  return $rc
}
