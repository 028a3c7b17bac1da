"""Which cgroup hierarchy an emulated host's CPU share goes through, and what is written
there, on fake hierarchies: a directory laid out as v1's cpu controller or as v2's unified
root. The machine's own hierarchy is exercised for real by test_cluster (as root); these run
anywhere, so v2 is checked on a machine that has only v1 and the other way round."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from polyrhythm.errors import ClusterError
from polyrhythm.launch.cluster import cgroups
from polyrhythm.launch.cluster.cgroups import CpuGroup, hierarchy, quota_files


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Point both hierarchies at empty directories; each test lays out what it needs."""
    v1, v2 = tmp_path / "cpu", tmp_path / "unified"
    v1.mkdir()
    v2.mkdir()
    monkeypatch.setattr(cgroups, "V1", v1)
    monkeypatch.setattr(cgroups, "V2", v2)
    return v1, v2


def _v1(root: Path) -> None:
    (root / "cpu.cfs_quota_us").write_text("-1\n")


def _v2(root: Path, controllers: str = "cpuset cpu io memory pids") -> None:
    (root / "cgroup.controllers").write_text(controllers + "\n")


def test_quota_files_in_each_version():
    assert list(quota_files(1, 0.5).items()) == [("cpu.cfs_period_us", "100000"),
                                                 ("cpu.cfs_quota_us", "50000")]
    assert quota_files(2, 0.5) == {"cpu.max": "50000 100000"}
    assert quota_files(2, 2.25) == {"cpu.max": "225000 100000"}
    assert quota_files(1, 0.0001)["cpu.cfs_quota_us"] == "1000"  # the kernel's least
    assert quota_files(2, 0.0001) == {"cpu.max": "1000 100000"}


def test_v1_is_used_where_mounted_even_beside_a_v2_with_cpu(fake):
    v1, v2 = fake
    _v1(v1)
    _v2(v2)
    assert hierarchy() == (v1 / "polyrhythm", 1)


def test_v2_is_used_where_it_has_the_cpu_controller_and_v1_has_none(fake):
    _, v2 = fake
    _v2(v2)
    assert hierarchy() == (v2 / "polyrhythm", 2)


@pytest.mark.parametrize("controllers", [None, "cpuset io memory pids"], ids=[
    "no-v2", "v2-without-cpu"])  # cpuset is not cpu
def test_no_cpu_controller_anywhere_is_one_clear_line(fake, controllers):
    _, v2 = fake
    if controllers is not None:
        _v2(v2, controllers)
    with pytest.raises(ClusterError) as info:
        hierarchy()
    message = str(info.value)
    assert "\n" not in message and "no cgroup CPU controller" in message
    assert cgroups.ours() == []  # listing what is ours finds nothing, and says nothing


def test_a_v2_host_gets_cpu_max_and_every_group_above_it_the_controller(fake):
    _, v2 = fake
    _v2(v2)
    host = CpuGroup("clu", "h0").create(0.5)
    run = CpuGroup("clu", "h0", "run1").create()
    ours = v2 / "polyrhythm"
    assert host.version == 2 and host.path == ours / "clu" / "h0"
    assert run.path == host.path / "run1"
    assert (host.path / "cpu.max").read_text() == "50000 100000"
    # Each group from the root down to the host's passes cpu on; the run's group (a leaf,
    # where the processes go) neither passes it on nor has a quota of its own.
    enabled = sorted(str(p.parent.relative_to(v2)) for p in v2.rglob("cgroup.subtree_control"))
    assert enabled == [".", "polyrhythm", "polyrhythm/clu", "polyrhythm/clu/h0"]
    assert all(p.read_text() == "+cpu" for p in v2.rglob("cgroup.subtree_control"))
    assert list(run.path.iterdir()) == []
    assert list(v2.rglob("cpu.cfs_*")) == []
    assert cgroups.ours() == [str(ours), str(ours / "clu"), str(ours / "clu" / "h0"),
                              str(ours / "clu" / "h0" / "run1")]


def test_a_v1_host_gets_period_and_quota_and_no_v2_files(fake):
    v1, _ = fake
    _v1(v1)
    host = CpuGroup("clu", "h1").create(1.5)
    run = CpuGroup("clu", "h1", "run1").create()
    assert host.version == 1 and host.path == v1 / "polyrhythm" / "clu" / "h1"
    assert (host.path / "cpu.cfs_period_us").read_text() == "100000"
    assert (host.path / "cpu.cfs_quota_us").read_text() == "150000"
    assert list(run.path.iterdir()) == []
    assert list(v1.rglob("cgroup.subtree_control")) == list(v1.rglob("cpu.max")) == []


def test_a_v2_group_that_holds_processes_refuses_with_the_reason(fake, monkeypatch):
    """In a container the unified root holds the container's processes, and the kernel
    answers EBUSY to passing a controller on from it."""
    _, v2 = fake
    _v2(v2)
    write_text = Path.write_text

    def busy_at_the_root(path, text, *args, **kwargs):
        if path == v2 / "cgroup.subtree_control":
            raise OSError(errno.EBUSY, "Device or resource busy")
        return write_text(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", busy_at_the_root)
    with pytest.raises(ClusterError) as info:
        CpuGroup("clu", "h0").create(0.5)
    message = str(info.value)
    assert "\n" not in message
    assert f"cannot enable the cpu controller below cgroup {v2}: it holds processes" in message
    assert not (v2 / "polyrhythm" / "clu").exists()  # nothing made below the refusal
