"""When a server launches the next decode step (common/engine/launch_clock.py): just before the one in flight ends."""
from __future__ import annotations

import pytest

from common.engine.device import mps_client
from common.engine.in_flight import InFlight
from common.engine.launch_clock import LaunchClock
from common.engine.llm import LLM
from common.sampling_params import SamplingParams

MS = 1e-3


def learned(step_ms: float = 5.0, prep_ms: float = 0.3, contended: bool = False) -> LaunchClock:
    clock = LaunchClock(contended=contended)
    clock.launched(prep_ms * MS)
    clock.collected(step_ms * MS, decode_only=True)
    return clock


def test_next_launch_is_due_one_step_after_the_last_began_less_the_lead():
    clock = learned()
    clock.in_flight(started=100.0, decode_only=True)
    lead = 1.25 * 0.3 * MS + 0.1 * 5 * MS  # a quarter more than the host's launch work, a tenth of the step
    assert clock.deadline == pytest.approx(100.0 + 5 * MS - lead)
    assert clock.delay(100.0 + 1 * MS) == pytest.approx(5 * MS - lead - 1 * MS)
    assert clock.delay(100.0 + 10 * MS) == 0.0  # overdue: launch now


def test_a_host_as_slow_as_the_step_never_waits():
    clock = learned(step_ms=1.3, prep_ms=1.0)
    clock.in_flight(started=100.0, decode_only=True)
    assert clock.delay(100.0) == 0.0


def test_unknown_steps_launch_at_once():
    assert LaunchClock().delay(0.0) == 0.0  # nothing learned yet
    clock = learned()
    clock.in_flight(started=100.0, decode_only=False)  # a prefill in flight: no estimate of its length
    assert clock.delay(100.0) == 0.0
    clock.in_flight(started=None, decode_only=True)  # nothing in flight
    assert clock.delay(100.0) == 0.0
    no_gpu_times = LaunchClock()
    no_gpu_times.launched(0.3 * MS)
    no_gpu_times.collected(None, decode_only=True)  # CPU: no device timings
    no_gpu_times.in_flight(started=100.0, decode_only=True)
    assert no_gpu_times.delay(100.0) == 0.0


def test_prefill_steps_do_not_stretch_the_decode_estimate():
    clock = learned(step_ms=5.0)
    clock.collected(40 * MS, decode_only=False)  # a long prefill would make the next decode launch late
    assert clock.step_s == pytest.approx(5 * MS)
    clock.collected(6 * MS, decode_only=True)
    assert 5 * MS < clock.step_s < 6 * MS  # slower steps move it by an average


def test_in_an_mps_client_a_faster_step_sets_the_estimate_at_once():
    """Decode steps beside another engine's long prompt on a GPU shared through MPS take about three times their time
    alone. Once the prompt ends, an average that fell slowly from them had the server wait for steps that long: the
    GPU idle for a dozen steps. Time-sliced (no MPS), the average holds."""
    for contended in (True, False):
        clock = learned(step_ms=2.0, contended=contended)
        for _ in range(6):
            clock.collected(6 * MS, decode_only=True)  # beside the prompt
        clock.collected(2 * MS, decode_only=True)  # the prompt ended
        clock.in_flight(started=100.0, decode_only=True)
        if contended:
            assert clock.step_s == pytest.approx(2 * MS)
            assert clock.delay(100.0 + 2 * MS) == 0.0  # due before a 2 ms step ends, not a 6 ms one
        else:
            assert 4 * MS < clock.step_s < 6 * MS
            assert clock.delay(100.0 + 2 * MS) > 0.0


class StepEnd:
    """A CPU stand-in for a step's CUDA events: done once waited for, and timed `gpu_ms` on the GPU."""

    def __init__(self, gpu_ms: float):
        self.gpu_ms, self.done = gpu_ms, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: StepEnd) -> float:
        return end.gpu_ms


@pytest.mark.parametrize("mps", [True, False], ids=["mps-client", "time-sliced"])
def test_in_an_mps_client_a_finished_step_launches_the_next_however_late_the_clock_said(tiny_qwen3_dir, monkeypatch,
                                                                                         mps):
    ends: list[StepEnd] = []

    def start(tokens, started=None):
        ends.append(StepEnd(gpu_ms=5000.0))  # each step took 5 s on the "GPU" (far more than the CPU's launches)
        return InFlight(tokens.clone(), ends[-1], ends[-1])

    monkeypatch.setattr(InFlight, "start", staticmethod(start))
    if mps:
        monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/no-mps-server-here")
    else:
        monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    mps_client.cache_clear()
    llm = LLM(str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20)
    try:
        engine = llm.engine
        assert engine.clock.contended == mps
        engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        for _ in range(3):
            engine.step()
        assert engine.clock.step_s == pytest.approx(5.0)
        assert engine.launch_delay() > 1.0  # the clock waits for the step in flight
        ends[-1].done = True  # which ends sooner than the clock said
        if mps:
            assert engine.early_launch_event() is ends[-1]
            assert engine.launch_delay() == 0.0
        else:
            assert engine.early_launch_event() is None
            assert engine.launch_delay() > 1.0
    finally:
        llm.close()
        mps_client.cache_clear()
