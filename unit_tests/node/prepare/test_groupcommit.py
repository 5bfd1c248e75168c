"""Concurrent requests that queue behind the lock are done in one round of work."""

from __future__ import annotations

import threading
import time

from dra_driver.node.prepare.groupcommit import GroupCommit


def test_requests_waiting_for_the_lock_are_merged_into_one_round() -> None:
    lock = threading.RLock()
    rounds: list[list[str]] = []
    first_started = threading.Event()
    release_first = threading.Event()

    def work(items: dict[str, int]) -> dict[str, str]:
        rounds.append(sorted(items))
        if len(rounds) == 1:
            first_started.set()
            release_first.wait(5)
        return {k: f"done-{v}" for k, v in items.items()}

    combiner: GroupCommit[int, str] = GroupCommit(lock, work)
    results: dict[str, dict[str, str]] = {}

    def call(key: str, value: int) -> None:
        results[key] = combiner.run({key: value, "shared": 0})

    first = threading.Thread(target=call, args=("a", 1))
    first.start()
    assert first_started.wait(5)
    others = [threading.Thread(target=call, args=(k, i)) for i, k in enumerate("bcdef", start=2)]
    for t in others:
        t.start()
    time.sleep(0.3)  # let them all queue behind the lock
    release_first.set()
    for t in [first, *others]:
        t.join(5)

    assert rounds[0] == ["a", "shared"]
    assert len(rounds) == 2, rounds
    assert rounds[1] == ["b", "c", "d", "e", "f", "shared"]
    for key in "abcdef":
        assert results[key][key].startswith("done-")
        assert results[key]["shared"] == "done-0"
        assert set(results[key]) == {key, "shared"}


def test_a_lone_request_is_done_at_once() -> None:
    combiner: GroupCommit[int, int] = GroupCommit(threading.RLock(), lambda items: {k: v * 2 for k, v in items.items()})
    assert combiner.run({"x": 21}) == {"x": 42}


def test_a_call_done_by_a_round_does_not_wait_for_the_next_round() -> None:
    rounds: list[list[str]] = []
    started = [threading.Event() for _ in range(3)]
    release = [threading.Event() for _ in range(3)]

    def work(items: dict[str, int]) -> dict[str, int]:
        n = len(rounds)
        rounds.append(sorted(items))
        started[n].set()
        release[n].wait(5)
        return dict(items)

    combiner: GroupCommit[int, int] = GroupCommit(threading.RLock(), work)
    returned: dict[str, float] = {}

    def call(key: str) -> None:
        combiner.run({key: 1})
        returned[key] = time.monotonic()

    threads = {k: threading.Thread(target=call, args=(k,)) for k in "abcd"}
    threads["a"].start()
    assert started[0].wait(5)
    threads["b"].start()
    threads["c"].start()
    time.sleep(0.2)  # b and c queue behind round 1
    release[0].set()
    assert started[1].wait(5)  # round 2: b and c
    threads["d"].start()
    time.sleep(0.2)  # d queues behind round 2
    release[1].set()
    assert started[2].wait(5)  # round 3 (d) holds the lock and does not finish yet
    time.sleep(0.2)
    assert {"a", "b", "c"} <= set(returned), "b and c were done by round 2; round 3 must not hold them"
    release[2].set()
    for t in threads.values():
        t.join(5)
    assert rounds == [["a"], ["b", "c"], ["d"]]
