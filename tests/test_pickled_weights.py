"""A model folder with only pickled weights (`pytorch_model.bin`) is refused in one clear line that says how
to convert it, and the conversion it gives works."""

from __future__ import annotations

import re

import pytest
import torch

from embodied.policy.model import load_policy, require_safetensors, save_policy


def test_pickled_weights_are_refused_with_a_working_conversion(tiny_policy, tmp_path):
    from safetensors.torch import load_file

    folder = tmp_path / "old checkpoint"
    save_policy(*tiny_policy, folder)
    require_safetensors(folder)  # safetensors: fine
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()

    with pytest.raises(ValueError) as refused:
        require_safetensors(folder)
    message = str(refused.value)
    assert "\n" not in message and "pytorch_model.bin" in message and "safetensors" in message
    code = re.search(r'python -c "(.+)"$', message).group(1)
    exec(code, {})  # what the user would run
    require_safetensors(folder)
    model, _ = load_policy(folder)
    reference = tiny_policy[0].state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in model.state_dict().items())
