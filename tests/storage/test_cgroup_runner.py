"""The measured-run helpers of ``storage.measure``: peak RSS read from outside, and a memory
cgroup that enforces its limit (the OOM killer) and is removed afterwards."""

import os
import sys

import pytest

from ooc_learn.storage.measure import (memory_cgroup_available, run_in_memory_cgroup,
                                       run_measured)

MiB = 1 << 20
CGROUP_OK, CGROUP_WHY = memory_cgroup_available()
needs_cgroup = pytest.mark.skipif(not CGROUP_OK, reason=f"no memory cgroup: {CGROUP_WHY}")


def allocating_child(mib):
    """A child that allocates ``mib`` MiB and touches every page, then prints JSON."""
    code = ("import sys\n"
            "b = bytearray(int(sys.argv[1]) << 20)\n"
            "for i in range(0, len(b), 4096):\n"
            "    b[i] = 1\n"
            "print('{\"done\": true}')")
    return [sys.executable, "-c", code, str(mib)]


def test_run_measured_reads_the_childs_peak_rss():
    r = run_measured(allocating_child(60), timeout=60)
    assert r["rc"] == 0, r["stderr"]
    # 60 MiB touched plus the interpreter (~10 MiB); the caller's memory stays out
    assert 55 * MiB <= r["peak_rss_bytes"] <= 200 * MiB
    assert r["stdout"].strip() == '{"done": true}'
    assert r["cgroup_peak_bytes"] is None and r["oom_kills"] == 0 and r["wall_s"] > 0


@needs_cgroup
def test_cgroup_run_within_its_limit():
    r = run_in_memory_cgroup(allocating_child(60), 1 << 30, drop_caches=False, timeout=60)
    assert r["rc"] == 0, r["stderr"]
    assert 55 * MiB <= r["peak_rss_bytes"] <= 200 * MiB
    assert r["cgroup_peak_bytes"] >= 55 * MiB
    assert r["oom_kills"] == 0 and not r["timed_out"]
    assert r["stdout"].strip() == '{"done": true}'
    assert r["cgroup_removed"] and not os.path.exists(r["cgroup"])


@needs_cgroup
def test_cgroup_run_over_its_limit_is_oom_killed_and_cleaned_up():
    r = run_in_memory_cgroup(allocating_child(300), 128 * MiB, drop_caches=False, timeout=60)
    assert r["rc"] == -9
    assert r["oom_kills"] >= 1 and not r["timed_out"]
    assert r["cgroup_removed"] and not os.path.exists(r["cgroup"])


@needs_cgroup
def test_cgroup_run_times_out_and_reports_it():
    r = run_in_memory_cgroup([sys.executable, "-c", "import time; time.sleep(30)"], 256 * MiB,
                             drop_caches=False, timeout=0.5)
    assert r["rc"] == -9 and r["timed_out"] and r["oom_kills"] == 0
    assert not os.path.exists(r["cgroup"])


@needs_cgroup
def test_memory_headroom_is_bounded_by_the_cgroups_limit():
    """What a first run's compile helper checks before it starts (it needs ~250 MiB)."""
    from ooc_learn.storage.measure import memory_headroom_bytes

    outside = memory_headroom_bytes()
    assert outside is not None and outside > 400 * MiB
    code = "from ooc_learn.storage.measure import memory_headroom_bytes as m; print(m())"
    r = run_in_memory_cgroup([sys.executable, "-c", code], 400 * MiB, drop_caches=False,
                             timeout=60)
    assert r["rc"] == 0, r["stderr"]
    assert 0 < int(r["stdout"].strip()) < 400 * MiB  # the limit less what the child uses
