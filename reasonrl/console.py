"""What the console shows: reasonrl's own lines, bars and tables; the libraries' own logs, warnings
and progress bars only with ``--verbose``. The one place that policy lives.

By default the CLI calls :func:`quiet_libraries` once, before any library is imported (several read
their switches at import time), and each stage command calls it again (a no-op then; it covers a
command invoked in-process). It sets, never over a value the user exported:

- ``VLLM_LOGGING_LEVEL=ERROR``, ``TRANSFORMERS_VERBOSITY=error``;
- ``TORCH_CPP_LOG_LEVEL=ERROR``: C++ warnings printed by torch and vLLM's kernels (vLLM's CPU
  worker's "NUMA binding" note at every engine start); torch reads it when it is imported;
- ``HF_HUB_DISABLE_PROGRESS_BARS=1`` (transformers' and the hub's bars) and ``TQDM_DISABLE=1``
  (any other tqdm bar that does not choose for itself, e.g. transformers' GGUF conversion);
  vLLM's weight-loading bar chooses for itself: the vLLM engine asks :func:`library_bars`;

and below ERROR drops: the ``vllm`` logger before vLLM configures its own logging (its import-time
warnings, e.g. "Triton is installed, but doesn't include CPU backend", otherwise reach Python's
last-resort handler), DeepSpeed's logger (its own stdout handler; "Setting accelerator to CPU",
unless ``REASONRL_DS_VERBOSE`` is set), and Python warnings raised inside the libraries.

Errors are never hidden: ERROR records, C++ errors, exceptions and their messages pass through.
``--verbose`` skips all of this, so each library prints what it prints by default (the choice is
per process: the switches read at import time cannot be turned back once read).
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Sequence

VERBOSE_FLAG = "--verbose"
VERBOSE_HELP = ("Show the libraries' own logs, warnings and progress bars (vLLM, transformers, torch, DeepSpeed); "
                "by default the console shows only reasonrl's lines, bars and tables, and the libraries' errors.")

#: Switches the libraries read from the environment (most at import time), quiet values.
QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TRANSFORMERS_VERBOSITY": "error",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
}
#: Top-level packages whose Python warnings are not shown by default.
LIBRARIES = ("vllm", "transformers", "torch", "deepspeed", "accelerate", "huggingface_hub", "safetensors", "tokenizers", "triton",
             "tensorboard", "tensorboardX", "google", "pyarrow", "numpy", "scipy", "matplotlib", "math_verify", "latex2sympy2_extended")

_quiet = False


class _ErrorsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def quiet_libraries() -> None:
    """Apply the default policy (see the module docstring); idempotent."""
    global _quiet
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
    if not os.environ.get("REASONRL_DS_VERBOSE"):
        ds = logging.getLogger("DeepSpeed")  # DeepSpeed sets its level (INFO) when imported; a filter stays
        if not any(isinstance(f, _ErrorsOnly) for f in ds.filters):
            ds.addFilter(_ErrorsOnly())
    if not _quiet:
        warnings.filterwarnings("ignore", module=r"(%s)(\.|$)" % "|".join(LIBRARIES))
    _quiet = True


def wants_verbose(argv: Sequence[str]) -> bool:
    """Whether a command line asks for ``--verbose`` (looked at before the libraries are imported,
    i.e. before the command line is parsed)."""
    args = list(argv)
    return VERBOSE_FLAG in (args[: args.index("--")] if "--" in args else args)


def library_bars() -> bool:
    """Whether libraries may draw their own progress bars (False once :func:`quiet_libraries` ran)."""
    return not _quiet


def error_line(e: BaseException, limit: int = 300) -> str:
    """``"Type: message"`` for a library's exception, on one line: the message's first non-empty
    line, or for pydantic's ValidationError (vLLM's config checks, whose first line is only "1
    validation error for VllmConfig") its first error's own message."""
    first = ""
    if type(e).__name__ == "ValidationError" and callable(getattr(e, "errors", None)):
        try:
            first = str(e.errors()[0].get("msg", ""))  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - fall back to the text
            first = ""
    if not first:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return (f"{type(e).__name__}: {first}" if first else type(e).__name__)[:limit]
