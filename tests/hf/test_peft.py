"""PEFT's LoRA on the projections of each architecture of the transformers model trains (the loss
falls, only the adapter weights change) and the merged model saves as a folder both loaders read
with the same logits. SRU++'s projections are `nn.Linear` layers (`target_modules`); an SRU
layer's projection is its `weight` parameter and the LSTM's are `weight_ih_l*` / `weight_hh_l*`
(`target_parameters`)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="LoRA needs the `hf` extra: pip install 'sru_lightning[hf]'")

from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from sru_lightning.export.pretrained import from_pretrained  # noqa: E402
from sru_lightning.nn import set_recurrence_policy  # noqa: E402

# A text each row of which steps through the alphabet by 3 from its own start: learnable.
TOKENS = (torch.arange(32).repeat(4, 1) * 3 + torch.arange(4).unsqueeze(1)) % 15

TARGETS = {
    "srupp": dict(target_modules=["linear1", "linear2", "linear3"]),
    "sru": dict(target_parameters=["rnn_lst.0.weight", "rnn_lst.1.weight"]),
    "lstm": dict(target_parameters=["rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.weight_ih_l1", "rnn.weight_hh_l1"]),
}
# The base weights LoRA may change once merged.
ADAPTED = {
    "srupp": {f"rnn.rnn_lst.{i}.transform_module.linear{j}.weight" for i in (0, 1) for j in (1, 2, 3)},
    "sru": {"rnn.rnn_lst.0.weight", "rnn.rnn_lst.1.weight"},
    "lstm": {f"rnn.weight_{kind}_l{i}" for kind in ("ih", "hh") for i in (0, 1)},
}


def _unwrapped_name(name: str) -> str:
    return name.replace(".base_layer", "")


@pytest.mark.parametrize("architecture", ["srupp", "sru", "lstm"])
def test_lora_trains_only_the_adapters_and_the_merged_model_saves_again(folders, tmp_path, architecture):
    model = AutoModelForCausalLM.from_pretrained(folders[architecture])
    base = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    adapted = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, **TARGETS[architecture]))
    assert "lora" in repr(adapted)  # the wrapped layers describe themselves
    trainable = [name for name, parameter in adapted.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    optimizer = torch.optim.AdamW([p for p in adapted.parameters() if p.requires_grad], lr=5e-2)
    adapted.train()
    losses = []
    for _ in range(30):
        loss = adapted(input_ids=TOKENS, labels=TOKENS).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses
    for name, tensor in adapted.get_base_model().state_dict().items():  # the base weights are untouched
        if "lora_" not in name:
            assert torch.equal(tensor, base[_unwrapped_name(name)]), name
    adapted.eval()
    with torch.no_grad():
        adapted_logits = adapted(input_ids=TOKENS).logits
    merged = adapted.merge_and_unload().eval()
    assert set(merged.state_dict()) == set(base)  # the names (PEFT puts an adapted weight last)
    changed = {name for name, tensor in merged.state_dict().items() if not torch.equal(tensor, base[name])}
    assert changed and changed <= ADAPTED[architecture]
    merged.save_pretrained(tmp_path / "merged")
    AutoTokenizer.from_pretrained(folders[architecture]).save_pretrained(tmp_path / "merged")
    net, codec = from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        merged_logits = merged(input_ids=TOKENS).logits
        torch.testing.assert_close(merged_logits, adapted_logits)  # merging keeps what was trained
        assert torch.equal(net(TOKENS)[0], merged_logits)
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
        assert torch.equal(reloaded(input_ids=TOKENS).logits, merged_logits)


def test_an_sru_stack_under_lora_reads_its_layers_settings(folders):
    """The SRU stack reaches its layers through PEFT's wrappers: its description, the policy it
    reports and sets, and the input checks of its forward (one token, greedy generation)."""
    model = AutoModelForCausalLM.from_pretrained(folders["sru"])
    adapted = get_peft_model(model, LoraConfig(r=2, **TARGETS["sru"]))
    stack = adapted.get_base_model().rnn
    assert "highway_bias=-2.0" in repr(stack)
    assert stack.recurrence_policy == "auto"
    stack.recurrence_policy = "fp32"
    assert [cell.recurrence_policy for _, cell in set_recurrence_policy(adapted, "fp32")] == ["fp32", "fp32"]
    assert stack.recurrence_policy == "fp32"
    with pytest.raises(ValueError, match="recurrence_policy"):
        stack.recurrence_policy = "fp8"
    with pytest.raises(TypeError, match="float64"):
        stack(torch.zeros(3, 1, 8, dtype=torch.float64))
    generated = adapted.generate(input_ids=TOKENS[:1, :4], max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, 9)
