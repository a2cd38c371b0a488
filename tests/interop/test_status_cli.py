"""test_status_cli: to be written."""


def test_placeholder():
    pass
