"""`aicirt.integrations.vllm_dp`'s pieces that need no vLLM: each rank's cores and devices, and the
ranks' metrics merged into one Prometheus text. (The ranks themselves: test_vllm_engine_dp.py.)"""
from __future__ import annotations

import pytest

from aicirt.integrations.vllm_dp import merge_metrics, rank_binds, rank_env


def test_each_rank_gets_its_own_cores(monkeypatch):
    monkeypatch.delenv("AICIRT_VLLM_DP_BIND", raising=False)
    assert rank_binds(2, 1, cpus=[0, 1]) == ["0", "1"]
    assert rank_binds(2, 2, cpus=list(range(8))) == ["0-1|2-3", "4-5|6-7"]
    assert rank_binds(2, 1, cpus=[0, 2, 4, 6]) == ["0,2", "4,6"]         # not consecutive: listed
    assert rank_binds(2, 1, cpus=[0, 1, 2]) == ["0", "1"]                # equal shares; the rest idle
    with pytest.raises(ValueError, match="needs 4 CPUs"):
        rank_binds(2, 2, cpus=[0, 1])


def test_binds_can_be_given(monkeypatch):
    monkeypatch.setenv("AICIRT_VLLM_DP_BIND", "0-3|4-7; 8-11|12-15")
    assert rank_binds(2, 2, cpus=[0]) == ["0-3|4-7", "8-11|12-15"]
    with pytest.raises(ValueError, match="want 3 binds"):
        rank_binds(3, 2)


def test_each_rank_sees_its_share_of_the_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert rank_env(1, 2, 2, "0")["CUDA_VISIBLE_DEVICES"] == "6,7"
    env = rank_env(0, 2, 1, "3")
    assert env["CUDA_VISIBLE_DEVICES"] == "4" and env["VLLM_CPU_OMP_THREADS_BIND"] == "3"
    assert env["AICIRT_VLLM_DP_RANK"] == "0"
    with pytest.raises(ValueError, match="need 6"):
        rank_env(0, 3, 2, "0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "CUDA_VISIBLE_DEVICES" not in rank_env(0, 2, 1, "0")


def test_metrics_of_every_rank_in_one_text():
    def text(ok: float, steps: int) -> str:
        return ("# HELP aicirt_requests_total Generation requests.\n# TYPE aicirt_requests_total counter\n"
                f'aicirt_requests_total{{outcome="ok"}} {ok}\n'
                "# HELP aicirt_step_seconds Wall time.\n# TYPE aicirt_step_seconds summary\n"
                f"aicirt_step_seconds_sum 1.5\naicirt_step_seconds_count {steps}\n"
                "# HELP aicirt_queue_depth Waiting.\n# TYPE aicirt_queue_depth gauge\naicirt_queue_depth 0.0\n")

    out = merge_metrics([text(3.0, 7), text(5.0, 9)],
                        {"aicirt_dp_requests_total": ("counter", "Routed.", {0: 3, 1: 5})})
    lines = out.splitlines()
    assert lines[:4] == ["# HELP aicirt_requests_total Generation requests.", "# TYPE aicirt_requests_total counter",
                         'aicirt_requests_total{rank="0",outcome="ok"} 3.0',
                         'aicirt_requests_total{rank="1",outcome="ok"} 5.0']
    assert 'aicirt_step_seconds_count{rank="1"} 9' in lines and 'aicirt_queue_depth{rank="0"} 0.0' in lines
    assert lines.count("# TYPE aicirt_step_seconds summary") == 1
    # a metric's samples stay together, after its HELP and TYPE
    at = lines.index("# TYPE aicirt_step_seconds summary")
    assert lines[at + 1:at + 5] == ['aicirt_step_seconds_sum{rank="0"} 1.5', 'aicirt_step_seconds_count{rank="0"} 7',
                                    'aicirt_step_seconds_sum{rank="1"} 1.5', 'aicirt_step_seconds_count{rank="1"} 9']
    assert lines[-4:] == ["# HELP aicirt_dp_requests_total Routed.", "# TYPE aicirt_dp_requests_total counter",
                          'aicirt_dp_requests_total{rank="0"} 3.0', 'aicirt_dp_requests_total{rank="1"} 5.0']
