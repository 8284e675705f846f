"""What the SDK check scripts here share: each check counted, the script
stopped at the first that fails, and "N checks" printed last."""

_count = 0


def check(ok, what):
    """Counts a passed check; raises naming `what` when `ok` is false."""
    global _count
    if not ok:
        raise AssertionError(what)
    _count += 1


def summary():
    """The line a script prints last: "N checks"."""
    return f"{_count} checks"
