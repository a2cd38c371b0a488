"""test_status_trace: to be written."""


def test_placeholder():
    pass
