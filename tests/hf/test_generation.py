"""generate() and pipeline("text-generation") on an export folder write what the package writes:
greedy text equal to `python -m sru_lightning generate ... temperature=0`, a left-padded batch
equal to each prompt alone, seeded sampling that draws the same text again."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch
from helpers.hf_folders import NETWORKS

pytest.importorskip(
    "transformers", reason="the transformers classes need the `hf` extra: pip install 'sru_lightning[hf]'"
)

from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline  # noqa: E402

from sru_lightning.app.decoding import generate_text  # noqa: E402
from sru_lightning.export.pretrained import from_pretrained  # noqa: E402

PROMPTS = ["Tab, c.\nhij", "ba", "g h. i,j ab"]
LENGTH = 30


def _greedy(model, tokenizer, prompts):
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    output = model.generate(**batch, max_new_tokens=LENGTH, do_sample=False)
    return [tokenizer.decode(row, skip_special_tokens=True) for row in output]


@pytest.mark.parametrize("name", list(NETWORKS))
def test_greedy_text_is_the_packages_and_a_padded_batch_is_each_prompt_alone(name, folders):
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folders[name]), AutoTokenizer.from_pretrained(folders[name])
    net, codec = from_pretrained(folders[name])
    expected = []
    for prompt in PROMPTS:
        out = io.StringIO()
        generate_text(net, codec, out, prompt=prompt, length=LENGTH, temperature=0.0)
        expected.append(out.getvalue())
    assert [_greedy(model, tokenizer, [prompt])[0] for prompt in PROMPTS] == expected
    assert _greedy(model, tokenizer, PROMPTS) == expected


def test_seeded_sampling_draws_the_same_text_again(folders):
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(folders["srupp"]),
        AutoTokenizer.from_pretrained(folders["srupp"]),
    )
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")

    def sampled(seed):
        torch.manual_seed(seed)
        return model.generate(**batch, max_new_tokens=LENGTH, do_sample=True, temperature=1.0, top_k=0).tolist()

    assert sampled(1) == sampled(1) != sampled(2)


def test_the_text_generation_pipeline_runs_on_a_folder(folders):
    generator = pipeline("text-generation", model=str(folders["sru"]))
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(folders["sru"]),
        AutoTokenizer.from_pretrained(folders["sru"]),
    )
    results = generator(PROMPTS[:2], max_new_tokens=LENGTH, do_sample=False, batch_size=2)
    texts = [result[0]["generated_text"] for result in results]
    assert texts == _greedy(model, tokenizer, PROMPTS[:2])


@pytest.mark.slow  # the command line in its own process
def test_greedy_generate_equals_the_generate_command(folders):
    prompt = PROMPTS[0]
    command = [sys.executable, "-m", "sru_lightning", "generate", f"model={folders['sru']}"]
    command += [f"prompt={prompt}", f"length={LENGTH}", "temperature=0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(folders["sru"]),
        AutoTokenizer.from_pretrained(folders["sru"]),
    )
    assert result.stdout.removesuffix("\n") == _greedy(model, tokenizer, [prompt])[0]


def test_a_decoding_step_hands_the_model_the_new_token_and_the_cache_alone(folders):
    """After the prompt, each step's inputs are the newest token, the cache and no attention mask (the
    padding was read with the prompt); what transformers' general preparation adds (a copy of the ids,
    position ids) this model does not read, and the greedy text above holds to the package's."""
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(folders["sru"]),
        AutoTokenizer.from_pretrained(folders["sru"]),
    )
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        cache = model(**batch).cache
    ids = batch["input_ids"]
    mask = torch.cat([batch["attention_mask"], torch.ones_like(ids[:, :1])], dim=1)
    step = model.prepare_inputs_for_generation(
        ids, cache=cache, attention_mask=mask, next_sequence_length=1, use_cache=True, position_ids=mask.cumsum(1)
    )
    assert step.keys() == {"input_ids", "cache", "attention_mask", "use_cache"}
    assert torch.equal(step["input_ids"], ids[:, -1:]) and step["cache"] is cache and step["attention_mask"] is None
    padded = torch.cat([ids, torch.full_like(ids[:, :1], tokenizer.pad_token_id)], dim=1)  # rows that have ended
    assert step.keys() == model.prepare_inputs_for_generation(padded, cache=cache, next_sequence_length=1).keys() | {
        "use_cache"
    }
    prompt = model.prepare_inputs_for_generation(ids, attention_mask=batch["attention_mask"], is_first_iteration=True)
    assert torch.equal(prompt["input_ids"], ids) and torch.equal(prompt["attention_mask"], batch["attention_mask"])


def test_a_batch_whose_rows_end_at_different_steps_generates(folders):
    """With an end token, a row that has drawn it is fed the padding id (past the vocabulary) while
    the others go on; it is read as any token (its logits are discarded) and the row stays padded."""
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(folders["sru"]),
        AutoTokenizer.from_pretrained(folders["sru"]),
    )
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    torch.manual_seed(0)
    ended = 0
    for end in range(4):
        output = model.generate(
            **batch, max_new_tokens=LENGTH, do_sample=True, eos_token_id=end, pad_token_id=tokenizer.pad_token_id
        )
        for row in output[:, batch["input_ids"].shape[1] :].tolist():
            if end in row[:-1]:
                ended += 1
                assert set(row[row.index(end) + 1 :]) == {tokenizer.pad_token_id}
    assert ended  # some row ended before the others
