"""Where a quickstart's seconds go: wall-clock timers around the calls that matter, installed by patching
(docs/results/scripts/profile_quickstart.py runs the whole quickstart under them).

Timers nest: a key is the path of the timed calls it ran inside (`grpo>generate>vision`), so a stage's
seconds split into its parts and each part into its own. The timers wrap whole calls (a few thousand per
run), so they cost nothing measurable, unlike a tracing profiler on Hugging Face's Python-heavy `generate`.
Generation runs in worker processes that the timers cannot see; the script also makes `bench.profile_clips`
clips in its own process (workers=0) under `GENERATION_TARGETS`. A function imported by name into another
module is timed where it is looked up, so each target names the module that calls it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
import time
from collections import defaultdict


class Timers:
    """Accumulated wall seconds and call counts per path of nested timed calls.

    Each thread keeps its own stack. A call timed in another thread (a decoding pool) is keyed under the path
    the creating thread is in at that moment (`load>decode`), and its seconds add up over threads.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._owner = threading.get_ident()
        self._owner_stack: list[str] = []
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._undo: list = []
        self._lock = threading.Lock()

    def _enter(self, name: str) -> tuple[list[str], str]:
        """Push `name` on this thread's stack; return the stack and the key of the call."""
        if threading.get_ident() == self._owner:
            stack, prefix = self._owner_stack, []
        else:
            stack = getattr(self._local, "stack", None)
            if stack is None:
                stack = self._local.stack = []
            if not stack:  # an outermost call in this thread: it runs inside what the creating thread is in
                self._local.prefix = list(self._owner_stack)
            prefix = self._local.prefix
        stack.append(name)
        return stack, ">".join(prefix + stack)

    def wrap(self, owner, attr: str, name: str) -> None:
        """Time every call of `owner.attr` (a module function or a class's method) as `name`."""
        original = getattr(owner, attr)
        raw = owner.__dict__.get(attr, original) if isinstance(owner, type) else original
        if isinstance(raw, (staticmethod, classmethod)):
            raise TypeError(f"cannot time {owner}.{attr}: static or class method")

        @functools.wraps(original)
        def timed(*args, **kwargs):
            stack, key = self._enter(name)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[key] += time.perf_counter() - t0
                    self.calls[key] += 1
                stack.pop()

        setattr(owner, attr, timed)
        self._undo.append((owner, attr, raw))

    def restore(self) -> None:
        for owner, attr, raw in reversed(self._undo):
            setattr(owner, attr, raw)
        self._undo.clear()

    def table(self) -> list[dict]:
        return [
            {"path": k, "seconds": round(v, 2), "calls": self.calls[k]}
            for k, v in sorted(self.seconds.items(), key=lambda kv: kv[0])
        ]


# (module, attribute path, name): what is timed. Model classes are patched at the class, so every
# instance (policy, reference, evaluation) is seen.
TARGETS = [
    ("embodied.run", "ensure_dataset", "generate"),
    ("embodied.run", "load", "load_policy"),
    ("embodied.run", "load_split", "load"),
    ("embodied.data.load", "read_video", "decode"),
    ("embodied.run", "evaluate", "eval"),
    ("embodied.train.sft", "train_sft", "sft"),
    ("embodied.train.grpo", "train_grpo", "grpo"),
    ("embodied.train.runner", "evaluate", "validate"),  # SFT's and GRPO's held-out points
    ("embodied.run", "save_policy", "save"),
    ("embodied.train.grpo", "sample_groups", "rollout"),
    ("embodied.rl.rollout", "encode_prompts", "encode"),
    ("embodied.policy.sampling", "encode_prompts", "encode"),  # a rollout's prompts (`group_prompts`)
    ("embodied.policy.sampling", "HFEngine.sample", "sample"),  # every Hugging Face generation
    ("embodied.rl.rollout", "score", "reward"),
    ("embodied.train.grpo", "GRPO.update", "update"),
    ("embodied.train.sft", "encode_examples", "encode"),
    ("embodied.train.grpo", "GRPO.advantages", "advantages"),
    ("embodied.train.grpo", "apply_gradients", "optimizer"),
    ("torch.optim", "AdamW.step", "adamw"),
    ("torch.autograd", "backward", "backward"),
    ("transformers.processing_utils", "ProcessorMixin.__call__", "processor"),
    ("transformers.generation.utils", "GenerationMixin.generate", "generate"),
    (
        "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        "Qwen2_5_VisionTransformerPretrainedModel.forward",
        "vision",
    ),
    (
        "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        "Qwen2_5_VLTextModel.forward",
        "text",
    ),
    # the same two timers on the other architectures that train (embodied.policy.architectures)
    ("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLVisionModel.forward", "vision"),
    ("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLTextModel.forward", "text"),
    ("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5VisionModel.forward", "vision"),
    ("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5TextModel.forward", "text"),
    ("embodied.train.grpo", "completion_outputs", "logprobs"),  # the policy's pass (and PAPO's masked one)
    ("embodied.train.grpo", "completion_logprobs", "logprobs"),  # the reference's
    ("embodied.train.sft", "completion_logprobs", "logprobs"),
]

GENERATION_TARGETS = [
    ("embodied.data.engine", "store", "store"),
    ("embodied.data.engine", "write_video", "encode"),
    ("embodied.worlds.base", "SceneWorld.reset", "physics"),
    ("embodied.worlds.base", "SceneWorld.record", "render"),
]


def install(timers: Timers, targets) -> None:
    for module, path, name in targets:
        owner = importlib.import_module(module)
        *outer, attr = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        timers.wrap(owner, attr, name)


@contextlib.contextmanager
def timing(targets):
    timers = Timers()
    install(timers, targets)
    try:
        yield timers
    finally:
        timers.restore()
