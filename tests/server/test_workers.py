"""The wire server's worker threads: which thread takes a call, what the awaiting coroutine
gets back, and what a shutdown runs."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dpsql.server.workers import WorkerPool


def _thread() -> int:
    return threading.get_ident()


def test_consecutive_calls_run_on_the_thread_that_idled_last() -> None:
    """A statement at a time (one client) keeps one thread busy, not each in turn: a
    thread-pool queue wakes the longest idle thread, whose memory has gone cold."""
    pool = WorkerPool(4)
    started = threading.Barrier(4)

    async def main() -> tuple[set[int], list[int]]:
        together = await asyncio.gather(*(pool.run(_wait_then_thread, started) for _ in range(4)))
        return set(together), [await pool.run(_thread) for _ in range(12)]

    try:
        threads, one_at_a_time = asyncio.run(main())
    finally:
        pool.shutdown()
    assert len(threads) == 4  # four threads were started and are idle
    assert len(set(one_at_a_time)) == 1 and one_at_a_time[0] in threads


def _wait_then_thread(barrier: threading.Barrier) -> int:
    barrier.wait(timeout=10)
    return _thread()


def test_results_and_errors_reach_the_awaiting_coroutine() -> None:
    pool = WorkerPool(2)

    async def main() -> None:
        assert await pool.run(sum, [1, 2, 3]) == 6
        with pytest.raises(ZeroDivisionError):
            await pool.run(divmod, 1, 0)

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()


def test_a_call_no_longer_awaited_still_runs_and_its_answer_is_dropped() -> None:
    """A cancel or timeout cancels the future, not the call (the Backend's Job stops a
    statement); the late answer must not be set on the cancelled future."""
    pool = WorkerPool(1)
    release, ran, errors = threading.Event(), threading.Event(), []

    def blocked() -> str:
        release.wait(timeout=10)
        ran.set()
        return "late"

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        future = pool.run(blocked)
        await asyncio.sleep(0.05)
        future.cancel()
        release.set()
        assert await pool.run(_thread)  # after the late answer: the one thread is free again

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    assert ran.is_set() and errors == []


@pytest.mark.parametrize("size", [1, 2])
def test_calls_beyond_the_threads_wait_in_order(size: int) -> None:
    pool = WorkerPool(size)
    release, order = threading.Event(), []

    def record(number: int) -> int:
        release.wait(timeout=10)
        order.append(number)
        return _thread()

    futures = [pool.submit(record, number) for number in range(8)]
    release.set()
    threads = {future.result(timeout=10) for future in futures}
    pool.shutdown()
    assert len(threads) == size
    if size == 1:
        assert order == list(range(8))


def test_an_answer_for_a_closed_loop_does_not_end_the_thread() -> None:
    """A statement still running when the server's loop has stopped: its worker lives on
    (the pool is shut down after the loop) and takes later calls."""
    pool = WorkerPool(1)
    release = threading.Event()

    async def start() -> None:
        pool.run(release.wait, 10)

    asyncio.run(start())  # the loop closes with the call still running
    release.set()
    try:
        assert pool.submit(_thread).result(timeout=10)
    finally:
        pool.shutdown()


def test_shutdown_drops_waiting_calls_and_waits_for_running_ones() -> None:
    pool = WorkerPool(1)
    release, finished = threading.Event(), threading.Event()

    def running() -> None:
        release.wait(timeout=10)
        finished.set()

    first = pool.submit(running)
    waiting = pool.submit(_thread)
    threading.Timer(0.1, release.set).start()
    pool.shutdown(wait=True, cancel_futures=True)
    assert finished.is_set() and first.done() and not waiting.done()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(_thread)


def test_shutdown_without_cancel_runs_the_waiting_calls() -> None:
    pool = WorkerPool(1)
    release = threading.Event()
    pool.submit(release.wait, 10)
    waiting = [pool.submit(_thread) for _ in range(3)]
    threading.Timer(0.1, release.set).start()
    pool.shutdown(wait=True)
    assert all(future.done() for future in waiting)


def test_a_submitted_call_cancelled_before_it_starts_never_runs() -> None:
    pool = WorkerPool(1)
    release, ran = threading.Event(), []
    blocker = pool.submit(release.wait, 10)
    later = pool.submit(ran.append, 1)
    assert later.cancel()
    release.set()
    blocker.result(timeout=10)
    pool.shutdown()
    assert ran == []
