"""Chunked streaming equals one pass: SRU, SRU++ with its memory carried, and the language model
(SRU and SRU++), read chunk by chunk through ``stream_step`` with random (seeded) splits, give
the output and final state of one call over the whole sequence, eagerly and compiled, in
float32 (within 1e-6) and in half storage (within 2 storage steps of the unchunked half result;
measured at most 1: each chunk boundary rounds the carried c to storage once). The ONNX Runtime
and AOTInductor runs are in tests/export/test_streaming_exports.py. Bidirectional layers are
refused for streaming, naming the layer."""

from __future__ import annotations

import pytest
import torch
from helpers.language_models import language_model
from torch import nn

from sru_lightning.nn import SRU, SRUCell, SRUpp, stream_chunks, stream_step, streaming
from sru_lightning.nn.streaming import causal_attention_mask
from sru_lightning.ops.testing import relative_error

INPUT, HIDDEN, VOCAB, BATCH, LENGTH = 6, 8, 11, 2, 13
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def tolerance(dtype: torch.dtype) -> float:
    """float32: 1e-6 relative. Half storage: two storage steps (eps of the storage dtype times
    the largest magnitude); the chunked result differs from the unchunked one by the rounding of
    the carried c at each boundary, measured at most one step."""
    return 1e-6 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps


def random_split(length: int, seed: int, pieces: int = 4) -> list[int]:
    """`pieces` chunk lengths summing to `length`, each >= 1; seed 0 always includes a length-1 chunk."""
    generator = torch.Generator().manual_seed(seed)
    cuts = sorted((torch.randperm(length - 1, generator=generator)[: pieces - 1] + 1).tolist())
    if seed == 0:
        cuts = sorted(set(cuts[:-1]) | {length - 1})  # a last chunk of one step: a decoding step
    return [end - start for start, end in zip([0, *cuts], [*cuts, length])]


