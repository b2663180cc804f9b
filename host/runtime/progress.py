"""Progress of long jobs: a bar on a terminal, plain lines elsewhere.

``Progress(total, label)`` is called as ``progress(done, total)`` (the form
``Device.stream`` reports in) and closed with :meth:`Progress.close`. On a terminal it
draws a ``tqdm`` bar; on anything else (a log file, a CI job, a pipe) it writes a plain
line at most every :data:`LINE_INTERVAL_S` seconds and one at the end, never a
carriage-return frame. :func:`stage` announces a stage of a longer task (a simulator
build) with the time it took once it ends.
"""

from __future__ import annotations

import contextlib
import sys
import time

__all__ = ["Progress", "stage", "LINE_INTERVAL_S"]

#: Seconds between two plain progress lines when the stream is not a terminal.
LINE_INTERVAL_S = 10.0


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:                       # a closed stream
        return False


class Progress:
    """Progress of ``total`` items (``None``: a count only) named ``label``.

    Parameters
    ----------
    total : int or None
    label : str
        What is counted ("jobs", "sequences").
    stream : text stream, optional
        Where to write (default ``sys.stderr``).
    """

    def __init__(self, total: int | None = None, label: str = "jobs", stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self.total = total
        self._start = time.monotonic()
        self._last_line = self._start
        self._done = 0
        self._bar = None
        if _is_terminal(self.stream):
            from tqdm import tqdm
            self._bar = tqdm(total=total, unit=f" {label}", file=self.stream,
                             dynamic_ncols=True, leave=True)

    def __call__(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        if self._bar is not None:
            if total is not None and self._bar.total != total:
                self._bar.total = total
            self._bar.update(done - self._done)
        else:
            now = time.monotonic()
            if now - self._last_line >= LINE_INTERVAL_S:
                self._last_line = now
                self._line(done, now)
        self._done = done

    def _line(self, done: int, now: float) -> None:
        elapsed = now - self._start
        rate = done / elapsed if elapsed > 0 else 0.0
        of = f"/{self.total} ({100 * done // self.total} %)" if self.total else ""
        self.stream.write(f"{self.label}: {done}{of}, {rate:,.1f}/s, {elapsed:.1f} s\n")
        self.stream.flush()

    def close(self) -> None:
        """End the display: close the bar, or write the last plain line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._done:
            self._line(self._done, time.monotonic())
            self._done = 0


@contextlib.contextmanager
def stage(text: str, stream=None):
    """Say ``text`` (``"building the simulated board ..."``) before a long step and how
    long it took after it, on ``stream`` (default ``sys.stderr``)."""
    stream = stream if stream is not None else sys.stderr
    stream.write(f"{text} ...\n")
    stream.flush()
    start = time.monotonic()
    try:
        yield
    finally:
        stream.write(f"{text}: done in {time.monotonic() - start:.1f} s\n")
        stream.flush()
