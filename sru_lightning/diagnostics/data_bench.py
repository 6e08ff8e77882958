"""Benchmark of corpus preparation and of training from shards against the in-memory data.

``python -m sru_lightning bench data [sizes=30,300 repeats=20 warmup=5 out=FOLDER]``

For each corpus size (MB of text: the first 30 MB of the Python sources of the running
interpreter's site-packages, repeated as needed, so every size has the same characters and the
fits train the same model):

* `prepare` throughput at character level and with a BPE vocabulary of 4000 tokens (on the first
  ``bpe_mb`` MB: learning a byte-level BPE is about ten times slower than reading characters),
  the BPE figure also apart for learning the vocabulary and for encoding the text, and each per
  CPU-second of the preparing processes (what a loaded, shared machine changes least);
* a fit of the default model (conf/model/sru.yaml, batch 32 x 128) from the shards and, up to
  ``memory_mb`` MB, from the text in memory (`data=text`), each in a process of its own: its
  peak resident memory, the seconds from the process's start to its first training step (and
  apart, from the end of its imports: the part the data could change), and training tokens per
  second over ``repeats`` steps after ``warmup`` (two fits of each, interleaved: the highest
  peak, the shortest start and the best speed).

Memory is per process (it cannot be compared inside one): the peak resident memory of the fit's
own program (VmHWM, Linux). The fits run one after the other on the same machine, so their
ratios hold while its load holds.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sru_lightning.app.key_value import setting
from sru_lightning.diagnostics.tables import count_setting, fixed_width_lines, repeats_setting, warmup_setting

#: MB of distinct text in a generated corpus (a larger one repeats it).
DISTINCT_MB = 30
#: BPE vocabulary of the preparation timing.
BPE_VOCAB = 4000
#: Fits of each kind per corpus, interleaved: the table shows the highest peak memory, the
#: shortest time to the first step and the highest tokens/s of them.
ROUNDS = 2


@dataclass
class DataBenchConfig:
    sizes: str = setting("30,300", "comma-separated corpus sizes in MB")
    repeats: int = repeats_setting(20, "timed training steps of each fit")
    warmup: int = warmup_setting(5, "training steps before them")
    out: str = setting("", "folder for the corpora, shards and fits (kept); empty: a temporary folder")
    bpe_mb: int = count_setting(30, "MB of each corpus the BPE preparation is timed on")
    memory_mb: int = setting(300, "the in-memory fit runs for corpora up to this many MB", at_least=0)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"`sizes` must be comma-separated positive integers (MB), got {text!r}")
    return sizes


def write_corpus(path: Path, megabytes: int) -> Path:
    """`megabytes` MB (10^6 characters) of Python sources: the site-packages' files in sorted order
    up to :data:`DISTINCT_MB` MB, repeated. Every size has the same characters, so the fits of
    two sizes train the same model (a larger alphabet would widen its output layer)."""
    if path.is_file() and path.stat().st_size >= megabytes * 10**6:
        return path
    root = Path(sysconfig.get_paths()["purelib"])
    distinct, size = [], 0
    for file in sorted(root.rglob("*.py")):
        text = file.read_text(encoding="utf-8", errors="replace")[: DISTINCT_MB * 10**6 - size]
        distinct.append(text)
        size += len(text)
        if size >= DISTINCT_MB * 10**6:
            break
    block = "".join(distinct)
    written = 0
    with open(path, "w", encoding="utf-8") as handle:
        while written < megabytes * 10**6:
            text = block[: megabytes * 10**6 - written]
            handle.write(text)
            written += len(text)
    return path


def _cpu_seconds() -> float:
    """CPU seconds of this process (all its threads) and of its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def time_prepare(corpus: Path, out: Path, bpe: bool, limit_mb: int | None = None) -> dict[str, float]:
    """Speeds of preparing `corpus` (its first `limit_mb` MB with BPE), in MB of characters read:
    per second (`mb_s`) and per CPU-second (`mb_cpu_s`); with BPE also learning the vocabulary
    (MB of its sample per second) and encoding (MB of text per second) apart."""
    from sru_lightning.data import TextDataModule
    from sru_lightning.data.prepare import PrepareOptions, prepare_corpus
    from sru_lightning.data.sources import reading_of

    source = corpus
    if limit_mb is not None and corpus.stat().st_size > limit_mb * 10**6:
        source = corpus.with_name(f"{corpus.stem}-first{limit_mb}mb.txt")
        with open(corpus, encoding="utf-8") as handle:
            source.write_text(handle.read(limit_mb * 10**6), encoding="utf-8")
    settings = {"tokenizer": "bpe", "vocab_size": BPE_VOCAB} if bpe else {}
    module = TextDataModule(path=str(source), **settings)
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    prepared = prepare_corpus(
        reading_of(module),
        module.token_level,
        out,
        bpe_vocab_size=module.bpe_vocab_size,
        overwrite=True,
        options=PrepareOptions(progress=False),
    )
    seconds, cpu_seconds = time.perf_counter() - started, _cpu_seconds() - cpu_started
    megabytes = prepared.read_units / 1e6
    speeds = {"mb_s": megabytes / seconds, "mb_cpu_s": megabytes / cpu_seconds}
    if bpe:
        extra = prepared.extra
        speeds["learning_mb_s"] = extra["bpe_sample_chars"] / 1e6 / extra["learning_seconds"]
        speeds["encoding_mb_s"] = megabytes / extra["encoding_seconds"]
    return speeds


