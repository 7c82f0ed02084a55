#!/usr/bin/env bash
# Every table of the performance docs, one command each. Run from the repository root after
# `make setup`; JSON and plots land in benchmarks/results/, the tables in
# docs/performance-tables.md. Takes about 5 minutes on 2 cores.
set -euo pipefail
R=.venv/bin/reshard
OUT=benchmarks/results
mkdir -p "$OUT"
for n in 2 3 4; do
  $R bench --engine gloo --ranks "$n" --op redistribute --sizes 64K..64M --json "$OUT/gloo-redistribute-$n.json" --plot "$OUT/gloo-redistribute-$n.png"
done
for n in 2 3 4; do
  $R bench --engine mpi --ranks "$n" --op redistribute --sizes 64K..64M --json "$OUT/mpi-redistribute-$n.json" --plot "$OUT/mpi-redistribute-$n.png"
done
$R bench --engine gloo --ranks 4 --op all_to_all --sizes 64K..16M --json "$OUT/gloo-all_to_all-4.json"
$R bench --engine mpi --ranks 4 --op all_to_all --sizes 64K..16M --json "$OUT/mpi-all_to_all-4.json"
$R bench --engine gloo --ranks 4 --op moe --sizes 16M --methods reshard,reshard-nocheck,raw,raw+local,memcpy --json "$OUT/gloo-moe-4.json"
$R bench --engine mpi --ranks 4 --op moe --sizes 16M --methods reshard,reshard-nocheck,raw,raw+local,memcpy --json "$OUT/mpi-moe-4.json"
$R bench --engine gloo --ranks 4 --op all_gather --sizes 1M,16M --json "$OUT/gloo-all_gather-4.json"
$R bench --engine gloo --ranks 4 --op reduce_scatter --sizes 1M,16M --json "$OUT/gloo-reduce_scatter-4.json"
for n in 2 3 4; do
  $R bench --engine gloo --ranks "$n" --op redistribute --sizes 1M,16M --methods reshard,reshard-nocheck,raw,raw+pack,raw+round --json "$OUT/gloo-rounds-$n.json"
done
.venv/bin/python benchmarks/targets.py --engine gloo --json "$OUT/targets-gloo.json" --no-color | tee "$OUT/targets-gloo.txt"
.venv/bin/python benchmarks/targets.py --engine mpi --json "$OUT/targets-mpi.json" --no-color | tee "$OUT/targets-mpi.txt"
for change in "S(0),S(1) S(1),S(0) s0s1-s1s0" "S(0),R S(1),R s0r-s1r" "S(0),S(0) S(1),S(1) s0s0-s1s1"; do
  set -- $change
  $R bench --engine gloo --mesh 2x2 --src "$1" --dst "$2" --sizes 16M --json "$OUT/gloo-mesh-2x2-$3.json"
done
.venv/bin/python benchmarks/summarize.py "$OUT"/*.json > docs/performance-tables.md
