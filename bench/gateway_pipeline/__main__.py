"""Benchmark the gateway's staged pipeline on synthetic stages with known times.

Two scenarios, each against a one-worker serial baseline (every stage has one worker, one session at a time)
measured in the same run:

* ``stages``: INIT, RUNNING and POSTRUN take fixed times (``asyncio.sleep``); throughput is compared with the
  capacity bound ``min(c_I/t_I, c_R/t_R, c_P/t_P)``.
* ``backend``: RUNNING sessions make model calls to a fake "GPU" with a fixed number of slots; the RUNNING
  stage has more slots than the GPU, so the GPU is the bottleneck and its utilisation is reported.

Run: ``.venv/bin/python -m bench.gateway_pipeline [--sessions N] [--serial-sessions N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time

from gateway.core import SessionPipeline
from gateway.models import EvaluatorConfig, HarnessConfig, PipelineConfig, SessionSpec
from gateway.testing import (
    FakeAgentRunner,
    FakeEvaluator,
    FakeProxy,
    FakeReconstructor,
    FakeRuntimeFactory,
)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Stage times (seconds) and worker counts of one configuration."""

    name: str
    init_s: float  # runtime start + harness prepare
    run_s: float  # agent think time, spread between calls
    calls: int
    call_s: float  # time one call holds the GPU
    postrun_s: float  # evaluation
    init_workers: int
    running_workers: int
    postrun_workers: int
    ready_capacity: int
    gpu_slots: int | None = None

    @property
    def t_run(self) -> float:
        """RUNNING time of one session without contention."""
        return self.run_s + self.calls * self.call_s

    @property
    def bound(self) -> float:
        """The capacity bound in sessions per second (the GPU's too, when there is one)."""
        rates = [
            self.init_workers / self.init_s,
            self.running_workers / self.t_run,
            self.postrun_workers / self.postrun_s,
        ]
        if self.gpu_slots is not None and self.calls:
            rates.append(self.gpu_slots / (self.calls * self.call_s))
        return min(rates)

    def serial(self) -> Workload:
        """The same work with one worker per stage and one READY place."""
        return dataclasses.replace(
            self, name=f"{self.name} (serial)", init_workers=1, running_workers=1, postrun_workers=1, ready_capacity=1
        )


@dataclasses.dataclass(frozen=True)
class Measurement:
    workload: Workload
    sessions: int
    wall_s: float
    resolved: int
    gpu_utilisation: float | None

    @property
    def throughput(self) -> float:
        return self.sessions / self.wall_s


async def measure(workload: Workload, sessions: int, *, serial_admission: bool = False) -> Measurement:
    """Run ``sessions`` through a pipeline configured by ``workload`` and time it."""
    config = PipelineConfig(
        max_sessions=1 if serial_admission else sessions + 1,
        init_workers=workload.init_workers,
        ready_capacity=workload.ready_capacity,
        running_workers=workload.running_workers,
        postrun_workers=workload.postrun_workers,
        postrun_backlog_limit=sessions + 1,
    )
    proxy = FakeProxy()
    gpu = asyncio.Semaphore(workload.gpu_slots) if workload.gpu_slots else None
    agents = FakeAgentRunner(
        proxy,
        prepare_s=workload.init_s / 2,
        run_s=workload.run_s,
        calls=workload.calls,
        backend=gpu,
        call_s=workload.call_s,
    )
    pipeline = SessionPipeline(
        config,
        gateway_id="bench",
        runtimes=FakeRuntimeFactory(start_s=workload.init_s / 2),
        agents=agents,
        proxy=proxy,
        reconstructor=FakeReconstructor(),
        evaluator=FakeEvaluator(evaluate_s=workload.postrun_s),
    )
    specs = [
        SessionSpec(
            session_id=f"s{i}",
            task_id="bench",
            harness=HarnessConfig("fake"),
            evaluator=EvaluatorConfig("fake"),
        )
        for i in range(sessions)
    ]
    started = time.monotonic()
    results = []
    if serial_admission:
        for spec in specs:
            await pipeline.start_session(spec)
            results.append(await pipeline.wait_done(spec.session_id))
    else:
        for spec in specs:
            await pipeline.start_session(spec)
        results = [await pipeline.wait_done(spec.session_id) for spec in specs]
    wall = time.monotonic() - started
    await pipeline.close()
    resolved = sum(1 for r in results if r.status.value == "resolved")
    utilisation = agents.backend_busy_s / (workload.gpu_slots * wall) if workload.gpu_slots else None
    return Measurement(workload, sessions, wall, resolved, utilisation)


def _row(cells: list[str], widths: list[int]) -> str:
    return (
        "| "
        + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        + " |"
    )


def print_table(rows: list[tuple[Measurement, Measurement]]) -> None:
    """Print one line per measurement with ratios to the bound and to the serial baseline."""
    header = [
        "configuration", "c_I/c_R/c_P", "GPU", "sessions", "wall s", "sessions/s", "bound/s", "of bound",
        "GPU util", "vs serial",
    ]  # fmt: skip
    lines = []
    for staged, serial in rows:
        for m in (serial, staged):
            w = m.workload
            lines.append(
                [
                    w.name,
                    f"{w.init_workers}/{w.running_workers}/{w.postrun_workers}",
                    str(w.gpu_slots or "-"),
                    str(m.sessions),
                    f"{m.wall_s:.2f}",
                    f"{m.throughput:.1f}",
                    f"{w.bound:.1f}",
                    f"{m.throughput / w.bound:.2f}",
                    f"{m.gpu_utilisation:.1%}" if m.gpu_utilisation is not None else "-",
                    f"{m.throughput / serial.throughput:.1f}x",
                ]
            )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    print(_row(header, widths))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        print(_row(line, widths))


async def amain(sessions: int, serial_sessions: int) -> list[tuple[Measurement, Measurement]]:
    """Run both scenarios and their serial baselines."""
    stages = Workload(
        "stages", init_s=0.02, run_s=0.1, calls=1, call_s=0.0, postrun_s=0.02,
        init_workers=2, running_workers=8, postrun_workers=2, ready_capacity=4,
    )  # fmt: skip
    backend = Workload(
        "backend", init_s=0.02, run_s=0.02, calls=4, call_s=0.02, postrun_s=0.02,
        init_workers=4, running_workers=16, postrun_workers=4, ready_capacity=8, gpu_slots=4,
    )  # fmt: skip
    rows = []
    for workload in (stages, backend):
        serial = await measure(workload.serial(), serial_sessions, serial_admission=True)
        staged = await measure(workload, sessions)
        rows.append((staged, serial))
    return rows


def main() -> None:
    """Parse arguments, run, print the table and the pass/fail lines."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=300, help="sessions per staged run")
    parser.add_argument("--serial-sessions", type=int, default=20, help="sessions per serial baseline")
    args = parser.parse_args()
    rows = asyncio.run(amain(args.sessions, args.serial_sessions))
    print_table(rows)
    (stages, _), (backend, _) = rows
    print()
    print(f"stages:  throughput / bound = {stages.throughput / stages.workload.bound:.2f} (target >= 0.90)")
    util = backend.gpu_utilisation or 0.0
    print(f"backend: GPU utilisation = {util:.1%} (target >= 90%)")


if __name__ == "__main__":
    main()
