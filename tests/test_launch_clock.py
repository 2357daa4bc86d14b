"""When a server launches the next decode step (common/engine/launch_clock.py): just before the one in flight ends."""
from __future__ import annotations

import pytest

from common.engine.launch_clock import LaunchClock
from common.engine.llm import LLM
from common.sampling_params import SamplingParams

MS = 1e-3


def learned(step_ms: float = 5.0, prep_ms: float = 0.3) -> LaunchClock:
    clock = LaunchClock()
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
    assert 5 * MS < clock.step_s < 6 * MS  # an average that follows slowly changing steps


def test_an_engine_without_device_timings_never_delays(tiny_qwen3_dir):
    llm = LLM(str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20)
    try:
        llm.engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        for _ in range(3):
            llm.engine.step()
            assert llm.engine.launch_delay() == 0.0
    finally:
        llm.close()
