"""Run by tests/test_verl.py with .venv-verl's Python (verl 0.9.1, transformers<5.11): verl's own dataset,
reward-function loader and reward managers on an `embodied export`. Prints one JSON line of counts.

Usage: .venv-verl/bin/python tests/verl_env_check.py SPEC.json   (SPEC is written by the test)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
import verl
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.dataset.rl_dataset import RLHFDataset


def main(spec_path: str) -> dict:
    spec = json.loads(Path(spec_path).read_text())
    # The tokenizer (with its chat template) is what renders the prompt; verl only needs a processor object
    # to accept media rows, and the Qwen video processor needs torchvision, which this CPU-only env lacks.
    tok = AutoTokenizer.from_pretrained(spec["tokenizer"], local_files_only=True)
    config = OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": spec["cache"]})
    ds = RLHFDataset(spec["parquet"], tok, config, processor=tok)
    rows = {}
    prompts_equal = 0
    for i in range(len(ds)):
        row = ds[i]
        rows[row["extra_info"]["id"]] = row
        text = tok.apply_chat_template(row["raw_prompt"], tokenize=False, add_generation_prompt=True)
        prompts_equal += int(text == spec["prompts"][row["extra_info"]["id"]])
        video = row["raw_prompt"][0]["content"][0]
        assert video["type"] == "video" and video["fps"] == 2.0, video

    cfg = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": spec["reward_file"], "name": "compute_score"}}}
    )
    fn = get_custom_reward_fn(cfg)
    cases = spec["cases"]
    custom_equal = 0
    for case in cases:
        row = rows[case["id"]]
        got = fn(
            data_source=row["data_source"],
            solution_str=case["text"],
            ground_truth=row["reward_model"]["ground_truth"],
            extra_info=dict(row["extra_info"]),
        )
        custom_equal += int(got["score"] == case["score"])

    data = proto(tok, rows, cases)
    return {
        "command_composes": compose_command(spec["overrides"]),
        "verl": verl.__version__,
        "transformers": transformers.__version__,
        "rows": len(ds),
        "prompts_equal": prompts_equal,
        "custom_fn_equal": custom_equal,
        "loop_manager_equal": loop_manager(tok, fn, data, cases),
        "naive_manager_equal": legacy_manager(tok, fn, data, cases, "naive"),
        "batch_manager_equal": legacy_manager(tok, None, data, cases, "batch", spec["reward_file"]),
    }


def compose_command(overrides: list[str]) -> bool:
    """Whether docs/scaling.md's `verl.trainer.main_ppo` overrides compose into verl's own config (Hydra,
    as `main_ppo` does; an unknown key or a bad value raises), with our reward file and video key set."""
    import os

    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    reward = cfg.reward.custom_reward_function
    return bool(
        reward.path.endswith("verl_reward.py") and reward.name == "compute_score" and cfg.data.video_key
    )


def proto(tok, rows: dict, cases: list[dict]) -> DataProto:
    """A rollout batch as verl's trainer hands it to a reward manager: left-padded prompts, right-padded
    responses (each ending in <|im_end|>, which decoding drops), the rows' non-tensor fields."""
    prompts = [tok(f"question {c['id']}", add_special_tokens=False)["input_ids"] for c in cases]
    responses = [tok(c["text"] + "<|im_end|>", add_special_tokens=False)["input_ids"] for c in cases]
    p_len, r_len, pad = max(map(len, prompts)), max(map(len, responses)), tok.pad_token_id
    p_ids = torch.tensor([[pad] * (p_len - len(p)) + p for p in prompts])
    r_ids = torch.tensor([r + [pad] * (r_len - len(r)) for r in responses])
    p_mask = torch.tensor([[0] * (p_len - len(p)) + [1] * len(p) for p in prompts])
    r_mask = torch.tensor([[1] * len(r) + [0] * (r_len - len(r)) for r in responses])
    picked = [rows[c["id"]] for c in cases]
    return DataProto.from_dict(
        tensors={
            "prompts": p_ids,
            "responses": r_ids,
            "input_ids": torch.cat([p_ids, r_ids], 1),
            "attention_mask": torch.cat([p_mask, r_mask], 1),
        },
        non_tensors={
            "data_source": np.array([r["data_source"] for r in picked], dtype=object),
            "reward_model": np.array([dict(r["reward_model"]) for r in picked], dtype=object),
            "extra_info": np.array([dict(r["extra_info"]) for r in picked], dtype=object),
        },
    )


def last_token_scores(reward: torch.Tensor, data: DataProto) -> list[float]:
    lengths = data.batch["attention_mask"][:, data.batch["prompts"].shape[1] :].sum(-1)
    return [float(reward[i, int(n) - 1]) for i, n in enumerate(lengths)]


def loop_manager(tok, fn, data: DataProto, cases: list[dict]) -> int:
    """verl's default path (the reward loop's `naive` manager): one `run_single` per response."""
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

    manager = NaiveRewardManager(OmegaConf.create({}), tok, fn)
    equal = 0
    for i, case in enumerate(cases):
        result = manager.loop.run_until_complete(manager.run_single(data[i : i + 1]))
        equal += int(result["reward_score"] == case["score"])
    return equal


def legacy_manager(tok, fn, data: DataProto, cases: list[dict], name: str, reward_file: str = "") -> int:
    """verl's legacy reward managers (`naive`: compute_score per response; `batch`: compute_score_batch)."""
    from verl.workers.reward_manager import get_reward_manager_cls

    if name == "batch":
        cfg = {"reward": {"custom_reward_function": {"path": reward_file, "name": "compute_score_batch"}}}
        fn = get_custom_reward_fn(OmegaConf.create(cfg))
    manager = get_reward_manager_cls(name)(tokenizer=tok, num_examine=0, compute_score=fn)
    scores = last_token_scores(manager(data), data)
    return int(sum(s == np.float32(c["score"]) for s, c in zip(scores, cases)))


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
