"""The multi-node launch in docs/distributed.md works as written: two `torchrun` "nodes" on
127.0.0.1 (one process each) train exactly like `trainer=ddp_cpu` (two processes started by
Lightning).

`threads=1` gives every process the same thread count under both launchers (torchrun sets
nothing for one process per node, Lightning's launcher splits the cores), so the per-step
losses are equal bit for bit.
"""

from __future__ import annotations

import json
import socket
import sys

import pytest
from helpers.distributed_fits import TINY_DDP_FIT, finish, fit_command, start, step_losses

MAX_STEPS = 12
COMMON = [f"trainer.max_steps={MAX_STEPS}", "threads=1"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_two_torchrun_nodes_match_ddp_cpu(tmp_path):
    # No OMP_NUM_THREADS from the test: the `threads` setting alone decides.
    reference = tmp_path / "ddp_cpu"
    ended = finish(start(reference, *COMMON, one_thread=False), timeout=240)
    assert ended.returncode == 0, ended.stdout[-3000:]

    nodes_dir, port = tmp_path / "two_nodes", free_port()
    fit_overrides = fit_command(nodes_dir, *COMMON, "trainer.devices=1", "trainer.num_nodes=2")[3:]
    assert fit_overrides[:2] == ["fit", f"hydra.run.dir={nodes_dir}"] and "trainer=ddp_cpu" in TINY_DDP_FIT
    nodes = [
        start(
            nodes_dir,
            log=tmp_path / f"node{rank}.out",
            command=[
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "-m",
                "sru_lightning",
                *fit_overrides,
            ],
            one_thread=False,
        )
        for rank in (0, 1)
    ]
    results = [finish(node, timeout=240) for node in nodes]
    for rank, result in enumerate(results):
        assert result.returncode == 0, f"node {rank}:\n{result.stdout[-3000:]}"
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in results[1].stdout

    expected, got = step_losses(reference), step_losses(nodes_dir)
    assert sorted(expected) == sorted(got) == list(range(MAX_STEPS))
    differing = {step: (got[step], expected[step]) for step in expected if got[step] != expected[step]}
    assert not differing, f"{len(differing)} of {MAX_STEPS} steps differ: {differing}"


@pytest.mark.slow
def test_a_node_that_never_starts_is_named_in_one_line(tmp_path, monkeypatch):
    # Node 0 of two, and no node 1: rank 0 waits for it `trainer.strategy.timeout` (here 5 s,
    # Lightning's default is 30 min), then says how many processes joined and what to start.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("NODE_RANK", "0")
    run_dir = tmp_path / "alone"
    ended = finish(
        start(
            run_dir,
            "trainer.devices=1",
            "trainer.num_nodes=2",
            "+trainer.strategy.timeout._target_=datetime.timedelta",
            "+trainer.strategy.timeout.seconds=5",
        ),
        timeout=120,
    )
    assert ended.returncode == 1, ended.stdout[-3000:]
    assert "Traceback" not in ended.stdout
    said = [line for line in ended.stdout.splitlines() if ": error: " in line]
    assert len(said) == 1 and "did not all start: 1 of 2 joined within" in said[0], ended.stdout[-3000:]
    assert "trainer.num_nodes=2, start the same command on every node" in said[0]
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("the processes of this run did not all start")