def build(kind: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    if kind == "sru":
        module = SRU(INPUT, HIDDEN, num_layers=2, layer_norm=True)
    elif kind == "srupp":
        module = SRUpp(INPUT, HIDDEN, 4, num_layers=2, num_heads=2)
    elif kind == "lm-sru":
        module = language_model(vocab_size=VOCAB, rnn="sru", embedding_dim=INPUT, hidden_size=HIDDEN, num_layers=2)
    else:  # the memory holds every earlier token: chunks then see what one pass sees
        options = {"proj_size": 4, "num_heads": 2}
        module = language_model(
            vocab_size=VOCAB,
            rnn="srupp",
            embedding_dim=INPUT,
            hidden_size=HIDDEN,
            num_layers=2,
            sru_options=options,
            memory_length=64,
        )
    return module.eval().to(dtype)


def sequence(kind: str, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if kind.startswith("lm"):
        return torch.randint(0, VOCAB, (BATCH, LENGTH), generator=generator)
    return torch.randn(LENGTH, BATCH, INPUT, generator=generator).to(dtype)


def one_pass(kind: str, module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The whole sequence in one ordinary call of the module (not through the streaming code)."""
    if kind == "sru":
        output, c = module(x)
        return output, [c]
    if kind == "srupp":
        output, c, bank = module(x, attn_mask=causal_attention_mask(0, x.shape[0]))
        return output, [c, *bank["saved_inputs"]]
    logits, state = module(x)
    return logits, [state] if isinstance(state, torch.Tensor) else list(state)


def chunked(module, x: torch.Tensor, sizes: list[int], time_dim: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    output, state = stream_chunks(module, x.split(sizes, time_dim))
    return output, [state] if isinstance(state, torch.Tensor) else list(state)


def check_equal(kind, dtype, expected, actual, sizes) -> None:
    (expected_output, expected_state), (output, state) = expected, actual
    limit = tolerance(dtype)
    assert output.dtype == expected_output.dtype and len(state) == len(expected_state)
    errors = [relative_error(output, expected_output)]
    errors += [relative_error(a, b) for a, b in zip(state, expected_state)]
    assert max(errors) <= limit, f"{kind} {dtype} split {sizes}: errors {errors} (output, state...) over {limit:.2g}"


KINDS = ["sru", "srupp", "lm-sru", "lm-srupp"]


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("kind", KINDS)
def test_chunked_stream_equals_one_pass_eagerly(kind, dtype):
    dtype = DTYPES[dtype]
    module, x = build(kind, dtype), sequence(kind, dtype)
    time_dim = 1 if kind.startswith("lm") else 0
    with torch.no_grad():
        expected = one_pass(kind, module, x)
        for seed in range(3):
            sizes = random_split(LENGTH, seed)
            check_equal(kind, dtype, expected, chunked(module, x, sizes, time_dim), sizes)
        # one step at a time: how generate reads on after the prompt
        check_equal(kind, dtype, expected, chunked(module, x, [1] * LENGTH, time_dim), "steps of 1")


# Each compile takes tens of seconds on 2 cores: every model once, each dtype on a layer and on a
# language model (the eager matrix above covers every pair).
COMPILED_CASES = [("sru", "fp32"), ("srupp", "bf16"), ("lm-sru", "bf16"), ("lm-srupp", "fp32")]


@pytest.mark.slow
@pytest.mark.parametrize("kind, dtype", COMPILED_CASES, ids=[f"{kind}-{dtype}" for kind, dtype in COMPILED_CASES])
def test_chunked_stream_equals_one_pass_compiled(kind, dtype):
    """The compiled module streamed against the compiled module's own one pass (compiled kernels
    round differently from eager ones in half storage). Every call must run compiled: a hit of the
    recompile limit would fall back to eager and is an error here."""
    dtype = DTYPES[dtype]
    module, x = build(kind, dtype), sequence(kind, dtype)
    time_dim = 1 if kind.startswith("lm") else 0
    torch._dynamo.reset()
    compiled = torch.compile(module, dynamic=True)
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=32, fail_on_recompile_limit_hit=True):
        expected = one_pass(kind, compiled, x)
        sizes = random_split(LENGTH, 0)  # one split (each new shape compiles): it ends with a chunk of 1
        check_equal(kind, dtype, expected, chunked(compiled, x, sizes, time_dim), sizes)
    eager = one_pass(kind, module, x)
    if dtype == torch.float32:  # and compiled is eager's computation
        assert relative_error(expected[0], eager[0]) <= 1e-5


def test_state_rounding_at_a_boundary_is_the_only_half_storage_difference():
    """Half storage: the kernel carries c in float32 between steps but returns c_last in the
    storage dtype. Carrying that rounded c gives exactly the one pass whose c is rounded once at
    the boundary -- here built independently, from a one-step pass that starts from the rounded c."""
    module, x = build("sru", torch.float32), sequence("sru", torch.float32)
    module.recurrence_policy = "half"  # bfloat16 storage under autocast, weights and outputs float32
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        _, c_first = module(x[:5])
        assert torch.equal(c_first, c_first.bfloat16().float())  # already on the storage grid
        rounded_by_hand = module(x[5:], c_first.bfloat16().float())
        streamed = stream_chunks(module, x.split([5, LENGTH - 5]))
    assert torch.equal(streamed[0][5:], rounded_by_hand[0]) and torch.equal(streamed[1], rounded_by_hand[1])


@pytest.mark.parametrize(
    "module,name",
    [
        (SRU(INPUT, HIDDEN, bidirectional=True), "the module (SRU)"),
        (SRUCell(INPUT, HIDDEN, bidirectional=True), "the module (SRUCell)"),
        (SRUpp(INPUT, HIDDEN, 4, bidirectional=True), "the module (SRUpp)"),
        (nn.ModuleDict({"encoder": SRU(INPUT, HIDDEN, bidirectional=True)}), "layer 'encoder' (SRU)"),
        (nn.ModuleDict({"lstm": nn.LSTM(INPUT, HIDDEN, bidirectional=True)}), "layer 'lstm' (LSTM)"),
    ],
    ids=["SRU", "SRUCell", "SRUpp", "nested-SRU", "nested-LSTM"],
)
def test_streaming_refuses_bidirectional_layers_naming_them(module, name):
    x = torch.randn(3, BATCH, INPUT)
    for target in (module, torch.compile(module)):
        with pytest.raises(ValueError) as error:
            stream_step(target, x)
        message = str(error.value)
        assert message.startswith(f"stream_step: {name} has `bidirectional` True; streaming needs bidirectional=False")
        assert message.endswith("got bidirectional=True")
    with pytest.raises(ValueError, match="bidirectional=False"):
        stream_chunks(module, x.split(1))


def test_a_one_shot_call_of_a_bidirectional_layer_with_c0_is_not_streaming():
    rnn = SRU(INPUT, HIDDEN, bidirectional=True).eval()
    output, c = rnn(torch.randn(3, BATCH, INPUT), torch.zeros(2, BATCH, 2 * HIDDEN))
    assert output.shape == (3, BATCH, 2 * HIDDEN) and c.shape == (2, BATCH, 2 * HIDDEN)


def test_bounded_srupp_memory_and_misplaced_memory_length():
    module, x = build("srupp", torch.float32), sequence("srupp", torch.float32)
    with torch.no_grad():
        _, state = stream_chunks(module, x.split([4, 5, 4]), memory_length=5)
        assert [tuple(m.shape) for m in state[1:]] == [(5, BATCH, INPUT), (5, BATCH, HIDDEN)]
        _, state = stream_chunks(module, x.split([4, 9]), memory_length=0)
        assert len(state) == 1
    with pytest.raises(ValueError, match="`memory_length` applies to SRUpp layers only, got memory_length=3 for SRU"):
        stream_step(build("sru", torch.float32), x, memory_length=3)
    with pytest.raises(ValueError, match="at least one chunk"):
        stream_chunks(module, [])


def test_language_model_step_and_generate_carry_state_through_stream_step(monkeypatch):
    """The network's `step` (what `generate` calls per token) goes through `stream_step`."""
    calls = []
    original = streaming.stream_step

    def counting(module, chunk, state=None, **options):
        calls.append(tuple(chunk.shape))
        return original(module, chunk, state, **options)

    from sru_lightning.nn import language_net

    monkeypatch.setattr(streaming, "stream_step", counting)
    monkeypatch.setattr(language_net, "stream_step", counting)  # the network's own reference to it
    model, tokens = build("lm-srupp", torch.float32), sequence("lm-srupp", torch.float32)
    with torch.no_grad():
        expected, _ = model(tokens)
        logits, state = model.net.step(tokens[:, :5])
        steps = [logits]
        for t in range(5, LENGTH):
            logits, state = model.net.step(tokens[:, t], state)
            steps.append(logits)
    assert calls == [(BATCH, 5)] + [(BATCH, 1)] * (LENGTH - 5)
    assert relative_error(torch.stack(steps, 1), expected[:, 4:]) <= 1e-6


def test_the_streaming_example_in_the_layers_page_runs():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "layers.md").read_text()
    section = page.split("## Streaming", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/layers.md (Streaming)", "exec"), {})


@pytest.mark.parametrize("batch_first", [False, True])
def test_stream_chunks_refuses_a_chunk_without_a_time_axis_naming_the_expected_shape(batch_first):
    layout = r"\(B, L, input_size\) with batch_first=True" if batch_first else r"\(L, B, input_size\)"
    steps = torch.randn(5, 4)  # 2-D: one step of (B, input_size) for a layer, nothing to join along time
    for layer in (SRU(4, 8, batch_first=batch_first), SRUCell(4, 8, batch_first=batch_first)):
        with pytest.raises(ValueError, match=rf"stream_chunks: chunk 0 of `chunks` must be 3-D {layout}, got shape"):
            stream_chunks(layer, [steps[:3], steps[3:]])
    model = language_model(vocab_size=5, embedding_dim=4, hidden_size=8, num_layers=1)
    tokens = torch.randint(0, 5, (6,))
    with pytest.raises(ValueError, match=r"chunk 0 of `chunks` must be a tensor with a time axis at time_dim=1"):
        stream_chunks(model, [tokens[:3], tokens[3:]])


def test_stream_chunks_names_a_chunk_whose_output_cannot_continue_the_others():
    def by_rows(chunk, state):  # a model whose output's batch follows the chunk's
        return chunk * 2, state

    with pytest.raises(ValueError, match=r"chunk 1 gives an output of shape \(3, 2\), which does not continue"):
        stream_chunks(by_rows, [torch.zeros(2, 2), torch.zeros(3, 2)], time_dim=1)
