"""test_http: to be written."""


def test_placeholder():
    pass
