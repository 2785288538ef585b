"""The reference pass of one GRPO step (4 prompts x 8 answers, 4 images each, 56 tokens) with and without
PrefixCache, alternated 15 times, and the cost of hashing the 4 prompts (milliseconds, medians)."""

import statistics
import time

import torch

torch.set_num_threads(1)
from embodied.bench.grpo_vs_trl import as_images, simulate_examples
from embodied.policy.model import (
    completion_logprobs,
    encode_completions,
    encode_prompts,
    load_policy,
    repeat_batch,
    resolve_policy_path,
)
from embodied.policy.prefix_cache import PrefixCache
from embodied.video import VideoConfig

m, p = load_policy(resolve_policy_path("tiny", 0))
m.eval()
ex = as_images(simulate_examples(4, 0))
b = repeat_batch(encode_prompts(p, [e.record for e in ex], [e.clip for e in ex], VideoConfig()), 8)
ids, mask = encode_completions(p, ["<think>" + "x " * 25 + "</think><answer>A</answer>"] * 32)
c = PrefixCache()
u = b.unique
with torch.no_grad():
    completion_logprobs(m, b, ids, mask, prefix_cache=c)
    T = {"nocache": [], "cache": [], "key": []}
    for r in range(15):
        t = time.perf_counter()
        completion_logprobs(m, b, ids, mask)
        T["nocache"].append(time.perf_counter() - t)
        t = time.perf_counter()
        completion_logprobs(m, b, ids, mask, prefix_cache=c)
        T["cache"].append(time.perf_counter() - t)
        t = time.perf_counter()
        [PrefixCache.key(u, i) for i in range(4)]
        T["key"].append(time.perf_counter() - t)
print({k: round(statistics.median(v) * 1000, 1) for k, v in T.items()}, c.hits, c.misses, ids.shape)
