#!/usr/bin/env bash
# Each node's own last good run, for the nightly's gate: from earlier nights' downloaded
# artifacts, newest night first, the first node-NAME whose run is complete and PASS.
#
#   last-good-per-node.sh CANDIDATES OUT
#
# CANDIDATES holds one folder per earlier night, named by its run id (a larger id is a later
# night), each as `gh run download --pattern 'node-*'` leaves it (node-NAME/<br-*>/
# evidence.json). OUT gets node-NAME for every node found (a copy); a node with no good run
# in CANDIDATES gets none, so the gate treats it as a first night. Exit 2 on bad arguments.
set -euo pipefail
if [ "$#" -ne 2 ]; then
  echo "usage: last-good-per-node.sh CANDIDATES OUT" >&2
  exit 2
fi
candidates=$1 out=$2
mkdir -p "$out"
[ -d "$candidates" ] || exit 0
mapfile -t nights < <(find "$candidates" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' \
  | grep -E '^[0-9]+$' | sort -rn)
for night in "${nights[@]}"; do
  for dir in "$candidates/$night"/node-*/; do
    [ -d "$dir" ] || continue
    node=$(basename "$dir")
    [ -e "$out/$node" ] && continue  # a later night already gave this node's last good run
    good=$(find "$dir" -mindepth 2 -maxdepth 2 -name evidence.json -print0 \
      | xargs -0 -r python3 -c '
import json, sys
docs = [json.load(open(p)) for p in sys.argv[1:]]
print(int(bool(docs) and all(d.get("complete") and d.get("verdict") == "PASS" for d in docs)))
')
    if [ "$good" = 1 ]; then
      cp -r "$dir" "$out/$node"
      echo "${node#node-}: last good run from night $night"
    fi
  done
done
