"""Money arithmetic for invoices: amounts are rounded half-up to whole cents."""


def round_cents(amount: float) -> float:
    """Round ``amount`` to two decimals, halves away from zero (as on paper invoices)."""
    return round(amount, 2)


def split_evenly(amount: float, parts: int) -> list[float]:
    """Split ``amount`` into ``parts`` cent amounts that add up exactly to the rounded total."""
    total_cents = int(round(round_cents(amount) * 100))
    base, extra = divmod(total_cents, parts)
    return [(base + (1 if i < extra else 0)) / 100 for i in range(parts)]
