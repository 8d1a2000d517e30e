"""The wire server's worker threads: blocking calls (planning, the ledger, the database)
run here so that the event loop keeps serving other clients.

Not `loop.run_in_executor` on a `ThreadPoolExecutor`, which cost a statement
that the server hands to a worker (first-seen and charged ones) about 0.15 ms
of CPU more. Its idle threads wait on one queue and the one idle longest is
woken, so one client's consecutive statements ran on each of the 8 threads
in turn, each time on memory gone cold; and a result went from a concurrent
Future through a chained asyncio Future, with a lock and a loop callback
each way. Here the thread that went idle last takes the next call, and sets
the result on the loop's future with one `call_soon_threadsafe`, as its last
act before it waits again: the loop it wakes rarely has to wait for it to
let go of the interpreter lock (context switches per first-seen statement:
about 4 instead of 8). A bare hand-off costs 24 us of CPU instead of 35-49 us.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any

# A call to run; what it returns (if anything) is run once the thread is idle again
Item = Callable[[], Callable[[], None] | None]


class WorkerPool(Executor):
    """At most `size` threads, started as needed; the most recently idle one runs the next
    call. `run` answers on the event loop; `submit` (from any thread) with a Future."""

    def __init__(self, size: int, name: str = "dpsql-wire"):
        if size < 1:
            raise ValueError(f"a worker pool needs at least one thread, got {size}")
        self._size = size
        self._name = name
        self._lock = threading.Lock()  # guards everything below
        self._idle: list[_Worker] = []  # the last one idled most recently
        self._backlog: deque[Item] = deque()  # calls waiting for a thread, in order
        self._threads: list[threading.Thread] = []
        self._closed = False

    def run(self, function: Callable[..., Any], *args: Any) -> asyncio.Future:
        """`function(*args)` in a worker; its result or exception on the running loop's
        future. Cancelling the future does not stop the call, started or not: the
        caller decides what a call that is no longer awaited does (see Backend.stop)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def call() -> Callable[[], None]:
            try:
                result = function(*args)
            except BaseException as exc:  # handed to the awaiting coroutine
                return partial(_answer, loop, _fail, future, exc)
            return partial(_answer, loop, _succeed, future, result)

        self._start(call)
        return future

    def submit(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(function(*args, **kwargs))
            except BaseException as exc:  # handed to the future's owner
                future.set_exception(exc)

        self._start(call)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking calls; drop the waiting ones if `cancel_futures`, else run them
        first; with `wait`, return once every thread has ended."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                self._backlog.clear()
            for worker in self._idle:
                worker.give(None)
            self._idle.clear()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()

    def _start(self, call: Item) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker pool is shut down")
            if self._idle:
                self._idle.pop().give(call)
            elif len(self._threads) < self._size:
                name = f"{self._name}_{len(self._threads)}"
                thread = threading.Thread(target=self._work, args=(call,), name=name, daemon=True)
                self._threads.append(thread)
                thread.start()
            else:
                self._backlog.append(call)

    def _work(self, call: Item | None) -> None:
        worker = _Worker()
        while call is not None:
            then = call()
            with self._lock:
                call = self._backlog.popleft() if self._backlog else None
                idle = call is None and not self._closed
                if idle:
                    self._idle.append(worker)
            if then is not None:
                # the result goes out last: the loop it wakes need not wait for this
                # thread to let go of the interpreter lock
                then()
            if idle:
                call = worker.take()


class _Worker:
    """One idle thread's mailbox: the next call, or None to end."""

    __slots__ = ("_call", "_ready")

    def __init__(self) -> None:
        self._ready = threading.Lock()
        self._ready.acquire()
        self._call: Item | None = None

    def give(self, call: Item | None) -> None:
        self._call = call
        self._ready.release()

    def take(self) -> Item | None:
        self._ready.acquire()
        call, self._call = self._call, None
        return call


def _answer(loop: asyncio.AbstractEventLoop, how: Callable, future: asyncio.Future, value: Any):
    """Hand `value` to `future` on its loop, unless the loop has closed (no one waits)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(how, future, value)


def _succeed(future: asyncio.Future, result: Any) -> None:
    if not future.done():  # cancelled meanwhile (the client's cancel, a timeout)
        future.set_result(result)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
