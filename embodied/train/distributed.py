"""Multi-process training: this process's place in the run (`Processes`: DDP under `torchrun` or
`accelerate launch`, or FSDP2) and the FSDP2 units the memory plan reads (`fsdp_units`, `shard`)."""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

import torch


def fsdp_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules `shard` wraps with FSDP2, in wrapping order: every block named in the model's
    `_no_split_modules` (Qwen2.5-VL: decoder layers and vision blocks), then each tower holding blocks (the
    vision tower with its patch embedding and merger; not the language model, whose embedding is tied to the
    root's head), then the root. Needs no process group, so it works on a meta-device model (the memory plan
    of `embodied bench memory`)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(f"{type(model).__name__} names no _no_split_modules: FSDP cannot pick its blocks")
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"none of {sorted(names)} found in {type(model).__name__}")
    # generate() runs the vision tower by itself (visual features before the first forward), so a tower
    # (the module holding a list of blocks) gathers its own remaining weights (patch embedding, merger)
    # rather than rely on the root's. Not the language model's: its embedding is tied to the root's head.
    parent = {id(c): m for m in model.modules() for c in m.children()}
    embed = model.get_input_embeddings()
    holders = {id(t): t for b in blocks if (t := parent.get(id(parent.get(id(b))))) is not None}
    towers = [t for t in holders.values() if t is not model and not any(m is embed for m in t.modules())]
    return [*blocks, *towers, model]


