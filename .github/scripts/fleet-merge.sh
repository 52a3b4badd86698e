#!/usr/bin/env bash
# The nightly's merge step: every node's run into one fleet report, against each node's
# last good run.
#
#   fleet-merge.sh NODES_DIR BASELINE OUT
#
# NODES_DIR holds one folder per node as download-artifact leaves artifacts named node-*
# (NODES_DIR/node-NAME/: the node's br-* run folder and node.json, naming the node);
# BASELINE the same shape, each node's own last good run (last-good-per-node.sh; a node
# without one, or no BASELINE at all, is a first night). With
# NODES_FILE set, a node of that file that uploaded nothing is MISSING, and fails. Exit
# codes are `bsrctl fleet report`'s: 0 every node PASS and no regression, 1 a non-PASS or
# missing node or a regression, 2 bad input (runs of different specs, a bound on a metric
# no run measures). GATE_FAIL_ON (default below) holds the METRIC:PCT bounds.
set -euo pipefail
BSRCTL=${BSRCTL:-bsrctl}
if [ "$#" -ne 3 ]; then
  echo "usage: fleet-merge.sh NODES_DIR BASELINE OUT" >&2
  exit 2
fi
nodes_dir=$1 baseline=$2 out=$3
mapfile -t folders < <(find "$nodes_dir" -mindepth 1 -maxdepth 1 -type d -name 'node-*' \
  2>/dev/null | sort)
if [ "${#folders[@]}" -eq 0 ]; then
  echo "fleet-merge: no node uploaded a run into $nodes_dir" >&2
  exit 1
fi
args=(--out "$out")
if [ -n "${NODES_FILE:-}" ]; then args+=(--nodes "$NODES_FILE"); fi
if [ -n "$(find "$baseline" -mindepth 3 -maxdepth 3 -name evidence.json 2>/dev/null)" ]; then
  args+=(--baseline "$baseline")
  read -r -a bounds <<< "${GATE_FAIL_ON:-restore_pool_peak_bytes:0 restore_s:25 ttft_s:25}"
  for b in "${bounds[@]}"; do args+=(--fail-on "$b"); done
else
  echo "first night: no last good runs in $baseline, nothing to compare against"
fi
exec "$BSRCTL" fleet report "${folders[@]}" "${args[@]}"
