"""PEFT's LoRA on the SRU++ projections of the transformers model trains (the loss falls, only the
adapter weights change) and the merged model saves as a folder both loaders read."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="LoRA needs the `hf` extra: pip install 'sru_lightning[hf]'")

from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from sru_lightning.export.pretrained import from_pretrained  # noqa: E402


def test_lora_on_the_srupp_projections_trains_and_the_merged_model_saves_again(folders, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(folders["srupp"])
    base = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    adapted = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["linear1", "linear2", "linear3"]))
    trainable = [name for name, parameter in adapted.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    optimizer = torch.optim.AdamW([p for p in adapted.parameters() if p.requires_grad], lr=1e-2)
    tokens = torch.randint(0, 15, (4, 32), generator=torch.Generator().manual_seed(0))
    adapted.train()
    losses = []
    for _ in range(30):
        loss = adapted(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
    for name, tensor in adapted.get_base_model().state_dict().items():  # the base weights are untouched
        if "lora_" not in name:
            assert torch.equal(tensor, base[name.replace(".base_layer", "")]), name
    merged = adapted.merge_and_unload().eval()
    assert set(merged.state_dict()) == set(base)
    changed = [name for name, tensor in merged.state_dict().items() if not torch.equal(tensor, base[name])]
    assert changed and all("transform_module.linear" in name for name in changed)
    merged.save_pretrained(tmp_path / "merged")
    AutoTokenizer.from_pretrained(folders["srupp"]).save_pretrained(tmp_path / "merged")
    net, codec = from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        assert torch.equal(net(tokens)[0], merged(input_ids=tokens).logits)
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
        assert torch.equal(reloaded(input_ids=tokens).logits, merged(input_ids=tokens).logits)