def shard(model: torch.nn.Module, mixed_precision: str = "no") -> torch.nn.Module:
    """FSDP2: `fully_shard` every unit of `fsdp_units` (blocks, the vision tower, then the root); bf16
    computes in bfloat16 and reduces gradients in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from embodied.policy.lora import has_lora

    if has_lora(model):
        raise ValueError("LoRA under FSDP is not supported yet: use distributed=ddp with policy.lora_rank")
    half = mixed_precision == "bf16"
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if half else None
    kwargs = {"mp_policy": policy} if policy else {}
    for unit in fsdp_units(model):
        fully_shard(unit, **kwargs)
    # FSDP2 picks its root lazily, at the first forward; generate() calls the tower first, which would make
    # the tower a root. Initialise from the real root now (torch has no public call for this yet).
    model._get_fsdp_state()._lazy_init()
    return model


def _import_group_defaults() -> None:
    """Import `torch.distributed.nn` before the process group exists: its functions take `group=group.WORLD`
    as a default argument, so imported later (DDP imports it) it would hold the group for good, and
    `Processes.close` could not end it."""
    if torch.distributed.is_available():
        importlib.import_module("torch.distributed.nn")


class Processes:
    """This process's place in a multi-process run, and the few collectives the training loops need.

    Under `accelerate launch` (or `torchrun`) with N processes, every process draws the same global batch
    and trains on its slice `rank::N`; losses are normalised by whole-batch sizes (summed across
    processes) and multiplied by N, because DDP averages gradients: the summed gradient is then exactly
    the single-process one on the same global batch. In a plain run N = 1 and everything is the identity.
    `mixed_precision="bf16"` (GPU) wraps the forward pass in autocast with fp32 master weights.

    `strategy="fsdp"` shards parameters, gradients and optimizer state over the processes instead of
    replicating them (PyTorch's FSDP2 `fully_shard` on every block the model lists in `_no_split_modules`,
    then on the whole model). The module stays the same object, so generation and scoring call it as
    usual, but every process must then run every forward pass: evaluation and checkpoints run on all of
    them (only the first writes), and generation keeps the processes in step (`synced_gpus`).
    """

    def __init__(self, mixed_precision: str = "no", cpu: bool = True, strategy: str = "ddp"):
        from accelerate import Accelerator

        if strategy not in ("ddp", "fsdp"):
            raise ValueError(f"distributed={strategy!r}: choose ddp or fsdp")
        _import_group_defaults()
        # cpu=True: processes launched by torchrun on CPU join a gloo group (accelerate's MULTI_CPU)
        self.accelerator = Accelerator(mixed_precision=mixed_precision, cpu=cpu)
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.main = self.accelerator.is_main_process
        self.mixed_precision = mixed_precision
        self.fsdp = strategy == "fsdp" and self.world > 1

    @property
    def all_forward(self) -> bool:
        """Whether this process runs the forward passes only the first process needs (evaluation, PAPO's
        probe): under FSDP every process must take part in each."""
        return self.main or self.fsdp

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module to run training forward passes through (DDP / autocast wrapper when needed; under
        FSDP the model itself, sharded in place: build the optimizer after this)."""
        if self.fsdp:
            return shard(model, self.mixed_precision)
        if self.world == 1 and self.mixed_precision == "no":
            return model
        return self.accelerator.prepare(model)

    def wrap_frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        """A frozen model used alongside the policy (the KL reference): sharded too under FSDP."""
        return shard(model, self.mixed_precision) if self.fsdp else model

    def full_state(self, model: torch.nn.Module, optimizer=None) -> tuple[dict, dict | None]:
        """Whole (unsharded) state dicts of the model and optimizer, on the CPU, the optimizer's keyed by
        parameter name. Under FSDP every process must call this (it gathers)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optim = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
        weights = get_model_state_dict(model, options=opts)
        first: dict = {}  # tied parameters (lm_head = embed_tokens) are kept once, under their first name
        for name, p in model.named_parameters(remove_duplicate=False):
            if first.setdefault(id(p), name) != name:
                weights.pop(name, None)
        return weights, optim

    def save_checkpoint(
        self, root, step, model, optimizer, scheduler, state, config_yaml, keep, extra=None
    ) -> None:
        """Every process calls this; the first writes (`embodied.train.checkpoint.save_checkpoint`;
        `extra`: unsharded modules trained next to the model, saved as `<name>.safetensors`)."""
        from embodied.train.checkpoint import save_checkpoint

        if self.fsdp and extra:
            raise ValueError("modules next to the policy (PPO's value head) are not supported under FSDP yet")
        weights, optim = self.full_state(model, optimizer) if self.fsdp else (None, None)
        if self.main:
            args = (state, config_yaml, keep, weights, optim, extra)
            save_checkpoint(root, step, model, optimizer, scheduler, *args)
        self.barrier()

    def load_checkpoint(self, path, model, optimizer, scheduler=None, extra=None) -> dict:
        """Restore a checkpoint into this process's (possibly sharded) model and optimizer (and `extra`,
        as `save_checkpoint` wrote it)."""
        from embodied.train.checkpoint import load_checkpoint, restore_state

        if not self.fsdp:
            return load_checkpoint(path, model, optimizer, scheduler, extra)
        if extra:
            raise ValueError("modules next to the policy (PPO's value head) are not supported under FSDP yet")
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        weights = load_file(str(Path(path) / "model.safetensors"))
        optim, state = restore_state(path, scheduler)
        opts = StateDictOptions(full_state_dict=True, strict=False)  # tied weights are stored once
        set_model_state_dict(model, weights, options=opts)
        if optimizer is not None:  # expert iteration's rounds bring their own optimizers
            set_optimizer_state_dict(model, optimizer, optim["optimizer"], options=opts)
        return state

    def shard(self, items: list) -> list:
        if len(items) % self.world:
            raise ValueError(f"a global batch of {len(items)} does not split over {self.world} processes")
        return items[self.rank :: self.world]

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(x.detach().clone(), "sum") if self.world > 1 else x

    def reduce_metrics(self, metrics: dict, summed: tuple[str, ...] = ()) -> dict:
        """Metrics over all processes: keys starting with a prefix in `summed` are summed (each process
        holds its share), the rest averaged. Every process must call this at the same step."""
        if self.world == 1:
            return metrics
        keys = sorted(metrics)
        values = self.sum(torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64))
        return {k: v if k.startswith(summed) else v / self.world for k, v in zip(keys, values.tolist())}

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss * self.world)

    def grad_sync(self, net: torch.nn.Module, sync: bool):
        """Context for one micro-batch's forward and backward in gradient accumulation: with `sync=False`
        (every part before a step's last), DDP adds the part's gradients up locally instead of all-reducing
        them, and the last part's backward all-reduces the sum, once a step. DDP decides at the forward pass,
        so the context must hold both. Under FSDP every part still reduce-scatters (keeping unsharded
        gradients between parts would cost the memory FSDP is there to save); one process: nothing to do."""
        if sync or self.world == 1 or not hasattr(net, "no_sync"):
            return contextlib.nullcontext()
        return net.no_sync()

    def barrier(self) -> None:
        if self.world > 1:
            self.accelerator.wait_for_everyone()

    def close(self) -> None:
        """End this process's part in a multi-process run: its last call, once it holds none of the modules
        `wrap` returned. Waits for every process (none leaves while another still has a collective in
        flight), lets go of the modules accelerate keeps, then destroys the process group, which joins gloo's
        worker threads. Without this a process can abort as it exits ("terminate called without an active
        exception", SIGABRT): a worker thread frees the tensors of the last collective after the caller has
        moved on, freeing one that Python has seen takes the GIL, and a thread that asks for the GIL while
        the interpreter shuts down is ended by CPython in a way C++ answers with `std::terminate`. Under
        FSDP torch's device mesh still holds the group, so its threads outlive this (the barrier leaves them
        only their last clean-up to do). A plain run has nothing to end."""
        if self.world == 1 or not torch.distributed.is_initialized():
            return
        self.barrier()
        self.accelerator.free_memory()  # the wrappers hold the group: it ends only when the last one goes
        torch.distributed.destroy_process_group()
