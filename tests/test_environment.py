"""Records name the processor, not just its architecture."""
from __future__ import annotations

from vitbench.host import environment


def test_the_cpu_is_named_by_its_model_and_cores(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6148\n")
    monkeypatch.setattr(environment, "CPUINFO", info)
    monkeypatch.setattr(environment.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert environment.device_name("cpu") == "Intel(R) Xeon(R) Gold 6148, 2 cores"


def test_without_cpuinfo_the_architecture_is_the_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "CPUINFO", tmp_path / "missing")
    monkeypatch.setattr(environment.sys, "platform", "linux")
    monkeypatch.setattr(environment.platform, "processor", lambda: "x86_64")
    assert environment.cpu_model() == "x86_64"
