"""test_status_metrics: to be written."""


def test_placeholder():
    pass