_CHILD = """
import json, sys, time
from pathlib import Path
from lightning.pytorch import Callback
from sru_lightning.app.runs.building import build
from sru_lightning.diagnostics.lm_bench import _compose

overrides, folder, warmup, repeats = json.loads(sys.argv[1])
imported = time.time()  # Python, torch, Lightning and the package loaded: what follows is the run's own start

class Clock(Callback):
    first = None
    def __init__(self):
        self.starts, self.ends = [], []
    def on_train_batch_start(self, trainer, module, batch, index):
        self.starts.append(time.time())
    def on_train_batch_end(self, trainer, module, outputs, batch, index):
        self.ends.append(time.time())

clock = Clock()
cfg = _compose(overrides, Path(folder))
trainer, model, datamodule, _ = build(cfg, "fit", Path(folder), overrides)
trainer.callbacks.append(clock)
trainer.fit(model, datamodule=datamodule)
timed = clock.ends[warmup + repeats - 1] - clock.ends[warmup - 1]
tokens = datamodule.batch_size * datamodule.seq_len * repeats
# VmHWM: this program's own peak (ru_maxrss would start from the launching process's, kept across exec)
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
result = {"first_step": clock.starts[0], "imported": imported, "tokens_per_s": tokens / timed, "peak_rss_kb": peak}
print(json.dumps(result))
"""


def time_fit(data: list[str], folder: Path, warmup: int, repeats: int) -> dict[str, float]:
    """Peak RSS (MiB), seconds from process start to the first step, tokens/s of a fit in a new process."""
    overrides = [
        *data,
        f"trainer.max_steps={warmup + repeats}",
        "trainer.max_epochs=-1",
        "trainer.limit_val_batches=1",
        "trainer.num_sanity_val_steps=0",
        "logger=none",
        "callbacks.rich_progress_bar=null",
        "+trainer.enable_checkpointing=false",
    ]
    started = time.time()
    completed = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps([overrides, str(folder), warmup, repeats])],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    if completed.returncode != 0:
        raise RuntimeError(f"the timed fit {data} failed: {completed.stderr[-2000:]}")
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    return {
        "peak_rss_mib": result["peak_rss_kb"] / 1024,
        "first_step_s": result["first_step"] - started,
        "setup_s": result["first_step"] - result["imported"],
        "tokens_per_s": result["tokens_per_s"],
    }


