#!/usr/bin/env bash
# A JSONL file through the server with decision-batch (installed by `make install`): one answer line per input line,
# resumable (run it twice: the second run skips what the first wrote).
#   examples/batch_file.sh http://127.0.0.1:3000
set -euo pipefail
url=${1:-http://127.0.0.1:3000}
bin=${DECISION_BATCH:-$(dirname "$0")/../.venv/bin/decision-batch}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/in.jsonl" <<'JSONL'
{"id": "t-1", "body": {"state": "I was charged twice.", "questions": {"team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": null, "tech": null}}}}}
{"id": "t-2", "body": {"state": "The app crashes on upload.", "questions": {"team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": null, "tech": null}}}}}
{"id": "t-3", "route": "/v1/decisions", "body": {"input": "Refund please", "questions": [{"id": "refund", "type": "yes_no", "question": "A refund request?"}]}}
JSONL
"$bin" "$dir/in.jsonl" -o "$dir/out.jsonl" --url "$url"
cat "$dir/out.jsonl"
