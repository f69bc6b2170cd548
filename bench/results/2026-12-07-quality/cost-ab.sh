#!/usr/bin/env bash
# Issue 45 item 4 (cost bound) in one run: `rotate` (K = 4 rotations of each 4-option choice) against plain reads over
# a 512-token state, decision-bench A/B in interleaved rounds on the same seeded requests (A: a launcher with
# --debias off, B: one with --debias rotate), for one question per request and for eight. Both launchers are started
# once, on the embedded SmolLM2-135M (float32), and stopped at the end. It writes, under OUT_DIR:
#   q1.json, q8.json     decision-bench's reports (rounds, tokens, ratios B/A)
#   cost-ab.json/.md     per case: median-of-rounds questions/s of A and B, the cost ratio A/B (rotate's cost in plain
#                        reads; the bound is <= 1.5), computed prompt tokens per request (the server's usage) and
#                        their ratio B/A
#   plain.server.log, rotate.server.log
# Usage: bench/results/2026-12-07-quality/cost-ab.sh OUT_DIR
#   env: MODE (B's --debias, default rotate; prior needs WARMUP >= 8: a question form is rotated until it has 8
#        samples), WARMUP (unmeasured requests per server, 2), K (B's --debias-max-orders, default 4: every rotation
#        of a 4-option choice), ROUNDS (default 8), REQUESTS (in all, spread over the rounds; 20), DURATION (cap per round in s, 60), CASES ("1 8"),
#        CONCURRENCY (1), LAUNCH_ARGS (extra launcher flags for both, e.g. "--threads 2")
# Rerun it on a quiet machine: on a shared one the per-round ratios scatter more than the effect.
set -euo pipefail
OUT=${1:?usage: $0 OUT_DIR}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
BIN=${BIN:-$ROOT/.venv/bin}
MODELS=${MODELS:-$HOME/.cache/decision-inference/models}
MODEL=${MODEL:-$MODELS/SmolLM2-135M-Instruct}
ROUNDS=${ROUNDS:-8}
REQUESTS=${REQUESTS:-20}
DURATION=${DURATION:-60}
CASES=${CASES:-"1 8"}
CONCURRENCY=${CONCURRENCY:-1}
K=${K:-4}
MODE=${MODE:-rotate}
WARMUP=${WARMUP:-2}
LAUNCH_ARGS=${LAUNCH_ARGS:-}
mkdir -p "$OUT"
free_port() { "$BIN/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT_A=$(free_port)
PORT_B=$(free_port)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
start() { # PORT NAME EXTRA...
  local port=$1 name=$2; shift 2
  # shellcheck disable=SC2086
  "$BIN/decision-launcher" --model-id "$MODEL" --dtype float32 --hostname 127.0.0.1 --port "$port" \
    --uds-path "/tmp/quality-cost-$name-$$.sock" $LAUNCH_ARGS "$@" > "$OUT/$name.server.log" 2>&1 &
  pids+=($!)
}
start "$PORT_A" plain --debias off
start "$PORT_B" rotate --debias "$MODE" --debias-max-orders "$K"
for port in "$PORT_A" "$PORT_B"; do
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "server on $port never became healthy" >&2; exit 1; }
done
# Each case its own seed: the same seed would send the same states again, which the prefix cache then holds
# (a case would read only its questions, and the ratio would be of suffixes alone).
for q in $CASES; do
  echo "case: $q question(s) per request" >&2
  "$BIN/decision-bench" --url "http://127.0.0.1:$PORT_A" --url-b "http://127.0.0.1:$PORT_B" --tokenizer "$MODEL" \
    --state-tokens 512 --questions "$q" --mix choice --options 4 --concurrency "$CONCURRENCY" \
    --rounds "$ROUNDS" --requests "$REQUESTS" --duration "$DURATION" --warmup "$WARMUP" --seed "$q" \
    --label "A --debias off, B --debias $MODE (K=$K): SmolLM2-135M float32, $q 4-option choice(s) x 512-token state, C$CONCURRENCY" \
    --json "$OUT/q$q.json" > /dev/null
done
"$BIN/python" - "$OUT" $CASES <<'PY'
import json, statistics, sys
from pathlib import Path

out, cases = Path(sys.argv[1]), sys.argv[2:]
rows = {}
for q in cases:
    report = json.loads((out / f"q{q}.json").read_text())
    a, b = report["servers"]["A"], report["servers"]["B"]
    per_round = [rb["questions_per_s"] / ra["questions_per_s"] for ra, rb in zip(a["rounds"], b["rounds"])
                 if ra["questions_per_s"] and rb["questions_per_s"]]
    qa, qb = a["median_of_rounds"]["questions_per_s"], b["median_of_rounds"]["questions_per_s"]
    ta, tb = a["tokens"]["server_input_tokens_per_request"], b["tokens"]["server_input_tokens_per_request"]
    rows[q] = {
        "questions_per_request": int(q),
        "a_plain_median_round_questions_per_s": qa,
        "b_rotate_median_round_questions_per_s": qb,
        "cost_ratio_plain_over_rotate_qps": round(qa / qb, 3) if qb else None,
        "median_of_per_round_cost_ratios": round(1 / statistics.median(per_round), 3) if per_round else None,
        "per_round_cost_ratios": [round(1 / r, 3) for r in per_round],
        "a_plain_input_tokens_per_request": ta,
        "b_rotate_input_tokens_per_request": tb,
        "token_ratio_rotate_over_plain": round(tb / ta, 3) if ta else None,
        "state_tokens_per_request": a["tokens"]["state_tokens_per_request"],
        "cached_tokens": [a["tokens"]["server_cached_tokens"], b["tokens"]["server_cached_tokens"]],
        "requests_ok": [a["requests_ok"], b["requests_ok"]],
    }
(out / "cost-ab.json").write_text(json.dumps(rows, indent=1) + "\n")
lines = ["| questions/request | plain q/s | rotate q/s | cost (plain/rotate q/s) | per-round cost ratios | "
         "tokens/request plain | rotate | token ratio | within 1.5x (q/s, tokens) |", "|---" * 9 + "|"]
for q, r in rows.items():
    ok = lambda x: "n/a" if x is None else ("yes" if x <= 1.5 else "no")
    lines.append(
        f"| {q} | {r['a_plain_median_round_questions_per_s']} | {r['b_rotate_median_round_questions_per_s']} | "
        f"{r['cost_ratio_plain_over_rotate_qps']} | {', '.join(map(str, r['per_round_cost_ratios']))} | "
        f"{r['a_plain_input_tokens_per_request']} | {r['b_rotate_input_tokens_per_request']} | "
        f"{r['token_ratio_rotate_over_plain']} | {ok(r['cost_ratio_plain_over_rotate_qps'])}, "
        f"{ok(r['token_ratio_rotate_over_plain'])} |"
    )
(out / "cost-ab.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
