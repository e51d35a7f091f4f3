"""torch.distributed helpers: one process without torchrun, gloo on CPU, nccl on GPU.

torch is imported only where a process group or a device is really needed: a single-process
baseline or API run never loads it (issue 24: every start paid for the whole ML stack).
"""
from __future__ import annotations

import datetime
import gc
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple



@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    #: the process group was started by ``init_distributed``, so ``shutdown`` ends it; a group the
    #: caller started (a program running several evaluations in one group) is left to the caller
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(timeout_s: float = 6 * 3600, gpus_per_rank: int = 1) -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1), else single process.

    A failing rank exits non-zero and torchrun then stops the others; the long timeout only
    bounds how long ranks wait for the slowest one at the final barrier. With
    ``gpus_per_rank=K`` (a model split over K GPUs per rank) local rank r communicates from
    its first GPU, r*K, so no two ranks share a device.

    Multi-node: torchrun sets RANK / WORLD_SIZE / LOCAL_RANK on every node (c10d rendezvous);
    nothing else is needed here, but the output directory must be on a shared filesystem.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    import torch  # heavy: only a torchrun launch needs a process group
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    first_gpu = local_rank * max(1, int(gpus_per_rank))
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() > first_gpu
    if use_cuda:
        torch.cuda.set_device(first_gpu)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if use_cuda else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(rank, world, local_rank, owns_group=owns)


def sample_sharding(info: DistInfo, model_options: Dict[str, Any]) -> Tuple[int, int]:
    """(rank, world) over which the samples are split. A tensor-parallel model
    (``tp_plan``) spans all ranks, which must all run the same inputs: they form ONE
    data-parallel rank (every rank runs every sample and writes the same records; the merge
    keeps one copy)."""
    if model_options.get("tp_plan"):
        return 0, 1
    return info.rank, info.world_size


def _dist() -> Any:
    """torch.distributed, which ``init_distributed`` has imported whenever a group exists."""
    import torch.distributed as dist  # already loaded by init_distributed: no cost

    return dist


def barrier(info: DistInfo) -> None:
    if info.enabled:
        _dist().barrier()


def all_gather_objects(info: DistInfo, obj: Any) -> List[Any]:
    if not info.enabled:
        return [obj]
    out: List[Any] = [None] * info.world_size
    _dist().all_gather_object(out, obj)
    return out


#: set by a command line that ends its process right after the run (``end_process``): its group
#: is then left to the exit, never torn down while a peer may still be tearing down its own
_process_ends_after_run = False


def shutdown(info: DistInfo) -> None:
    """Leave the process group together: a final barrier first, so no rank tears its group down
    while a peer is still working (rank 0 scores and writes the report alone; measured on a
    loaded 2-core machine, a rank that left early was aborted with "terminate called without an
    active exception" about one run in two). A group the caller started stays up for its next
    evaluation (re-creating a group in one torchrun can hang: measured 1 in 4). Under a command
    line that ends its process next (``end_process``) the group is not torn down at all."""
    if info.enabled and _dist().is_initialized():
        _dist().barrier()
        if info.owns_group and not _process_ends_after_run:
            _dist().destroy_process_group()


def process_ends_after_run() -> None:
    """Called by a command line's entry point: this process ends when the run returns."""
    global _process_ends_after_run
    _process_ends_after_run = True


def process_ends_after_this_run() -> bool:
    """Whether a command line's entry point said this process ends when the run returns (a
    library caller's process goes on)."""
    return _process_ends_after_run


def end_process(code: int) -> None:
    """End a command line's process with ``code``. A torchrun rank that joined a process group
    ends without the interpreter's teardown (its output flushed first): tearing down gloo while a
    peer tears down its own still aborted a rank now and then after the final barrier ("terminate
    called without an active exception", exit -6, once in CI and once in a docs block run of the
    two-node launch), which turned a finished run into a failed one and held the other node's
    launcher 300 s in its exit barrier. Every other process exits the usual way (atexit handlers,
    module teardown), except that the teardown's garbage collections skip the objects alive at
    this point (``gc.freeze``): torch and transformers hold millions, and scanning them again
    and again took 1-2 s of every run's exit."""
    if "torch.distributed" in sys.modules and _dist().is_initialized():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        logging.shutdown()
        os._exit(code)
    gc.freeze()
    sys.exit(code)


def default_device(info: DistInfo, gpus_per_rank: int = 1) -> str:
    """This rank's (first) device: ``cuda:<local_rank * gpus_per_rank>``, or cpu."""
    import torch  # heavy: asked only by a family that runs on a device

    if torch.cuda.is_available():
        return f"cuda:{info.local_rank * max(1, int(gpus_per_rank))}"
    return "cpu"