def run_data_benchmark(config: DataBenchConfig) -> list[dict]:
    sizes = parse_sizes(config.sizes)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-data-") as scratch:
        root = Path(config.out or scratch)
        root.mkdir(parents=True, exist_ok=True)
        for size in sizes:
            corpus = write_corpus(root / f"corpus-{size}mb.txt", size)
            shards = root / f"shards-{size}mb"
            char = time_prepare(corpus, shards, bpe=False)
            bpe = time_prepare(corpus, root / f"bpe-{size}mb", bpe=True, limit_mb=config.bpe_mb)
            row = {
                "size_mb": size,
                "prepare_char_mb_s": char["mb_s"],
                "prepare_char_mb_cpu_s": char["mb_cpu_s"],
                "prepare_bpe_mb_s": bpe["mb_s"],
                "prepare_bpe_mb_cpu_s": bpe["mb_cpu_s"],
                "bpe_learning_mb_s": bpe["learning_mb_s"],
                "bpe_encoding_mb_s": bpe["encoding_mb_s"],
                "bpe_mb": min(size, config.bpe_mb),
            }
            paths = {"shards": ["data=shards", f"data.path={shards}"]}
            if size <= config.memory_mb:
                paths["memory"] = ["data=text", f"data.path={corpus}"]
            fits: dict[str, list[dict[str, float]]] = {path: [] for path in paths}
            for number in range(ROUNDS):  # interleaved: a change of the machine's load hits both
                for path, data in paths.items():
                    folder = root / f"fit-{path}-{size}-{number}"
                    fits[path].append(time_fit(data, folder, config.warmup, config.repeats))
            for path, results in fits.items():
                row[path] = {
                    "peak_rss_mib": max(result["peak_rss_mib"] for result in results),
                    "first_step_s": min(result["first_step_s"] for result in results),
                    "setup_s": min(result["setup_s"] for result in results),
                    "tokens_per_s": max(result["tokens_per_s"] for result in results),
                }
            rows.append(row)
    return rows


def format_table(config: DataBenchConfig, rows: list[dict]) -> str:
    header = ["corpus", "prepare char", "prepare BPE", "data", "peak RSS", "to 1st step", "tokens/s"]
    lines = []
    for row in rows:
        prepare = [
            f"{row['size_mb']} MB",
            f"{row['prepare_char_mb_s']:.1f} MB/s",
            f"{row['prepare_bpe_mb_s']:.2f} MB/s ({row['bpe_mb']} MB)",
        ]
        for path in ("shards", "memory"):
            if path not in row:
                continue
            fit = row[path]
            data = "shards" if path == "shards" else "in memory"
            lines.append(
                [
                    *prepare,
                    data,
                    f"{fit['peak_rss_mib']:.0f} MiB",
                    f"{fit['first_step_s']:.1f} s",
                    f"{fit['tokens_per_s']:.0f}",
                ]
            )
            prepare = ["", "", ""]
    widths = ["<8", "<15", "<21", "<11", ">10", ">13", ">10"]
    text = "\n".join(fixed_width_lines(list(zip(header, widths)), lines))
    notes = [
        f"{row['size_mb']} MB: prepare char {row['prepare_char_mb_cpu_s']:.1f} MB per CPU-second; BPE on "
        f"{row['bpe_mb']} MB {row['prepare_bpe_mb_cpu_s']:.2f} MB per CPU-second, learning the vocabulary "
        f"{row['bpe_learning_mb_s']:.2f} MB/s, encoding {row['bpe_encoding_mb_s']:.2f} MB/s"
        for row in rows
    ]
    base = rows[0]
    for row in rows[1:]:
        ratio = row["shards"]["peak_rss_mib"] / base["shards"]["peak_rss_mib"]
        start = row["shards"]["first_step_s"] / base["shards"]["first_step_s"]
        setup = row["shards"]["setup_s"] / base["shards"]["setup_s"]
        sizes = f"{row['size_mb']} MB vs {base['size_mb']} MB"
        notes.append(
            f"shards, {sizes}: peak RSS x{ratio:.2f}, time to first step x{start:.2f} (after the imports: "
            f"{row['shards']['setup_s']:.2f} s vs {base['shards']['setup_s']:.2f} s, x{setup:.2f})"
        )
    for row in rows:
        if "memory" in row:
            ratio = row["shards"]["tokens_per_s"] / row["memory"]["tokens_per_s"]
            notes.append(f"{row['size_mb']} MB: tokens/s from shards / in memory = {ratio:.3f}")
    return text + ("\n" + "\n".join(notes) if notes else "")
