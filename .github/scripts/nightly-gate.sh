#!/usr/bin/env bash
# The nightly's regression gate: the run under test against the last good run.
#
#   nightly-gate.sh BASELINE RUN_DIR
#
# BASELINE is where `gh run download --name last-good` put the artifact. upload-artifact
# stores a single directory's CONTENTS at the artifact's root, so the baseline is either
# BASELINE itself (evidence.json at its root: what a run folder uploaded by its own path
# gives) or the one run folder inside it (br-*/evidence.json: the nightly uploads the
# folder above the run, which keeps its name). Nothing there: a first night, which passes
# and says so. A baseline of another kind or spec: a warning, and a pass. Exit codes: 0 no
# regression (or nothing to compare), 1 a regression, 2 bad arguments or a broken gate.
# GATE_FAIL_ON (default below) holds the METRIC:PCT bounds given to `bsrctl compare`.
set -euo pipefail
BSRCTL=${BSRCTL:-bsrctl}
if [ "$#" -ne 2 ]; then
  echo "usage: nightly-gate.sh BASELINE RUN_DIR" >&2
  exit 2
fi
baseline=$1 run_dir=$2
if [ ! -f "$run_dir/evidence.json" ]; then
  echo "nightly-gate: $run_dir has no evidence.json: the run under test is missing" >&2
  exit 2
fi
if [ -f "$baseline/evidence.json" ]; then
  base=$baseline
else
  mapfile -t found < <(find "$baseline" -mindepth 2 -maxdepth 2 -name evidence.json \
    -path '*/br-*/evidence.json' 2>/dev/null | sort)
  if [ "${#found[@]}" -gt 1 ]; then
    echo "nightly-gate: $baseline holds ${#found[@]} runs (${found[*]}); expected one" >&2
    exit 2
  fi
  base=${found[0]:+$(dirname "${found[0]}")}
fi
if [ -z "${base:-}" ]; then
  echo "first night: no last good run in $baseline, nothing to compare against"
  exit 0
fi
# Two runs of other kinds or specs are not comparable: a changed spec starts a new baseline.
same=$("${PYTHON:-python3}" - "$base/evidence.json" "$run_dir/evidence.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
print("yes" if (a["kind"], a["spec_sha256"]) == (b["kind"], b["spec_sha256"]) else "no")
PY
)
if [ "$same" != yes ]; then
  echo "::warning::the last good run ($base) used another spec or kind: not compared"
  exit 0
fi
echo "comparing $run_dir against the last good run $base"
read -r -a bounds <<< "${GATE_FAIL_ON:-restore_pool_peak_bytes:0 restore_s:25 ttft_s:25}"
args=()
for b in "${bounds[@]}"; do args+=(--fail-on "$b"); done
# compare's own exit code: 0 no regression, 1 a regression, 2 bad input (a broken gate)
exec "$BSRCTL" compare "$base" "$run_dir" "${args[@]}"
