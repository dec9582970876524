from sqlalchemy.testing.suite import *  # noqa
