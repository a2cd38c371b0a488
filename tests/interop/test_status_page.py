"""test_status_page: to be written."""


def test_placeholder():
    pass
