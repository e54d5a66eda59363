"""Options shared by the whole suite."""


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite golden exposition files instead of comparing"
    )
