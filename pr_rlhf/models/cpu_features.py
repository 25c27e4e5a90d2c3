"""CPU features a process must ask the kernel for before using them."""
from __future__ import annotations

import ctypes
import platform


def request_amx_permission() -> None:
    """Ask Linux for AMX tile state before any kernel uses it: bf16 on CPU SIGILLs intermittently otherwise (a
    process must request XFEATURE_XTILEDATA before its first AMX instruction). Every process that may run vLLM's
    kernels asks: the rollout actor, and vLLM's engine-core and worker processes through the plugin
    (``pr_rlhf.models.vllm_weight_transfer.register``). Harmless where AMX does not exist (the call just fails)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(158, 0x1023, 18)  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    except OSError:
        pass  # no libc symbol: nothing to ask
