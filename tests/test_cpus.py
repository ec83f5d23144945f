"""Worker count from cgroup v1/v2 quotas and the affinity mask, on fake cgroup trees."""
import pytest

from shoal_common.cpus import available_cpus, cgroup_cpu_limit, web_concurrency


def tree(tmp_path, proc_cgroup, files):
    (tmp_path / "proc").write_text(proc_cgroup)
    for name, text in files.items():
        path = tmp_path / "cg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"root": tmp_path / "cg", "proc_cgroup": tmp_path / "proc"}


def test_cgroup_v2_quota_of_the_process_own_group(tmp_path):
    probe = tree(tmp_path, "0::/kubepods/pod1\n", {"kubepods/pod1/cpu.max": "150000 100000\n", "cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit(**probe) == 1.5
    assert available_cpus(affinity=16, **probe) == 2


def test_cgroup_v2_without_a_limit_uses_the_affinity_mask(tmp_path):
    probe = tree(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert available_cpus(affinity=3, **probe) == 3


def test_cgroup_v1_quota(tmp_path):
    probe = tree(tmp_path, "2:cpu,cpuacct:/docker/abc\n0::/\n",
                 {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_limit(**probe) == 0.5
    assert available_cpus(affinity=8, **probe) == 1


def test_cgroup_v1_unlimited(tmp_path):
    probe = tree(tmp_path, "2:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert available_cpus(affinity=4, **probe) == 4


def test_affinity_caps_a_larger_quota(tmp_path):
    probe = tree(tmp_path, "0::/\n", {"cpu.max": "800000 100000\n"})
    assert available_cpus(affinity=2, **probe) == 2


def test_web_concurrency_overrides_and_is_validated(tmp_path):
    probe = tree(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert web_concurrency({"WEB_CONCURRENCY": "5"}, **probe) == 5
    assert web_concurrency({}, affinity=3, **probe) == 3
    with pytest.raises(ValueError, match="WEB_CONCURRENCY='two'"):
        web_concurrency({"WEB_CONCURRENCY": "two"}, **probe)
    with pytest.raises(ValueError, match="positive"):
        web_concurrency({"WEB_CONCURRENCY": "0"}, **probe)
