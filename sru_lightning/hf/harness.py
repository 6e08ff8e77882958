"""EleutherAI's evaluation harness on an export folder (``python -m sru_lightning.hf.lm_eval``
runs :func:`main`).

The command is ``lm_eval``'s own (every argument, subcommand and output is the harness's), run
after this package's model type is registered with transformers, which ``lm_eval`` alone cannot
know of. It adds one model to the harness, ``--model sru_lightning``: the harness's ``hf`` model
(the folder read by ``AutoModelForCausalLM`` / ``AutoTokenizer``) with the two settings a
recurrent character or word model needs and ``hf`` guesses from a transformer's config:

* the **prefix token** a document's first token is predicted from: these vocabularies hold no
  beginning- or end-of-text token, so it is the token of a line end ("\\n"; the end-of-line
  token of a word vocabulary), as if each document started a line; ``prefix_token_id=<id>``
  in ``--model_args`` chooses another;
* the **backend**: causal (the harness cannot tell from a model type it does not list).

``--model hf --model_args pretrained=<folder>,prefix_token_id=<id>`` gives the same numbers.
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

import sru_lightning.hf  # noqa: F401  (registers the model type with transformers' Auto classes)

__all__ = ["SRULightningLM", "main", "prefix_token_of"]

#: The text whose single token starts a document when the model_args name no prefix token.
LINE_END = "\n"


def prefix_token_of(tokenizer: Any) -> int:
    """The id a document's first token is predicted from: the tokenizer's beginning-of-text (or
    end-of-text) token when it has one, else the single token of a line end; ValueError naming
    `prefix_token_id` when the vocabulary has neither."""
    for special in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if special is not None:
            return int(special)
    try:
        ids = tokenizer.encode(LINE_END, add_special_tokens=False)
    except Exception:  # a vocabulary that cannot spell it (a character vocabulary without "\n")
        ids = []
    if len(ids) != 1:
        raise ValueError(
            "sru_lightning (lm_eval model): the tokenizer has no beginning-of-text token and no single token for "
            f"a line end {LINE_END!r} (it reads as {ids}) to predict a document's first token from; add "
            "prefix_token_id=<a token id> to --model_args"
        )
    return int(ids[0])


@register_model("sru_lightning")
class SRULightningLM(HFLM):
    """The harness's ``hf`` model with a causal backend and :func:`prefix_token_of`'s prefix."""

    def __init__(self, pretrained: Any, backend: str = "causal", prefix_token_id: int | None = None, **kwargs: Any):
        super().__init__(pretrained=pretrained, backend=backend, prefix_token_id=prefix_token_id, **kwargs)
        if self.custom_prefix_token_id is None:
            self.custom_prefix_token_id = prefix_token_of(self.tokenizer)


def main() -> None:
    """``lm_eval``'s command line, with the model type and ``--model sru_lightning`` registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
