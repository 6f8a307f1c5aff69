"""Error type and skip bookkeeping shared by every dataset reader.

Bad input must never be dropped silently: strict mode raises a DataError that
names the file and line, lenient mode skips the line but counts it by reason.
"""
from collections import Counter


class DataError(ValueError):
    """Bad input data. ``str()`` is a single line: ``path:line: message``."""

    def __init__(self, path, line, message):
        self.path = str(path)
        self.line = line
        # Keep the message on one line so logs and test matching stay simple.
        self.message = " ".join(str(message).split())
        super().__init__(self.path, line, self.message)

    def __str__(self):
        if self.line is None:
            return f"{self.path}: {self.message}"
        return f"{self.path}:{self.line}: {self.message}"


class SkipCounter:
    """Counts lines skipped in lenient mode, grouped by reason."""

    def __init__(self):
        self._counts = Counter()

    def count(self, reason, n=1):
        """Record ``n`` skipped lines for ``reason``; returns that reason's running total."""
        self._counts[reason] += n
        return self._counts[reason]

    def __getitem__(self, reason):
        return self._counts.get(reason, 0)

    @property
    def counts(self):
        return dict(self._counts)

    @property
    def total(self):
        return sum(self._counts.values())

    def summary(self):
        total = self.total
        noun = "line" if total == 1 else "lines"
        if not total:
            return f"skipped 0 {noun}"
        parts = ", ".join(f"{n} {reason}" for reason, n in self._counts.most_common())
        return f"skipped {total} {noun}: {parts}"
