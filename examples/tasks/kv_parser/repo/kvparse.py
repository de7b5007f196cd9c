"""Parse ``key=value; key2=value2`` settings strings."""


def parse_settings(text: str) -> dict[str, str]:
    """Parse a settings string into a dict; whitespace around keys and values is ignored."""
    result: dict[str, str] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        pieces = part.split("=")
        if len(pieces) != 2:
            raise ValueError(f"malformed setting: {part!r}")
        key, value = pieces
        result[key.strip()] = value.strip()
    return result
