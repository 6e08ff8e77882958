"""Chunked streaming equals one pass in the exported language model: ONNX Runtime, AOTInductor
and torch.export programs, SRU and SRU++ (memory carried in the graph's fixed-size memory), random (seeded)
splits through ``stream_chunks``, float32 (exports are float32) within 1e-6 of the same runtime's
one pass. The chunks are time slices of one token tensor, so not contiguous: an AOTInductor
package read them as contiguous (another sequence's logits) until the runner made them so. The
eager and compiled matrix is tests/nn/test_streaming.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnxruntime", reason="needs the `export` extra: pip install 'sru_lightning[export]'")

from helpers.language_models import language_model as build_language_model

from sru_lightning.export import export_language_model, load_exported  # noqa: E402
from sru_lightning.models import SRULanguageModel  # noqa: E402
from sru_lightning.nn import stream_chunks, streaming  # noqa: E402
from sru_lightning.ops.testing import relative_error  # noqa: E402

VOCAB, BATCH, LENGTH = 11, 2, 13
OPTIONS = {
    "sru": {},
    # a memory of every earlier token: each chunk then sees what one pass sees
    "srupp": dict(sru_options={"proj_size": 4, "num_heads": 2}, memory_length=16),
}


def random_split(length: int, seed: int, pieces: int = 4) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    cuts = sorted((torch.randperm(length - 1, generator=generator)[: pieces - 1] + 1).tolist())
    return [end - start for start, end in zip([0, *cuts], [*cuts, length])]


def language_model(kind: str) -> SRULanguageModel:
    torch.manual_seed(0)
    return build_language_model(
        vocab_size=VOCAB, rnn=kind, embedding_dim=6, hidden_size=8, num_layers=2, **OPTIONS[kind]
    ).eval()


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """One export per (kind, format), made when first asked for and reused (AOTInductor compiles C++)."""
    made = {}

    def get(kind: str, fmt: str):
        if (kind, fmt) not in made:
            folder = tmp_path_factory.mktemp(f"{kind}-{fmt}")
            made[kind, fmt] = (
                language_model(kind),
                load_exported(export_language_model(language_model(kind), folder / "out", fmt)),
            )
        return made[kind, fmt]

    return get


@pytest.mark.parametrize(
    "kind,fmt",
    [
        ("sru", "onnx"),
        pytest.param("srupp", "onnx", marks=pytest.mark.slow),  # SRU++'s export runs over 4 s; sru-onnx stays
        pytest.param("sru", "aoti", marks=pytest.mark.slow),
        pytest.param("srupp", "aoti", marks=pytest.mark.slow),
        pytest.param("sru", "pt2", marks=pytest.mark.slow),
        pytest.param("srupp", "pt2", marks=pytest.mark.slow),
    ],
)
def test_chunked_stream_of_an_export_equals_its_one_pass(kind, fmt, exports):
    model, exported = exports(kind, fmt)
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1))
    expected_logits, expected_state = exported(tokens)
    with torch.no_grad():
        eager_logits, _ = model(tokens)
    assert relative_error(expected_logits, eager_logits) <= 1e-5  # the export is the model
    for seed in range(3):
        sizes = random_split(LENGTH, seed)
        logits, state = stream_chunks(exported, tokens.split(sizes, 1))
        errors = [relative_error(logits, expected_logits)]
        errors += [relative_error(a.double(), b.double()) for a, b in zip(state, expected_state)]
        assert len(state) == len(expected_state) and max(errors) <= 1e-6, f"split {sizes}: errors {errors}"


def test_an_exports_step_carries_state_through_stream_step(exports, monkeypatch):
    """`generate model=<export>` calls the exported model's `step`, which goes through `stream_step`."""
    calls = []
    original = streaming.stream_step

    def counting(module, chunk, state=None, **options):
        calls.append(tuple(chunk.shape))
        return original(module, chunk, state, **options)

    monkeypatch.setattr(streaming, "stream_step", counting)
    _, exported = exports("srupp", "onnx")
    tokens = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    expected, _ = exported(tokens)
    logits, state = exported.step(tokens[:, :3])
    steps = [logits]
    for t in range(3, 6):
        logits, state = exported.step(tokens[:, t], state)
        steps.append(logits)
    assert calls == [(1, 3), (1, 1), (1, 1), (1, 1)]
    assert relative_error(torch.stack(steps, 1), expected[:, 2:]) <= 1e-6
    assert exported.bidirectional is False and exported.batch_first is True
