"""The engines that take a step (plain PyTorch, DeepSpeed ZeRO-0/2/3), the process group
they run in, and the learning-rate schedule."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from relearn.train.deepspeed_config import deepspeed_config, prepare_environment
from relearn.train.model import RossLM
from relearn.train.options import TrainOptions, UsageError


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    deepspeed: bool
    sp: int = 1  # ranks per sequence-parallel group: consecutive ranks share the same rows

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def dp_world(self) -> int:
        return self.world // self.sp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.sp

    @property
    def sp_rank(self) -> int:
        return self.rank % self.sp


def setup_distributed(opts: TrainOptions) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    use_ds = opts.zero > 0 or opts.offload or world > 1 or opts.sp > 1
    if opts.sp > 1 and world % opts.sp:
        raise UsageError(
            f"--sp {opts.sp} needs a number of processes that it divides (launched with {world}): use torchrun --nproc_per_node"
        )
    if not use_ds:
        return Dist(0, 1, 0, torch.device("cuda" if cuda else "cpu"), False)
    prepare_environment(cuda)
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False)
    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    return Dist(rank, world, local_rank, torch.device(f"cuda:{local_rank}" if cuda else "cpu"), True, opts.sp)


def barrier(dist: Dist) -> None:
    if dist.world > 1:
        torch.distributed.barrier()


def shutdown(dist: Dist) -> None:
    """Leave the process group once every rank is done. Left to the interpreter's exit, the
    group's native threads were destroyed still joinable now and then ("terminate called
    without an active exception", SIGABRT on one rank after a finished run)."""
    if dist.deepspeed and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def sum_across(dist: Dist, value: float) -> float:
    if dist.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return float(t.item())


def any_across(dist: Dist, flag: bool) -> bool:
    """True on every rank when it is true on one (ranks must stop at the same step)."""
    if dist.world == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item())


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The optimizer's parameters: frozen ones (a multimodal start's vision tower) get no state
    and no weight decay, so they are saved bit for bit as loaded."""
    return [p for p in model.parameters() if p.requires_grad]


def lr_lambda(total_steps: int, warmup_steps: int):
    """Linear warmup from lr/warmup to lr, then cosine decay to 0 at the last step."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def warmup_steps(warmup: float, total: int) -> int:
    return int(warmup) if warmup >= 1 else math.ceil(warmup * total)


class PlainEngine:
    """Single process, plain PyTorch: AdamW, clipping, bf16 autocast over fp32 weights."""

    def __init__(self, model: RossLM, opts: TrainOptions, total_steps: int, device: torch.device) -> None:
        self.model = model.to(device)
        self.device = device
        self.bf16 = opts.bf16
        self.clip = opts.clip
        self.optimizer = torch.optim.AdamW(trainable(model), lr=opts.lr, weight_decay=opts.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(total_steps, warmup_steps(opts.warmup, total_steps)))

    def forward(self, **inputs: Any) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.model(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def finish_step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip if self.clip > 0 else float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def save(self, root: Path, tag: str) -> None:
        (root / tag).mkdir(parents=True, exist_ok=True)
        state = {"model": self.model.lm.state_dict(), "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        torch.save(state, root / tag / "state.pt")

    def load(self, root: Path, tag: str) -> None:
        state = torch.load(root / tag / "state.pt", map_location=self.device, weights_only=False)
        self.model.lm.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        return None  # the module itself holds whole weights


class DeepSpeedEngine:
    """DeepSpeed ZeRO-0/2/3 with a torch AdamW; one ``engine.step()`` per micro-batch, as DeepSpeed wants."""

    def __init__(self, model: RossLM, opts: TrainOptions, total_steps: int, dist: Dist, mpu: Any = None) -> None:
        import deepspeed

        self.dist = dist
        self.stage = opts.zero
        config = deepspeed_config(
            stage=opts.zero, rows_per_micro=opts.batch_trajectories, grad_accum=opts.grad_accum, world=dist.world,
            bf16=opts.bf16, offload=opts.offload, clip=opts.clip, pin_memory=dist.device.type == "cuda", sequence_parallel=dist.sp,
        )  # fmt: skip
        optimizer = torch.optim.AdamW(trainable(model), lr=opts.lr, weight_decay=opts.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(total_steps, warmup_steps(opts.warmup, total_steps)))
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config, mpu=mpu
        )
        self.model = model

    def forward(self, **inputs: Any) -> torch.Tensor:
        return self.engine(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        # Our micro-batch losses already add up to the step's loss over all micro-batches and
        # ranks; DeepSpeed would divide by grad_accum (turned off), and it sums gradients over
        # all ranks then divides by the data-parallel size (world / sp): the factor undoes that,
        # so the gradient is that of the step's loss.
        self.engine.backward(loss * self.dist.dp_world, scale_wrt_gas=False)
        self.engine.step()

    def finish_step(self) -> float:
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def save(self, root: Path, tag: str) -> None:
        self.engine.save_checkpoint(str(root), tag=tag, client_state={}, save_latest=False)

    def load(self, root: Path, tag: str) -> None:
        path, _ = self.engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {root / tag}")

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Whole weights on rank 0 (a collective under ZeRO-3: every rank must call it)."""
        if self.stage == 3:
            state = self.engine._zero3_consolidated_16bit_state_dict()
            return None if state is None else {k.removeprefix("lm."): v for k, v in state.items()}
        return None
