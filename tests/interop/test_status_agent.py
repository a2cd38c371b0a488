"""test_status_agent: to be written."""


def test_placeholder():
    pass
