"""Ranks of a multi-process run (torchrun or Slurm's srun): who am I, where is the
rendezvous, which slice of the work is mine.  Used by `fp4ref verify-exhaustive` and
`fp4ref fleet`; plain functions of the environment, testable without a cluster."""
from __future__ import annotations

import os
from datetime import timedelta

__all__ = ["DEFAULT_PORT", "first_host", "launch_env", "init_group", "shard", "gather", "share_code",
           "close_group"]

DEFAULT_PORT = 29500


def first_host(nodelist: str) -> str:
    """First host of a Slurm node list ('gpu[03-05,9],cpu1' -> 'gpu03')."""
    head, depth = "", 0
    for c in nodelist:
        if c == "," and depth == 0:
            break
        depth += (c == "[") - (c == "]")
        head += c
    if "[" not in head:
        return head
    pre, _, rng = head.partition("[")
    return pre + rng.split(",")[0].split("-")[0].rstrip("]")


def _int_var(environ, name: str, minimum: int) -> int:
    v = environ.get(name, "")
    try:
        n = int(v)
    except ValueError:
        n = None
    if n is None or n < minimum:
        raise ValueError(f"{name}: {v!r} is not an integer >= {minimum} (set by torchrun or srun)")
    return n


def launch_env(environ=None) -> dict:
    """rank, world_size, local_rank, master_addr, master_port and the launcher that set them.
    torchrun's variables win; Slurm's (SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID) are mapped
    onto them, the rendezvous host from MASTER_ADDR, SLURM_LAUNCH_NODE_IPADDR or the first node
    of SLURM_JOB_NODELIST; with neither launcher, one rank."""
    environ = os.environ if environ is None else environ
    if "RANK" in environ or "WORLD_SIZE" in environ:
        launcher, names = "torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    elif "SLURM_PROCID" in environ:
        launcher, names = "slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
    else:
        return {"launcher": "none", "rank": 0, "world_size": 1, "local_rank": 0,
                "master_addr": None, "master_port": None}
    rank = _int_var(environ, names[0], 0)
    world = _int_var(environ, names[1], 1)
    local = _int_var(environ, names[2], 0) if names[2] in environ else 0
    if rank >= world:
        raise ValueError(f"{names[0]}: {rank} is not below {names[1]} = {world}")
    addr = environ.get("MASTER_ADDR") or environ.get("SLURM_LAUNCH_NODE_IPADDR")
    if not addr and environ.get("SLURM_JOB_NODELIST"):
        addr = first_host(environ["SLURM_JOB_NODELIST"])
    port = _int_var(environ, "MASTER_PORT", 1) if "MASTER_PORT" in environ else DEFAULT_PORT
    if world > 1 and not addr:
        raise ValueError("MASTER_ADDR: not set (export MASTER_ADDR=<first node> for srun)")
    return {"launcher": launcher, "rank": rank, "world_size": world, "local_rank": local,
            "master_addr": addr, "master_port": port}


def init_group(env: dict, timeout_s: float = 1800.0) -> bool:
    """A gloo process group over env:// when there is more than one rank (gloo: CPU-only
    nodes work, no NCCL needed); False when running alone."""
    if env["world_size"] <= 1:
        return False
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = str(env["master_addr"])
    os.environ["MASTER_PORT"] = str(env["master_port"])
    dist.init_process_group("gloo", init_method="env://", rank=env["rank"],
                            world_size=env["world_size"], timeout=timedelta(seconds=timeout_s))
    return True


def shard(total: int, rank: int, world: int) -> tuple[int, int]:
    """[lo, hi) of the input indices that ``rank`` checks: contiguous, disjoint, covering."""
    return total * rank // world, total * (rank + 1) // world


def gather(result, env: dict, grouped: bool) -> list | None:
    """Every rank's ``result`` on rank 0 (None elsewhere), over gloo; alone: ``[result]``."""
    if not grouped:
        return [result]
    import torch.distributed as dist
    got = [None] * env["world_size"] if env["rank"] == 0 else None
    dist.gather_object(result, got, dst=0)
    return got


def share_code(code: int, grouped: bool) -> int:
    """Every rank exits with rank 0's code (srun reports the highest task code)."""
    if not grouped:
        return code
    import torch.distributed as dist
    box = [code]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])


def close_group(grouped: bool) -> None:
    if grouped:
        import torch.distributed as dist
        dist.destroy_process_group()
