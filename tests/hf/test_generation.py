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
