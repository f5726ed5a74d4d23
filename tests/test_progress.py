"""smplan.progress: a word on long work, and none on quick work."""

import time

from smplan import progress


def test_a_word_after_the_wait_and_none_for_quick_work(monkeypatch):
    said = []
    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 0.01)
    with progress.said_after(said.append, "working ..."):
        time.sleep(0.3)
    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 5.0)
    with progress.said_after(said.append, "never"):  # over before the wait needs a word
        pass
    time.sleep(0.05)
    assert said == ["working ..."]
    with progress.said_after(None, "nobody to tell"):  # no listener: nothing runs
        pass
