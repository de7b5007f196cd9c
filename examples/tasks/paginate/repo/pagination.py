"""Helpers for paging through a list of results."""


def page_count(total: int, per_page: int) -> int:
    """Return how many pages are needed to show ``total`` items, ``per_page`` at a time."""
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    return total // per_page


def page_items(items: list, page: int, per_page: int) -> list:
    """Return the items on 1-based ``page``."""
    if page < 1:
        raise ValueError("pages start at 1")
    start = (page - 1) * per_page
    return items[start : start + per_page]
