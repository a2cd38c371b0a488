"""Placeholder: filled in by issue 16 work."""


def test_placeholder():
    pass
