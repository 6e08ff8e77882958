"""Carried-state contiguous streams read by LitData (`data=litdata`), sharded and resumed by it.

A split's tokens are LitData blocks of `seq_len` tokens, in order (:mod:`.litdata_format`). The
split is cut into `batch_size x world_size` streams of `blocks_per_row` consecutive blocks
(one block is kept back for the last target); stream ``i`` starts at block
``i * blocks_per_row``. A batch holds one window of each of this rank's `batch_size` streams,
and the next batch the next window of the same streams, so the recurrent state carried from one
batch to the next has read exactly the tokens before.

LitData does the reading: the streams of row `r` of every rank form one `subset` of the split,
which LitData shares between the ranks (rank `q` gets its `q`-th stream: the rows `r *
world_size + q` of :class:`~.streams.ContiguousStreams`' order), and a
``ParallelStreamingDataset`` reads the rows side by side. A window's targets end with the first
token of the next block (after a stream's last block, the next stream's first: the text goes on
there), read by a second subset one block ahead, so no state is
kept outside LitData's: a ``StreamingDataLoader``'s ``state_dict`` is the whole position, and a
resumed fit reads on from it.

What LitData may not do here: shuffle (the order is the streams'), or split a rank's streams
between more than one loader worker (the batches of two workers alternate and would not
continue each other); one worker reads ahead of the training process, none reads in it.
"""

from __future__ import annotations

from typing import Any

import torch


def _rows_of(samples: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of one window from the blocks of every row and the next block of each."""
    rows = len(samples) // 2
    inputs = torch.stack([torch.as_tensor(block) for block in samples[:rows]]).long()
    following = torch.stack([torch.as_tensor(block[:1]) for block in samples[rows:]]).long()
    return inputs, torch.cat([inputs[:, 1:], following], dim=1)


def _unwrap(batch: list) -> Any:
    """The loader's batches are single windows: no batch dimension is added."""
    return batch[0]


def blocks_per_row(tokens: int, seq_len: int, rows: int) -> int:
    """Blocks of each stream of a split of `tokens` tokens cut into `rows` streams; the block after
    the last stream's last is kept back for its last target."""
    return (tokens // seq_len - 1) // rows


def stream_loader(
    input_dir: str,
    *,
    tokens: int,
    batch_size: int,
    seq_len: int,
    world_size: int = 1,
    num_workers: int = 0,
    cache_dir: str | None = None,
    max_cache_size: str | int = "50GB",
):
    """A ``litdata.StreamingDataLoader`` of this rank's `(inputs, targets)` windows. LitData reads
    the rank from the process group (which must be set up, as Lightning does before `setup`)."""
    from litdata import ParallelStreamingDataset, StreamingDataLoader, StreamingDataset, TokensLoader

    total_rows = batch_size * world_size
    per_row = blocks_per_row(tokens, seq_len, total_rows)
    if per_row < 1:
        raise ValueError(
            f"{tokens} tokens are too few for batch_size={batch_size} x world_size={world_size} streams of "
            f"seq_len={seq_len}: it needs at least {(total_rows + 1) * seq_len}"
        )
    blocks = StreamingDataset(
        input_dir, cache_dir=cache_dir, max_cache_size=max_cache_size, item_loader=TokensLoader(block_size=seq_len)
    )
    rows, following = [], []
    for row in range(batch_size):
        # the streams row*world_size .. row*world_size + world_size - 1 (one per rank, in rank order)
        first = row * world_size * per_row
        rows.append(blocks.subset(slice(first, first + world_size * per_row)))
        following.append(blocks.subset(slice(first + 1, first + world_size * per_row + 1)))
    windows = ParallelStreamingDataset([*rows, *following], transform=_rows_of)
    return StreamingDataLoader(windows, batch_size=1, num_workers=num_workers, collate_fn=_unwrap)
