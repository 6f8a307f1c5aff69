"""The shared-memory gradient sum (parallel.grad_reduce=host) between real processes: every rank gets the
rank-order float32 sum of every rank's vector at every step (the double buffer reused many times), a wrong
length is refused, a segment larger than /dev/shm's free space is refused before anything is written, and
a rank that never arrives ends the wait with a one-line error."""
import multiprocessing as mp
import os
import secrets

import numpy as np
import pytest

from mindgr.parallel import host_sum

pytestmark = pytest.mark.skipif(host_sum.supported() is not None, reason=str(host_sum.supported()))

N, STEPS = 1001, 40


def _draw(step: int, rank: int) -> np.ndarray:
    return np.random.default_rng([step, rank]).standard_normal(N).astype(np.float32)


def _rank(path, rank, world, out):
    hs = host_sum.HostSum(path, rank, world, N, create=False, timeout=20)
    got = []
    for step in range(STEPS):
        hs.slot()[:] = _draw(step, rank)
        got.append(hs.sum())
    np.save(out, np.stack(got))
    hs.close()


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_the_rank_order_sum(tmp_path, world):
    path = host_sum.segment_path(secrets.randbits(31))
    owner = host_sum.HostSum(path, 0, world, N, create=True, timeout=20)
    try:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_rank, args=(path, r, world, tmp_path / f"r{r}.npy")) for r in range(1, world)]
        for p in procs:
            p.start()
        mine = []
        for step in range(STEPS):
            owner.slot()[:] = _draw(step, 0)
            mine.append(owner.sum())
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    finally:
        owner.unlink()
    assert not os.path.exists(path)
    want = np.stack([sum((_draw(s, r) for r in range(1, world)), _draw(s, 0)) for s in range(STEPS)])
    assert np.array_equal(np.stack(mine), want)          # rank order, float32: bit for bit
    for r in range(1, world):
        assert np.array_equal(np.load(tmp_path / f"r{r}.npy"), want)


def test_a_wrong_length_and_a_missing_rank_are_one_line_errors():
    path = host_sum.segment_path(secrets.randbits(31))
    owner = host_sum.HostSum(path, 0, 2, N, create=True, timeout=0.2)
    try:
        with pytest.raises(ValueError, match="disagree on the vector's length"):
            host_sum.HostSum(path, 1, 2, N + 1, create=False)
        owner.slot()[:] = 1.0
        with pytest.raises(TimeoutError) as e:
            owner.sum()                                  # rank 1 never writes
        assert "rank(s) [1] did not arrive" in str(e.value) and "\n" not in str(e.value)
    finally:
        owner.unlink()
        owner.close()


def test_a_segment_larger_than_the_free_shared_memory_is_refused_up_front():
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    path = host_sum.segment_path(secrets.randbits(31))
    with pytest.raises(OSError) as e:
        host_sum.HostSum(path, 0, 2, free // 8 + 1024, create=True)      # 2 x 2 slots of 4-byte floats
    assert "MiB free" in str(e.value) and "\n" not in str(e.value)
    assert not os.path.exists(path)
