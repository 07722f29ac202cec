"""cancel_and_wait: a task that survives one cancel (Python 3.11's wait_for drops a cancel that
lands with its inner result) is still stopped; one that never stops is reported, not awaited
forever. Real asyncio tasks, no fakes."""

from __future__ import annotations

import asyncio
import sys

import pytest

from tidegate.aio import cancel_and_wait


async def _loop_around_wait_for(wake: asyncio.Event, turns: list[int]) -> None:
    # the shape of the control plane's tick loop: wait for a wake or a period, then go on
    while True:
        try:
            await asyncio.wait_for(wake.wait(), 10)
        except TimeoutError:
            pass
        turns.append(1)
        wake.clear()
        await asyncio.sleep(0.01)


async def _ignores_one_cancel(stopped: list[bool]) -> None:
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        pass  # the first cancel is lost, as in wait_for's race
    try:
        await asyncio.sleep(10)
    finally:
        stopped.append(True)


async def _stops_only_when_released(release: asyncio.Event) -> None:
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            continue


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the cancel is dropped only by 3.11's wait_for")
async def test_python_311_wait_for_drops_a_cancel_that_lands_with_its_result() -> None:
    # The premise of cancel_and_wait: one cancel() does not stop this loop.
    wake, turns = asyncio.Event(), []
    task = asyncio.create_task(_loop_around_wait_for(wake, turns))
    await asyncio.sleep(0.02)
    wake.set()
    task.cancel()
    await asyncio.sleep(0.1)
    assert not task.done() and turns
    assert await cancel_and_wait([task], timeout_s=2.0) == set()


async def test_a_loop_around_wait_for_woken_as_it_is_cancelled_stops() -> None:
    wake, turns = asyncio.Event(), []
    task = asyncio.create_task(_loop_around_wait_for(wake, turns))
    await asyncio.sleep(0.02)
    wake.set()
    assert await cancel_and_wait([task], timeout_s=2.0, recancel_s=0.05) == set()
    assert task.cancelled()


async def test_a_task_that_ignores_the_first_cancel_is_cancelled_again() -> None:
    stopped: list[bool] = []
    task = asyncio.create_task(_ignores_one_cancel(stopped))
    await asyncio.sleep(0)
    assert await cancel_and_wait([task], timeout_s=2.0, recancel_s=0.05) == set()
    assert stopped == [True] and task.cancelled()


async def test_a_task_that_never_stops_is_returned_after_the_bound() -> None:
    release = asyncio.Event()
    task = asyncio.create_task(_stops_only_when_released(release))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await cancel_and_wait([task], timeout_s=0.2, recancel_s=0.05) == {task}
    assert loop.time() - started < 1.0 and not task.done()
    release.set()  # leave nothing behind
    await task


async def test_finished_and_failed_tasks_are_collected_without_error() -> None:
    async def fail() -> None:
        raise RuntimeError("boom")

    done = asyncio.create_task(asyncio.sleep(0))
    failed = asyncio.create_task(fail())
    await asyncio.sleep(0.01)
    assert await cancel_and_wait([done, failed]) == set()
    assert failed.done() and isinstance(failed.exception(), RuntimeError)
