"""Closed integer intervals ``(start, end)``, both ends included."""


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether closed intervals ``a`` and ``b`` share at least one point."""
    return a[0] < b[1] and b[0] < a[1]


def merge_all(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping intervals; the result is sorted and disjoint."""
    merged: list[tuple[int, int]] = []
    for current in sorted(intervals):
        if merged and overlaps(merged[-1], current):
            merged[-1] = (merged[-1][0], max(merged[-1][1], current[1]))
        else:
            merged.append(current)
    return merged
