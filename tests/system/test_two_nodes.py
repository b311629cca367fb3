"""Two torchrun agents, as on two nodes: ``torchrun --nnodes=2 --nproc_per_node=1`` twice on
this machine, joined by a c10d rendezvous on 127.0.0.1 (gloo, loopback only).

- they train FSDP2 to the per-step losses of one agent running both processes;
- a SIGKILL of one agent's worker, under ``--max-restarts=1``, restarts the workers of both
  agents, which resume from the sharded checkpoint and end with the uninterrupted losses.

Both agents share ``train.out_dir`` and ``data.cache_dir``, as nodes share a filesystem.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import fault_runs
import pytest
from fault_runs import (
    args,
    assert_same_losses,
    checkpoint_steps,
    children,
    environ,
    finish,
    last_losses,
    launched,
    max_step,
    needs_proc,
    read_log,
    torchrun_cmd,
    wait_until,
)
from gloo import free_port

# the fault tests' fixtures: the corpus, its data cache, one intra-op thread (autouse)
text_file, cache, one_thread = fault_runs.text_file, fault_runs.cache, fault_runs.one_thread

STEPS, EVERY = 16, 4

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def fsdp_args(out_dir: Path, cache: Path, text_file: Path) -> list[str]:
    return args(
        out_dir, cache, text_file, f"train.steps={STEPS}", f"train.checkpoint_every={EVERY}", "train.parallel=fsdp"
    )


def agent_cmd(port: int, *train_args: str, max_restarts: int = 0) -> list[str]:
    """One of the two agents: one worker, the rendezvous and the workers' store on 127.0.0.1."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=two-nodes",
        "--local-addr=127.0.0.1",
        "--monitor-interval=0.5",
        f"--max-restarts={max_restarts}",
        "-m",
        "recipes.train",
        *train_args,
    ]


@pytest.fixture(autouse=True)
def loopback(monkeypatch):
    """gloo binds to the loopback interface, whatever the host name resolves to; each rendezvous
    round gets a store of its own, as on several nodes (see spherenet.train.distributed)."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


@pytest.fixture(scope="module")
def one_agent(tmp_path_factory, cache, text_file) -> dict[int, float]:
    """Per-step losses of the job as one agent running 2 processes."""
    out = tmp_path_factory.mktemp("one_agent")
    log = out / "torchrun.log"
    with launched(torchrun_cmd(2, *fsdp_args(out / "run", cache, text_file)), log) as proc:
        text = finish(proc, log)
    assert proc.returncode == 0, text[-3000:]
    losses = last_losses(out / "run")
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def test_two_agents_train_fsdp_to_the_losses_of_one(tmp_path, cache, text_file, one_agent):
    out, port = tmp_path / "run", free_port()
    logs = [tmp_path / "agent0.log", tmp_path / "agent1.log"]
    run_two_agents(agent_cmd(port, *fsdp_args(out, cache, text_file)), logs)
    records = read_log(out)
    assert [r for r in records if r.get("event") == "start"][0]["world_size"] == 2
    assert_same_losses(last_losses(out), one_agent)


def run_two_agents(cmd: list[str], logs: list[Path]) -> list[str]:
    with launched(cmd, logs[0]) as first, launched(cmd, logs[1]) as second:
        texts = [finish(first, logs[0]), finish(second, logs[1])]
    assert (first.returncode, second.returncode) == (0, 0), "\n".join(t[-3000:] for t in texts)
    return texts


@needs_proc
def test_sigkill_of_one_agents_worker_restarts_both_and_resumes_exactly(tmp_path, cache, text_file, one_agent):
    """A job begun afresh (no --resume): one agent's worker is SIGKILLed past the first
    checkpoint; that agent restarts its worker, the other agent sees the new rendezvous round and
    restarts its own, and the new group resumes from the newest checkpoint with the
    uninterrupted losses. torchrun counts a restart only on the agent whose worker failed (the
    other worker sees TORCHELASTIC_RESTART_COUNT=0): the run records which job's agents wrote it,
    and that, not the count, makes the restart a continuation."""
    out = tmp_path / "run"
    logs = [tmp_path / "agent0.log", tmp_path / "agent1.log"]
    cmd = agent_cmd(free_port(), *fsdp_args(out, cache, text_file), max_restarts=1)
    with launched(cmd, logs[0]) as first, launched(cmd, logs[1]) as second:
        wait_until(lambda: checkpoint_steps(out) and max_step(out) >= EVERY + 1, first, logs[0],
                   f"step {EVERY + 1}")  # fmt: skip  # one call
        workers = {}
        for agent in (first, second):
            for pid in children(agent.pid):
                env = environ(pid)
                if "RANK" in env:
                    workers[env["RANK"]] = (agent, pid, env)
        assert sorted(workers) == ["0", "1"], workers
        assert {workers[r][0] for r in workers} == {first, second}, "one worker per agent"
        assert all(env["TORCHELASTIC_RESTART_COUNT"] == "0" for _, _, env in workers.values())
        os.kill(workers["1"][1], signal.SIGKILL)
        step_at_kill = max_step(out)
        texts = [finish(first, logs[0]), finish(second, logs[1])]
    assert (first.returncode, second.returncode) == (0, 0), "\n".join(t[-3000:] for t in texts)
    assert step_at_kill < STEPS, "the kill must land mid-run"
    starts = [r for r in read_log(out) if r.get("event") == "start"]
    assert [r["step"] for r in starts[:1]] == [0] and len(starts) == 2, "a fresh start, one restart"
    assert starts[1]["step"] % EVERY == 0 and starts[1]["step"] >= EVERY and starts[1]["world_size"] == 2
    assert_same_losses(last_losses(out), one_agent)
