"""SRULightningForCausalLM gives the package's numbers: the same logits as the network the folder
holds, each row of a left-padded batch what the prompt alone gives, the package's loss, and a
cache that does not grow with the text."""

from __future__ import annotations

import pytest
import torch
from helpers.hf_folders import ALPHABET, NETWORKS

pytest.importorskip(
    "transformers", reason="the transformers classes need the `hf` extra: pip install 'sru_lightning[hf]'"
)

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from sru_lightning.export.pretrained import from_pretrained  # noqa: E402
from sru_lightning.hf import RecurrentStateCache, SRULightningForCausalLM  # noqa: E402

PROMPTS = ["Tab, c.\nhij", "ba", "g h. i,j ab"]


def _load(folder):
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("name", list(NETWORKS))
def test_logits_equal_the_folders_network(name, folders):
    model, tokenizer = _load(folders[name])
    net, codec = from_pretrained(folders[name])
    assert type(model) is SRULightningForCausalLM and not model.training
    tokens = torch.tensor([codec.encode(PROMPTS[0])])
    assert tokenizer(PROMPTS[0], return_tensors="pt")["input_ids"].tolist() == tokens.tolist()
    with torch.no_grad():
        assert torch.equal(model(input_ids=tokens).logits, net(tokens)[0])
    if net.config["tie_weights"]:
        assert model.decoder.weight is model.embedding.weight


@pytest.mark.parametrize("name", list(NETWORKS))
def test_each_row_of_a_left_padded_batch_equals_its_prompt_alone(name, folders):
    model, tokenizer = _load(folders[name])
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    assert batch["attention_mask"][1, 0] == 0 and tokenizer.padding_side == "left"
    with torch.no_grad():
        together = model(**batch)
        for row, prompt in enumerate(PROMPTS):
            alone = model(**tokenizer(prompt, return_tensors="pt"))
            length = alone.logits.shape[1]
            torch.testing.assert_close(together.logits[row, -length:], alone.logits[0], rtol=1e-5, atol=1e-6)
            # and the next tokens read on from the same state
            step = torch.tensor([[3]])
            after_alone = model(input_ids=step, cache=alone.cache).logits[0]
            rows_cache = RecurrentStateCache(together.cache.state, together.cache.seen_tokens)
            rows_cache.batch_select_indices(torch.tensor([row]))
            after_together = model(input_ids=step, cache=rows_cache).logits[0]
            torch.testing.assert_close(after_together, after_alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(NETWORKS))
def test_the_loss_is_the_mean_cross_entropy_of_the_next_token(name, folders):
    model, _ = _load(folders[name])
    tokens = torch.randint(0, len(ALPHABET), (2, 9), generator=torch.Generator().manual_seed(0))
    labels = tokens.clone()
    labels[0, 4] = -100
    with torch.no_grad():
        output = model(input_ids=tokens, labels=labels)
    logits, targets = output.logits[:, :-1], labels[:, 1:]
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, len(ALPHABET)), targets.reshape(-1))
    torch.testing.assert_close(output.loss, expected)


@pytest.mark.parametrize("name", list(NETWORKS))
def test_the_cache_after_400_tokens_is_as_large_as_after_one(name, folders):
    model, _ = _load(folders[name])
    tokens = torch.randint(0, len(ALPHABET), (2, 400), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        after_one = model(input_ids=tokens[:, :1]).cache
        sizes = [after_one.nbytes()]
        cache = model(input_ids=tokens[:, :10]).cache
        for position in range(10, 400):
            cache = model(input_ids=tokens[:, position : position + 1], cache=cache).cache
        sizes.append(cache.nbytes())
    assert cache.get_seq_length() == 400 and after_one.get_seq_length() == 1
    if name == "srupp":  # its attention memory fills up to memory_length (6) tokens, then stays
        filled = model(input_ids=tokens[:, :6]).cache.nbytes()
        assert sizes[1] == filled > sizes[0]
    else:
        assert sizes[1] == sizes[0] > 0


def test_a_padding_id_outside_the_vocabulary_is_read_only_where_the_mask_is_zero(folders):
    model, tokenizer = _load(folders["sru"])
    pad = tokenizer.pad_token_id
    assert pad == len(ALPHABET)  # after the vocabulary: no text encodes to it
    with pytest.raises(ValueError, match=r"`input_ids` must be in \[0, 15\) where the attention mask is 1"):
        model(input_ids=torch.tensor([[pad, 1]]))
