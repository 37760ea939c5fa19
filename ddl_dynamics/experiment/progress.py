"""The run's one progress display: a bar on a terminal, plain lines in a log."""

from __future__ import annotations

import math
import sys
import time

from tqdm.auto import tqdm

#: The cell bar before it can estimate: no remaining time (tqdm's own format after).
ESTIMATING = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, estimating…{postfix}]"
#: Seconds at least between two progress lines in a log (stderr not a terminal).
LOG_INTERVAL = 60.0


class Progress:
    """The run's one progress display (a group's steps show none beneath it): a bar redrawn
    on a terminal; in a log, where a redrawn bar leaves escape sequences, a plain line at the
    start, at most every `LOG_INTERVAL` seconds as groups finish, and at the end. Until each
    worker has finished a group, the rate would count one worker's cells over all workers'
    time, so it says "estimating…" instead of the time left; after, the time left is the
    average rate's."""

    def __init__(self, total: int, desc: str, shown: bool, workers: int) -> None:
        self.log = shown and not sys.stderr.isatty()
        self.workers = workers
        self.bar = tqdm(
            total=total,
            desc=desc,
            unit="cell",
            disable=not shown,
            smoothing=0,
            bar_format=ESTIMATING,
            delay=math.inf if self.log else 0,
        )
        self.printed = time.monotonic()
        self._line()

    def finished(self, cells: int, postfix: str) -> None:
        """A group of ``cells`` finished (``postfix``: its last cell, and how it ended)."""
        self.workers -= 1
        if self.workers <= 0:
            self.bar.bar_format = None
        self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.update(cells)
        if time.monotonic() - self.printed >= LOG_INTERVAL:
            self._line()

    def _line(self) -> None:
        if self.log:
            print(self.bar, file=sys.stderr, flush=True)
            self.printed = time.monotonic()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._line()
        self.bar.close()
