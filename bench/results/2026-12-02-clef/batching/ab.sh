#!/usr/bin/env bash
# A/B rounds: "before" = every pooled read alone (PADDED_TOKENS=1), "after" = padded forwards (8192).
set -euo pipefail
cd /work/wt-clef2
F=server/decision_server/engines/pooled.py
OUT=/tmp/clef2-ab
mkdir -p $OUT
for round in 1 2 3; do
  for variant in before after; do
    if [ $variant = before ]; then sed -i 's/^PADDED_TOKENS = 8192$/PADDED_TOKENS = 1/' $F; else sed -i 's/^PADDED_TOKENS = 1$/PADDED_TOKENS = 8192/' $F; fi
    grep -n '^PADDED_TOKENS' $F
    CONCURRENCY=8 REQUESTS=48 WARMUP=8 PORT=39311 bench/scripts/clef.sh $OUT/$variant-$round > $OUT/$variant-$round.log 2>&1
  done
done
sed -i 's/^PADDED_TOKENS = 1$/PADDED_TOKENS = 8192/' $F
echo done
