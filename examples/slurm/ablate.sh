#!/usr/bin/env bash
# A `reasonrl ablate` as Slurm jobs: the plan from `ablate --dry-run` (one command a line, critics
# first), the value-pretraining runs as one job array, the train runs as a second array that starts
# when every critic has finished, and `ablate --collect` (the table) after both. Each array task
# runs one line of the plan; a rerun of this script submits only the runs not finished (--dry-run
# skips them), so a preempted ablation goes on where it stopped.
#
#   examples/slurm/ablate.sh --spec stages/ablate-lora-cpu.toml --out runs/ablate-lora [--sbatch "--gpus-per-node 1 --time 4:00:00"]
#
# Options: everything but --sbatch goes to `reasonrl ablate`; --sbatch "..." is added to every
# sbatch call (partition, GPUs, time, account). REASONRL_PYTHON as in train.sbatch. Prints the job ids.
set -euo pipefail
PY=${REASONRL_PYTHON:-$PWD/.venv/bin/python}
SB=()
ARGS=()
while [ $# -gt 0 ]; do
  if [ "$1" = --sbatch ]; then read -r -a SB <<<"$2"; shift 2; else ARGS+=("$1"); shift; fi
done
OUT=""
for i in "${!ARGS[@]}"; do [ "${ARGS[$i]}" = --out ] && OUT=${ARGS[$((i + 1))]}; done
[ -n "$OUT" ] || { echo "ablate.sh: pass --out DIR (the ablation's directory)" >&2; exit 1; }
"$PY" -m reasonrl.cli ablate "${ARGS[@]}" --dry-run --quiet >"$OUT.plan"
grep -e ' pretrain-value ' "$OUT.plan" >"$OUT.critics" || true
grep -v -e ' pretrain-value ' "$OUT.plan" >"$OUT.trains" || true
task='cmd=$(sed -n "${SLURM_ARRAY_TASK_ID}p" "$1"); echo "$cmd"; eval "$cmd"'
dep=()
if [ -s "$OUT.critics" ]; then
  n=$(wc -l <"$OUT.critics")
  critics=$(sbatch --parsable "${SB[@]}" --job-name=reasonrl-critics --array=1-"$n" --output="$OUT.critic-%a.out" \
    --wrap="bash -c '$task' _ $OUT.critics")
  dep=(--dependency=afterok:"$critics")
  echo "critics: job $critics ($n)"
fi
after=()
if [ -s "$OUT.trains" ]; then
  n=$(wc -l <"$OUT.trains")
  trains=$(sbatch --parsable "${SB[@]}" "${dep[@]}" --job-name=reasonrl-trains --array=1-"$n" --output="$OUT.train-%a.out" \
    --wrap="bash -c '$task' _ $OUT.trains")
  after=(--dependency=afterany:"$trains")
  echo "trains: job $trains ($n)"
fi
collect=$(sbatch --parsable "${SB[@]}" "${after[@]}" --job-name=reasonrl-collect --output="$OUT.collect.out" \
  --wrap="$PY -m reasonrl.cli ablate --collect $OUT")
echo "collect: job $collect"
